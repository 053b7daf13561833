"""The inventory of bench/controller/scale.py: N simulated converged V100 hosts on pyinfra's fake
connector (8 x V100-SXM2-16GB each, R580 held, CUDA 12.8, llama.cpp built, the model
verified, 8 instances running, every helper, env file and unit in place) and one HAProxy
gateway listing every instance. Every fact a converged host asks is answered as such a host
answers it, so a run of deploy.py changes nothing.

The scenario comes as JSON in VOLTAFLEET_SCALE: {"hosts": N, "compilers": 1 or 2,
"model_url": URL of a GGUF header (bench/controller/scale.py serves one), "header": its local path}.
With two compilers the second half of the fleet has another C++ compiler (another
release fingerprint, another builder).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import time
from io import StringIO
from pathlib import Path

from voltafleet.inputs.settings import Settings
from voltafleet.models import gguf_header  # noqa: F401  (gpuhealth: the fact's markers)
from voltafleet.gpu import gpuhealth
from voltafleet.front import gateway as gw
from voltafleet.planning.flags import pinned_help
from voltafleet.inputs.groupvars import load_or_exit
from voltafleet.planning.hostplan import HostFacts, make_plan

REPO = Path(__file__).resolve().parents[2]
GROUP = "v100_16gb"
# The lab's tiny qwen35 model has a golden probe in probes/: a converged host's probe matches it.
PROBE = json.loads((REPO / "probes" / "1462d0911d4a7a47-1a890a92bce7.json").read_text())
PROBE_LONG = json.loads((REPO / "probes" / "1462d0911d4a7a47-ae7ce201650c.json").read_text())  # the long probe
DRIVER = "580.95.05"
NVCC = "12.8.93"
CXX = {1: "12.2.0 x86_64-linux-gnu", 2: "13.2.0 x86_64-linux-gnu"}
OS = "ubuntu-24.04"
MODEL_SIZE, MODEL_MTIME = 15575320576 + 7618076, 1760000000

S = json.loads(os.environ["VOLTAFLEET_SCALE"])


def _sha1(text: str | bytes) -> str:
    return hashlib.sha1(text.encode() if isinstance(text, str) else text).hexdigest()


def _stat(path: str, mode: str = "-rw-r--r--", size: int = 100, user: str = "root") -> str:
    return f"user={user} group={user} mode={mode} atime=0 mtime=0 ctime=0 size={size} '{path}'"


def _file(responses: list, path: str, content: str | bytes, mode: str = "-rw-r--r--") -> None:
    """A file in place with this content: pyinfra's File (stat) and Sha1File facts."""
    _dir(responses, os.path.dirname(path))
    q = re.escape(path)
    responses.append((rf"sha1sum {q}( |$)", f"{_sha1(content)}  {path}"))
    responses.append((rf"stat -c .* {q} 2>", _stat(path, mode, len(content))))


def _synced(files: list, directories: list = ()) -> tuple:
    """roles/filesync.synced's one fact (FilesState) where every file and directory is in place."""
    from roles.filesync import FilesState, fact_paths

    wanted = {f.dest: f for f in files}
    modes = dict(directories)
    lines = [f"file {wanted[p].mode} {wanted[p].sha1()}" if p in wanted else f"dir {modes.get(p, '755')}"
             for p in fact_paths(files, list(directories))]
    return "^" + re.escape(FilesState().command(paths=fact_paths(files, list(directories)))) + "$", "\n".join(lines)


def _dir(responses: list, path: str) -> None:
    pattern = rf"stat -c .* {re.escape(path)} 2>"
    if all(p != pattern for p, _ in responses):
        responses.append((pattern, _stat(path, "drwxr-xr-x", 4096)))


