"""One host's plan, decided once from data: `make_plan(host_name, cfg, facts, header=None, commit=None,
sources=None, other_ports=None)`.

Everything a role carries out is in the returned `HostPlan`: the instances and their
ports, every llama-server argv, the model files, the CUDA archs and build flags, the
VRAM plan, the host's memory and CPU plans (voltafleet.planning.hostmem, voltafleet.planning.hostcpu) and every
reason to refuse the host. A reader asking "why is -c 8192 on host
X" follows this one function. No pyinfra import: every rule is unit-tested alone.

    >>> plan = make_plan("gpu-01", cfg, HostFacts(os="ubuntu-24.04", gpus=[...]), header, commit)
    >>> plan.refusals            # [] when the host may be touched
    >>> plan.argv[0]             # ['-m', '/var/lib/voltafleet/models/...gguf', '-ngl', 'all', ...]
"""
from __future__ import annotations

import json

import posixpath
from dataclasses import dataclass, field

from voltafleet.inputs.settings import Settings
from voltafleet.inputs import checks
from voltafleet.planning import flags as flagmod
from voltafleet.planning import fingerprint as fpmod
from voltafleet.gpu import gpuhealth, nvidia
from voltafleet.planning import hostcpu, hostmem, vram
from voltafleet.models.gguf_header import Header
from voltafleet.models.modelfiles import ModelFile, draft_path, model_files

GIB = 1024 ** 3
ENV_DIR = "/etc/voltafleet/llama-server"   # one <instance>.env per llama-server
GOOD_DIR = "/etc/voltafleet/good"          # the env files of the last release that passed
API_KEY_PATH = "/etc/voltafleet/api-key"   # the key as the servers read it (0600, service user)
UNIT_PATH = "/etc/systemd/system/llama-server@.service"


@dataclass(frozen=True)
class Instance:
    index: int  # also the GPU index on CUDA hosts (CUDA_VISIBLE_DEVICES)
    port: int

    @property
    def unit(self) -> str:
        return f"llama-server@{self.index}.service"


@dataclass(frozen=True)
class HostFacts:
    """What preflight read from the host (roles/facts.py) before any change."""

    os: str
    gpus: list = field(default_factory=list)
    nvcc: str | None = None            # the toolkit a plain build would find
    free_model: int | None = None      # bytes free where models go
    free_root: int | None = None       # bytes free where releases go
    same_fs: bool = True
    model_present: bool = False        # the model file is there and recorded as verified
    model_bytes: int | None = None     # Content-Length of model_url, when not present
    systemd: int = 0                   # systemd's version (RestartSteps needs >= 254)
    gpu_health: dict | None = None     # voltafleet.gpu.gpuhealth.parse_fact of the GpuHealth fact; None: not read
    mem_total: int | None = None       # bytes of RAM (MemTotal); None: not read
    mem_available: int | None = None   # bytes the kernel could give without swapping (MemAvailable)
    cpus: int | None = None            # CPUs the host's processes may use (nproc)
    numa_nodes: dict | None = None     # {NUMA node: its CPU list, "0-15,32-47"}; None: not read
    gpu_numa: dict | None = None       # {GPU index: its NUMA node}; None: not known
    releases: int | None = None        # llama.cpp releases on the host now (under voltafleet_root/releases)


@dataclass(frozen=True)
class BuildSpec:
    """The inputs of a release that are known before the toolchain is installed; the
    compiler and toolkit versions complete the fingerprint on the host."""

    commit: str
    flags: tuple[str, ...]
    targets: tuple[str, ...]
    repo: str
    cuda_bin: str | None  # the pinned toolkit's bin directory (None on the cpu backend)

    def fingerprint(self, toolkit: str | None, compiler: str) -> str:
        return fpmod.fingerprint(self.commit, list(self.flags), toolkit, compiler, list(self.targets))