def server_responses(cfg: Settings, compiler: int, header) -> list:
    """(regex, answer) of a converged server host, most frequent first."""
    smi = "\n".join(f"{i}, Tesla V100-SXM2-16GB, 7.0, 16160, {DRIVER}" for i in range(8))
    gpus = [{"index": i, "name": "Tesla V100-SXM2-16GB", "compute_cap": "7.0", "memory_mib": 16160,
             "driver_version": DRIVER} for i in range(8)]
    from tests import gpu_fixtures as g

    health = g.fact_output(g.host_query(8))
    sha = cfg.model.sha256
    facts = HostFacts(os=OS, gpus=gpus, gpu_health=gpuhealth.parse_fact(health.splitlines()), nvcc=NVCC,
                      free_model=900 << 30, free_root=900 << 30, same_fs=True, model_present=True, model_bytes=None,
                      systemd=255)
    plan = _PLANS[compiler] = make_plan("bench", cfg, facts, header, cfg.build.ref)
    if plan.refusals:
        raise SystemExit("bench: the simulated host is refused: " + "; ".join(plan.refusals))
    fp = plan.build.fingerprint(NVCC, CXX[compiler])
    info = json.dumps({"fingerprint": fp, "commit": plan.build.commit})
    lspci = "\n".join(f"0000:{b}:00.0 3D controller [0302]: NVIDIA Corporation GV100GL [Tesla V100 SXM2 16GB] "
                      "[10de:1db1] (rev a1)" for b in g.BUSES[:8])
    dpkg = "\n".join(f"pkg|{st}|{n}|{v}" for st, n, v in (
        ("hi ", "cuda-drivers-580", f"{DRIVER}-0ubuntu1"), ("hi ", "nvidia-dkms-580", f"{DRIVER}-0ubuntu1"),
        ("hi ", "nvidia-driver-pinning-580", "580.95.05-1"), ("ii ", "nvidia-driver-580", f"{DRIVER}-0ubuntu1"),
        ("ii ", "libnvidia-compute-580", f"{DRIVER}-0ubuntu1")))
    packages = ["build-essential", "cmake", "git", "ccache", "python3", "curl", "ca-certificates",
                "cuda-toolkit-12-8", "cuda-keyring"]
    probe = {"instances": [{"instance": i.index, "port": i.port,
                            "probe": {"tokens": PROBE["tokens"], "logprobs": PROBE["logprobs"]},
                            "probe_long": {"tokens": PROBE_LONG["tokens"], "logprobs": PROBE_LONG["logprobs"],
                                           "prompt_n": 552}}
                           for i in plan.instances]}
    r = [
        (r"^nvidia-smi --query-gpu=index", smi),
        (r"nvcc --version", ""),  # replaced below by the answer of the nvcc loop
        (r"^for n in ", f"nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 12.8, V{NVCC}"),
        (r"^\. /etc/os-release", f"os={OS}\ncpus=80\nmem_kib=527000000\nsystemd=255\ncxx={CXX[compiler]}"),
        (r"df -PB1", "2049 966367641600"),
        (r"stat -c 'stat=%s %Y' ", f"stat={MODEL_SIZE} {MODEL_MTIME}\nside={sha} {MODEL_SIZE} {MODEL_MTIME}"),
        (r"^cd .* releases/\*/", f"current={fp}\ngood={fp}\nrelease={fp} 1760000000 {info}"),
        (r"llama-server --help", pinned_help(cfg.build.ref)),
        (r"systemctl is-active llama-server@", "\n".join(f"{i.index} active enabled" for i in plan.instances)),
        (r"--probe-only", json.dumps(probe)),
        (r"^command -v nvidia-smi", health),
        (r"nvidia-smi --query-gpu=pci.bus_id", "\n".join(f"00000000:{b.upper()}:00.0" for b in g.BUSES[:8])),
        (r"dpkg-query -W", dpkg),
        (r"/proc/driver/nvidia/version", f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {DRIVER}  Tue Sep 23"),
        (r"^lspci -Dnn -d 10de:", lspci),
        (r"apt-mark showhold", "cuda-drivers-580\nnvidia-dkms-580\nnvidia-driver-pinning-580"),
        (r"dpkg -l", "\n".join(f"ii  {p}  {'1.1-1' if p == 'cuda-keyring' else '1.0-1'}  amd64  x"
                               for p in packages)),
        (r"dpkg -I", "Package: cuda-keyring\nVersion: 1.1-1"),  # the keyring .deb downloaded by an earlier run
        (r"stat -c .* /tmp/pyinfra-[0-9a-f]+ 2>", _stat("/tmp/pyinfra-keyring", size=4328)),
        *_apt_fresh(),
        (r"/etc/group", f"{cfg.server.user}:x:999:"),
        (r"cat /etc/passwd", f"{cfg.server.user}:x:999:999::/nonexistent:/usr/sbin/nologin"
                             f"|{cfg.server.user}|{cfg.server.user}||!"),
        *_service("nvidia-persistenced"),
    ]
    r = [(p, a) for p, a in r if p != r"nvcc --version"]
    from roles import helpers, server, smoke

    # the files of roles/filesync's operations, each operation's one fact: helpers, instance flags, unit, prompt
    # (the memory textfile's, which name the host: _memory)
    from roles.facts import ServiceAccount
    from roles.filesync import Wanted
    from roles.toolchain import NOUVEAU_BLACKLIST

    user = cfg.server.user
    r[:0] = [_synced(*helpers.wanted(plan)), _synced(list(server.env_files(plan)[0].values()), server.env_files(plan)[1]),
             _synced([server.unit_file(plan)]), _synced(smoke.prompt_files(plan)),
             _synced([Wanted(NOUVEAU_BLACKLIST, "644", text="blacklist nouveau\noptions nouveau modeset=0\n")]),
             ("^" + re.escape(ServiceAccount().command(user=user)) + "$",
              f"group=yes\nhome={server.NO_HOME}\nshell={server.NO_SHELL}\nprimary={user}")]
    return r


def _apt_fresh() -> list:
    """apt-get update ran an hour ago (apt.update's cache_time)."""
    stamp = "/var/lib/apt/periodic/update-success-stamp"
    return [(rf"stat -c .* {stamp} 2>", _stat(stamp).replace("mtime=0", f"mtime={int(time.time()) - 3600}")),
            (r"^date ", time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime()))]


def _service(name: str) -> list:
    """systemd.service(running=True, enabled=True) on a host where it is."""
    return [(rf"--property SubState {name}.service", f"Id={name}.service\nSubState=running"),
            (rf"--property UnitFileState {name}.service", f"Id={name}.service\nUnitFileState=enabled")]


def haproxy_cfg(cfg: Settings, servers: list[str], ports: list[int], slots: int | None = None) -> str:
    """The gateway's configuration as roles/gateway renders it for these servers."""
    import jinja2

    from roles.gateway import TEMPLATE

    backends = gw.fleet_backends([(name, name, ports, slots) for name in servers], [], [])
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True,
                             lstrip_blocks=True)
    return env.from_string(TEMPLATE.read_text()).render(**gw.template_vars(cfg, backends))


def gateway_responses(cfg: Settings, servers: list[str], ports: list[int], slots: int | None = None) -> list:
    rows = [f"llama,{gw.backend_name(name, i)},0,0,0,0,,0,0,0,0,0,0,0,0,0,0,UP"
            for name in servers for i in range(len(ports))]
    live = haproxy_cfg(cfg, servers, ports, slots)
    stat = "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status\n"
    r = [
        (r"show stat", stat + "\n".join(rows)),
        (r"dpkg -l", "ii  haproxy  2.6-1  amd64  x\nii  socat  1.7-1  amd64  x"),
        *_service("haproxy"),
        *_apt_fresh(),
    ]
    _file(r, "/etc/haproxy/haproxy.cfg.voltafleet", live)  # staged, and the same live
    _file(r, "/etc/haproxy/haproxy.cfg", live)
    from roles.gateway import ERRORFILE

    _file(r, ERRORFILE, gw.busy_page(cfg.gateway.retry_after_s))
    return r


_PLANS: dict = {}  # compiler -> the simulated host's plan (server_responses)


def _memory(name: str, compiler: int) -> dict:
    """roles/server's memory textfile files of host `name` in place (its plan file names the host)."""
    from roles import server

    pattern, answer = _synced(server.memory_files(dataclasses.replace(_PLANS[compiler], host=name)))
    return {re.compile(pattern, re.M): answer}


def _responses(pairs: list) -> dict:
    out: dict = {}
    for pattern, answer in pairs:
        out.setdefault(re.compile(pattern, re.M), answer)
    return out


_n = int(S["hosts"])
_compilers = int(S.get("compilers", 1))
_overrides = {"model_url": S["model_url"], "model_sha256": PROBE["model_sha256"],
              "smoke_probe_prompt": PROBE["prompt"], "smoke_probe_tokens": PROBE["tokens_requested"],
              "server_allow_unauthenticated": True,  # the fake fleet has no API key file
              "gateway_allow_unauthenticated": True,
              # a 40-hex commit: the simulated fleet resolves no tag (`git ls-remote` needs the network)
              "llama_cpp_ref": "0c1e57098bba43ac29e6e3b677cdceebdd22334f"}
_names = [f"@fake/gpu-{h:04d}" for h in range(_n)]
_fake = {"fake_delay": 0, "fake_delay_jitter": 0}
_loaded = load_or_exit({GROUP: [(n, dict(_fake)) for n in _names],
                        "gateway": [("@fake/gw", dict(_fake))]}, origin="bench/controller/scale_inventory.py",
                       overrides=_overrides)
_header = gguf_header.read_file(S["header"])
_cfg = Settings.of(_loaded[GROUP][0][1])
_answers = {c: _responses(server_responses(_cfg, c, _header)) for c in range(1, _compilers + 1)}
_gw_answers = _responses(gateway_responses(Settings.of(_loaded["gateway"][0][1]), _names,
                                           [_cfg.server.port_base + i for i in range(8)], _cfg.server.parallel))
_which = [1 if k < (_n + 1) // 2 or _compilers == 1 else 2 for k in range(_n)]
v100_16gb = [(name, {**data, "fake_responses": {**_answers[_which[k]], **_memory(name, _which[k])}})
             for k, (name, data) in enumerate(_loaded[GROUP])]
gateway = [(name, {**data, "fake_responses": _gw_answers}) for name, data in _loaded["gateway"]]
del StringIO