@dataclass(frozen=True)
class HostPlan:
    host: str
    settings: Settings                 # the host's validated settings, as the user set them
    facts: HostFacts
    instances: tuple[Instance, ...]
    model_files: tuple[ModelFile, ...]
    draft_path: str | None
    cuda_archs: tuple[int, ...]
    build: BuildSpec | None
    vram: vram.VramPlan | None
    vram_note: str | None              # the VRAM plan in words, for the log
    argv: dict = field(default_factory=dict)   # instance index -> llama-server argv
    refusals: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()     # worth an operator's look, not a reason to stop (GPU throttling, retired pages)
    hostmem: hostmem.HostMemoryPlan | None = None  # host memory at the servers' worst (None: not planned)
    hostcpu: hostcpu.CpuPlan | None = None  # threads against CPUs, NUMA placement (None: not planned)
    # what was decided, read by every role and the gateway (one rule for each number):
    backend: str = "cuda"              # "cuda" or "cpu" (voltafleet_backend)
    slots: int = 1                     # -np of each instance: server_parallel, else the VRAM plan's
    ctx: int | None = None             # -c of each instance, the KV pool of its slots: server_ctx, else the VRAM plan's
    placement: dict = field(default_factory=dict)  # instance index -> its CPU flags (-C/-Cb on its GPU's NUMA node; [] unplaced)

    @property
    def cuda(self) -> bool:
        return self.backend == "cuda"

    @property
    def root(self) -> str:
        return self.settings.preflight.root

    @property
    def model_path(self) -> str:
        """llama-server's -m: the model, or the first part of a split GGUF."""
        return self.model_files[0].dest

    def resource_lines(self) -> list[str]:
        """The host memory and CPU plans in words (the preflight's log, --plan)."""
        out = []
        if self.hostmem is not None:
            m = self.hostmem
            out += [m.text(), f"per instance: {m.instance.describe()}; MemoryMax {hostmem.size(m.memory_max)} "
                              "(no MemoryHigh)"]
        if self.hostcpu is not None:
            out.append(self.hostcpu.text())
        return out

    def env_file(self, index: int) -> str:
        inst = next(i for i in self.instances if i.index == index)
        text = flagmod.env_file(index, self.argv[index], self.cuda, self.settings.server.malloc_heap)
        return text + f"LLAMA_HEALTH_URL={health_url(self.settings, inst.port)}\n"


# ---------------------------------------------------------------- small rules


def instances(cfg: Settings, gpus: list[dict]) -> list[Instance]:
    """One server per GPU (or server_instances of them); on the CPU backend, server_instances."""
    if cfg.preflight.backend == "cuda":
        count = len(gpus) if cfg.server.instances is None else min(cfg.server.instances, len(gpus))
    else:
        count = cfg.server.instances
    return [Instance(i, cfg.server.port_base + i) for i in range(count)]


def cuda_archs(cfg: Settings, gpus: list[dict]) -> list[int]:
    """The configured archs, else each GPU's own compute capability ("7.0" -> 70)."""
    if cfg.build.cuda_archs:
        return sorted(set(cfg.build.cuda_archs))
    return sorted({int(g["compute_cap"].replace(".", "")) for g in gpus
                   if g.get("compute_cap") not in (None, "", "unknown")})


def connect_host(cfg: Settings) -> str:
    """Where a program on the server host reaches its servers: the address they bind (127.0.0.1 for a wildcard)."""
    bind = cfg.server.host
    return "127.0.0.1" if bind in ("0.0.0.0", "::", "") else bind


def health_url(cfg: Settings, port: int) -> str:
    return f"http://{connect_host(cfg)}:{port}/health"


def build_spec(cfg: Settings, archs: list[int], commit: str) -> BuildSpec:
    cuda = cfg.preflight.backend == "cuda"
    nvcc = nvidia.toolkit_nvcc(cfg.toolchain.cuda_toolkit_version) if cuda else None
    flags = fpmod.cmake_flags(cfg.preflight.backend, archs, cfg.build.cmake_extra,
                              (cfg.server.cache_type_k, cfg.server.cache_type_v), nvcc=nvcc)
    return BuildSpec(commit, tuple(flags), tuple(cfg.build.targets), cfg.build.repo,
                     posixpath.dirname(nvcc) if nvcc else None)


def build_argv(script: str, root: str, fp: str, build: BuildSpec, jobs, info: dict) -> list[str]:
    """vf-build-release's arguments for release `fp` (the roles' compile and the GPU proof)."""
    return [script, root, fp, build.repo, build.commit, str(jobs or "auto"), build.cuda_bin or "-",
            json.dumps(info), " ".join(build.targets), "--", *build.flags]


# ---------------------------------------------------------------- refusals


def releases_needed(cfg: Settings, facts: HostFacts) -> int:
    """Releases that may still land on the host: it holds at most the new one, the current, the
    last good and llama_cpp_keep_releases (roles/server prunes the rest after the switch); those
    already there take no more space. At least one: this rollout's may be new."""
    return max(1, 3 + cfg.build.keep_releases - (facts.releases or 0))


def disk_refusals(host_name: str, cfg: Settings, facts: HostFacts) -> list[str]:
    """Free disk for the model (unless it is there, verified: never counted twice), a build and the
    releases still to be kept (preflight_release_mib each), on one filesystem or on each."""
    need_model = 0 if facts.model_present else int((facts.model_bytes or 0) * 1.02)  # 2 % margin
    n = releases_needed(cfg, facts)
    need_releases = n * cfg.preflight.release_mib * 1024 * 1024
    need_build = int(cfg.preflight.build_disk_gb * GIB) + need_releases
    build = (f"build ({float(cfg.preflight.build_disk_gb):.1f} GiB, preflight_build_disk_gb) and {n} more "
             f"release(s) kept ({need_releases / GIB:.1f} GiB: preflight_release_mib each; the host keeps the new one, "
             f"the current, the last good and llama_cpp_keep_releases {cfg.build.keep_releases}, and has "
             f"{facts.releases or 0})")
    fix = ("Fix: free disk space" + (", or lower llama_cpp_keep_releases" if cfg.build.keep_releases else ""))
    free_model, free_root = facts.free_model, facts.free_root
    errors = []
    if free_model is not None and free_root is not None and facts.same_fs:
        if free_model < need_model + need_build:
            errors.append(f"{host_name}: {free_model / GIB:.1f} GiB free for model ({need_model / GIB:.1f} GiB) "
                          f"plus {build} = {(need_model + need_build) / GIB:.1f} GiB. {fix}")
        return errors
    if free_model is not None and free_model < need_model:
        errors.append(f"{host_name}: {free_model / GIB:.1f} GiB free in {cfg.model.dir}, "
                      f"the model needs {need_model / GIB:.1f} GiB")
    if free_root is not None and free_root < need_build:
        errors.append(f"{host_name}: {free_root / GIB:.1f} GiB free in {cfg.preflight.root}, "
                      f"a {build} need {need_build / GIB:.1f} GiB. {fix}")
    return errors


def host_refusals(host_name: str, cfg: Settings, facts: HostFacts) -> list[str]:
    """Every reason not to touch this host that the facts alone show, each naming the host."""
    errors = []
    if facts.os not in cfg.preflight.supported_os:
        errors.append(f"{host_name}: OS {facts.os} is not one of {', '.join(cfg.preflight.supported_os)} "
                      "(preflight_supported_os)")
    gpus = facts.gpus
    if cfg.preflight.backend == "cuda":
        if not gpus:
            errors.append(f"{host_name}: is in a CUDA group but nvidia-smi lists 0 GPUs "
                          "(no driver yet? set manage_driver: true; or move the host to a cpu group)")
        if cfg.server.instances and gpus and cfg.server.instances > len(gpus):
            errors.append(f"{host_name}: server_instances is {cfg.server.instances} but the host has "
                          f"{len(gpus)} GPU(s)")
        driver = next((g["driver_version"] for g in gpus if g.get("driver_version")), None)
        errors += nvidia.refusals(host_name, cfg, gpus, facts.nvcc, driver)
        errors += gpu_health(host_name, cfg, facts)[0]
        if cfg.toolchain.manage_driver:
            try:
                nvidia.driver_packages(facts.os, cfg.toolchain.nvidia_driver_source, cfg.toolchain.nvidia_driver_branch,
                                       cfg.toolchain.nvidia_driver_flavour)
            except ValueError as e:
                errors.append(f"{host_name}: {e}")
    return errors + disk_refusals(host_name, cfg, facts)


def gpu_health(host_name: str, cfg: Settings, facts: HostFacts) -> tuple[list[str], list[str]]:
    """(refusals, warnings) of the boards (voltafleet.gpu.gpuhealth.judge) of a CUDA host whose
    driver answers; none before the driver is installed (GPUs seen on the PCI bus only):
    the smoke test judges them once it is."""
    if not facts.gpus or any(g.get("pci_only") for g in facts.gpus):
        return [], []
    return gpuhealth.judge(host_name, cfg, facts.gpu_health)


def vram_decision(cfg: Settings, gpus: list[dict], header: Header | str | None, sources: dict | None = None):
    """The VRAM plan's decision (voltafleet.planning.vram.decide: -c and -np, the plan or None, a note, an
    error or None) for the smallest GPU of the host. `header` is the model's GGUF header, or why it could
    not be read: then the host is refused unless vram_plan_required is false."""
    src = (sources or {}).get("model_url") or "group_vars"
    return vram.decide(cfg, min(g["memory_mib"] for g in gpus), header if header is not None else "no header",
                       source=src, archs=cuda_archs(cfg, gpus))


def decided_slots_ctx(cfg: Settings, gpus: list[dict], header: Header | str | None,
                      sources: dict | None = None) -> tuple[int, int | None, "vram.Decision | None"]:
    """(-np, -c, the VRAM plan's decision or None) of a host's instances: on a CUDA host with GPUs the
    VRAM plan's, else the settings'. The one rule make_plan and the gateway's plain run (which has no
    fleet plan) both call."""
    if cfg.preflight.backend == "cuda" and gpus:
        d = vram_decision(cfg, gpus, header, sources)
        return int(d.parallel or 1), d.ctx, d
    return int(cfg.server.parallel or 1), cfg.server.ctx, None


def host_resources(cfg: Settings, facts: HostFacts, header: Header | str | None, insts: list[Instance],
                   slots: int | None = None, ctx: int | None = None) -> tuple[hostmem.HostMemoryPlan, hostcpu.CpuPlan]:
    """The host-memory plan (voltafleet.planning.hostmem: every instance at its worst, against MemTotal) and
    the CPU plan (voltafleet.planning.hostcpu: threads against CPUs; on a CUDA host with several NUMA nodes,
    each instance on its GPU's node), each instance at `slots` slots sharing `ctx` (the host's decisions)."""
    shape = vram.shape_of(header) if isinstance(header, Header) else None
    mem = hostmem.plan(cfg, shape, len(insts), facts.mem_total, facts.mem_available, slots=slots, ctx=ctx)
    gpu_nodes = facts.gpu_numa if cfg.preflight.backend == "cuda" else None
    cpu = hostcpu.plan(cfg, [i.index for i in insts], facts.cpus, facts.numa_nodes, gpu_nodes)
    return mem, cpu


# ---------------------------------------------------------------- the plan


def make_plan(host_name: str, cfg: Settings, facts: HostFacts, header: Header | str | None = None,
              commit: str | None = None, sources: dict | None = None,
              other_ports: dict[str, int] | None = None) -> HostPlan:
    """The whole plan of one host. `header`: the model's GGUF header (or why it could not
    be read; only CUDA hosts need it); `commit`: llama_cpp_ref resolved on the controller;
    `sources`: {key: file that set it}, for the refusals; `other_ports`: ports other
    services of the project use on this host ({what: port})."""
    refusals = host_refusals(host_name, cfg, facts)
    cuda = cfg.preflight.backend == "cuda"
    slots, ctx, d = decided_slots_ctx(cfg, facts.gpus, header, sources)
    plan_vram, note = (d.plan, d.text) if d else (None, None)
    if d and d.error:
        refusals.append(f"{host_name}: {d.error}")
    files = model_files(cfg)
    draft = draft_path(cfg)
    archs = cuda_archs(cfg, facts.gpus) if cuda else []
    build = None
    if commit and (archs or not cuda):
        build = build_spec(cfg, archs, commit)
    insts = instances(cfg, facts.gpus)
    for problem in (checks.port_problems(cfg.server.port_base, len(insts), other_ports, sources)
                    + checks.slot_ctx_problems(ctx, slots, sources)):
        refusals.append(f"{host_name}: {problem.line()} Fix: {problem.fix}")
    warnings = list(gpu_health(host_name, cfg, facts)[1]) if cuda else []
    mem, cpu = host_resources(cfg, facts, header, insts, slots, ctx)
    for why, required in ((mem.refusal(host_name), cfg.server.hostmem_plan_required), (cpu.refusal(host_name), True)):
        if why:
            (refusals if required else warnings).append(why)
    key = API_KEY_PATH if cfg.server.api_key_file else None
    placement = {i.index: cpu.args(i.index) for i in insts}
    argv = {i.index: flagmod.server_args(cfg, files[0].dest, i.port, key, draft, placement[i.index], slots=slots, ctx=ctx)
            for i in insts}
    return HostPlan(host=host_name, settings=cfg, facts=facts, instances=tuple(insts), model_files=tuple(files),
                    draft_path=draft, cuda_archs=tuple(archs), build=build, vram=plan_vram, vram_note=note,
                    argv=argv, refusals=tuple(refusals), warnings=tuple(warnings), hostmem=mem, hostcpu=cpu,
                    backend=cfg.preflight.backend, slots=slots, ctx=ctx, placement=placement)
