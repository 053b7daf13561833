"""The pinned CPU llama-server inside a memory cgroup of this machine's kernel, with the ceiling its
unit would get (issue 49): the kernel test's (tests/kernel) and the bench's (bench/lab/memcg.py).

The configuration is the lab's CPU group (group_vars/all.yml, lab.yml) made small enough for two
shared cores and Gemma 3 270M (the lab's second model, 241 MiB): one slot, 2,048 tokens, 2 context
checkpoints, no host prompt cache, the weights read into anonymous memory (`server_mmap: false`,
`-lm none`: the file passes through the page cache at load, as the model's pages do on a CUDA host,
and is not needed after). From it, the project's own functions give everything: the host-memory plan
(voltafleet.planning.hostmem.plan), the unit and its MemoryMax (voltafleet.planning.unitfile.render_unit)
and the server's argv (voltafleet.planning.flags.server_args).

The cgroup: cgroup v1's memory controller (a child of this process's own memory cgroup), else
cgroup v2 (a child of the root, whose subtree has the memory controller), with the unit's MemoryMax
as memory.limit_in_bytes (v1) or memory.max (v2, with memory.swap.max 0 as MemorySwapMax=0). The
server is put in it before it runs: a shell writes its own pid to cgroup.procs, then execs it.
`unavailable()` says why a machine cannot do this (not root, no writable memory controller, no
pinned build or model); the test then fails with that reason, never skips.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from tests.gateway_local.harness import pinned_server
from voltafleet.measure import cgroupmem

REPO = Path(__file__).resolve().parents[2]
CGROUP = Path(os.environ.get("VOLTAFLEET_KERNEL_CGROUP_ROOT", "/sys/fs/cgroup"))
PORT = int(os.environ.get("VOLTAFLEET_KERNEL_PORT", "18991"))
SYSTEMD_VERSION = 252  # Debian 12's: the unit as a Debian 12 host gets it
# The small CPU configuration over the lab's group: what the plan, the unit and the argv are made from.
KERNEL_VARS = {"server_mmap": False, "server_parallel": 1, "server_ctx": 2048, "server_ctx_checkpoints": 2,
               "server_cache_ram": 0, "server_threads": 1, "model_sha256": "a" * 64,
               "server_host": "127.0.0.1"}  # this machine, outside the lab: its loopback, not the lab's bridge
PAST_PLAN_CHECKPOINTS = 256  # (b): the server runs with this many checkpoints a slot, its ceiling planned for 2


def model() -> str:
    """Gemma 3 270M in the lab's model mirror (VOLTAFLEET_KERNEL_MODEL: another GGUF)."""
    from lab.fleet import CACHE, GEMMA_NAME

    return os.environ.get("VOLTAFLEET_KERNEL_MODEL", str(CACHE / "mirror/http/models" / GEMMA_NAME))


def config(**over):
    """The variables: all.yml's (tests/fixture_vars), the lab group's, KERNEL_VARS, `over`; checked as
    any host's are (voltafleet.inputs.config.validate_values)."""
    from tests.fixture_vars import all_yml_vars
    from voltafleet.inputs.config import settings_of

    cfg = {**all_yml_vars(), **yaml.safe_load((REPO / "group_vars/lab.yml").read_text()), **KERNEL_VARS, **over}
    return settings_of("kernel-test", cfg)


@dataclass(frozen=True)
class Planned:
    cfg: object             # voltafleet.inputs.settings.Settings
    plan: object            # voltafleet.planning.hostmem.HostMemoryPlan
    unit: str               # llama-server@.service as rendered for it
    limit: int              # the unit's MemoryMax, in bytes

    def argv(self, binary: str, port: int = PORT, **over) -> list[str]:
        """The server's command line as the host's env file gives it (`over`: variables changed on the
        host without a new plan, e.g. a drop-in raising server_ctx_checkpoints)."""
        from voltafleet.planning import flags

        return [binary, *flags.server_args(self.cfg.replace(**over), model(), port, None)]

    def env(self) -> dict:
        """What the host's env file adds to the server's environment besides its argv: glibc's heap tunables
        where server_malloc_heap is on (the lab's, the V100 groups')."""
        from voltafleet.planning import flags

        return flags.env_vars(self.cfg.server.malloc_heap)


def planned(cfg: dict | None = None) -> Planned:
    """The host-memory plan of one instance of `cfg` for this model and machine, its unit and MemoryMax."""
    from voltafleet.models import gguf_header
    from voltafleet.planning import hostmem, vram
    from voltafleet.planning.unitfile import render_unit

    cfg = config() if cfg is None else cfg
    shape = vram.shape_of(gguf_header.read_file(model()))
    plan = hostmem.plan(cfg, shape, 1, mem_total=mem_total())
    assert plan.refusal("kernel-test") is None and plan.unplanned is None, plan.text()
    unit = render_unit(cfg, SYSTEMD_VERSION, plan)
    limit = int(re.search(r"^MemoryMax=(\d+)$", unit, re.M).group(1))
    assert limit == plan.memory_max
    return Planned(cfg, plan, unit, limit)


def mem_total() -> int:
    return int(re.search(r"^MemTotal:\s+(\d+) kB$", Path("/proc/meminfo").read_text(), re.M).group(1)) * 1024


# ---------------------------------------------------------------- the cgroup


def own_v1_memory_cgroup() -> str | None:
    """This process's cgroup in v1's memory hierarchy ("/..."), None without one."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path
    return None


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, type, options) of /proc/self/mounts."""
    return [(f[1], f[2], f[3]) for f in (line.split() for line in Path("/proc/self/mounts").read_text().splitlines())]


def parent_cgroup() -> tuple[Path, int, Path] | str:
    """(the directory to make the test's cgroup in, its cgroup version, its hierarchy's mount point), or
    why there is none."""
    mounts = _mounts()
    v1 = [m for m in mounts if m[1] == "cgroup" and "memory" in m[2].split(",")]
    if v1:
        point, _, opts = v1[0]
        own = own_v1_memory_cgroup()
        if "ro" in opts.split(","):
            return f"cgroup v1's memory controller is mounted read-only at {point}"
        if own is None:
            return f"this process is in no cgroup of v1's memory controller at {point}"
        return Path(point + own.rstrip("/")), 1, Path(point)
    v2 = [m for m in mounts if m[1] == "cgroup2" and Path(m[0]) == CGROUP]
    if v2:
        if "ro" in v2[0][2].split(","):
            return f"cgroup v2 is mounted read-only at {CGROUP}"
        controllers = (CGROUP / "cgroup.controllers").read_text().split()
        if "memory" not in controllers:
            return f"cgroup v2 at {CGROUP} has no memory controller (cgroup.controllers: {' '.join(controllers) or 'none'})"
        return CGROUP, 2, CGROUP
    return "no memory cgroup: neither cgroup v1's memory controller nor cgroup v2 is mounted"


def unavailable() -> str | None:
    """Why this machine cannot run the kernel test (None: it can). Every reason fails the test."""
    if os.geteuid() != 0:
        return "not root: making a memory cgroup and moving a process into it needs root"
    where = parent_cgroup()
    if isinstance(where, str):
        return f"no writable memory controller: {where}"
    if not pinned_server():
        return "no llama-server of the pinned commit (the lab builds one: python -m lab up)"
    if not os.path.exists(model()):
        return f"no {model()} (the lab's model mirror fetches Gemma 3 270M: python -m lab up)"
    return None


class Cgroup:
    """A memory cgroup made for one run, removed by `remove` (after its processes are gone)."""

    def __init__(self, name: str):
        where = parent_cgroup()
        if isinstance(where, str):
            raise RuntimeError(f"no writable memory controller: {where}")
        parent, self.version, self.mount = where
        if self.version == 2:
            control = (parent / "cgroup.subtree_control").read_text().split()
            if "memory" not in control:
                (parent / "cgroup.subtree_control").write_text("+memory")
        self.path = parent / f"{name}-{os.getpid()}"
        try:
            self.path.mkdir()
        except OSError as e:
            raise RuntimeError(f"no writable memory controller: cannot make {self.path}: {e}") from e

    @property
    def name(self) -> str:
        """Its path in its hierarchy, as /proc/PID/cgroup and the kernel's OOM report name it."""
        return "/" + str(self.path.relative_to(self.mount))

    def limit(self, value: int) -> None:
        """The unit's MemoryMax (and MemorySwapMax=0 on v2)."""
        if self.version == 1:
            (self.path / "memory.limit_in_bytes").write_text(str(value))
        else:
            (self.path / "memory.max").write_text(str(value))
            with contextlib.suppress(OSError):  # no swap accounting: nothing to limit
                (self.path / "memory.swap.max").write_text("0")

    def read(self) -> cgroupmem.Reading:
        return cgroupmem.read(self.path)

    def procs(self) -> list[int]:
        return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]

    def remove(self) -> None:
        """rmdir, once its processes are gone (they were this harness's; the caller ended them)."""
        deadline = time.monotonic() + 10
        while self.procs() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.version == 1:
            with contextlib.suppress(OSError):
                (self.path / "memory.force_empty").write_text("0")  # its page cache back to the host
        while True:
            try:
                self.path.rmdir()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def drop_cached(path: str) -> None:
    """The file's clean, unmapped pages out of the page cache (POSIX_FADV_DONTNEED): its next reader
    reads it from disk and is charged for it, as a host's first load after a download or a reboot."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_all(path: str) -> None:
    """The file through the page cache, charged to this process's cgroup (not the server's)."""
    with open(path, "rb") as f:
        while f.read(8 << 20):
            pass


# ---------------------------------------------------------------- the server


@dataclass
class Server:
    """The pinned llama-server in `cgroup`, started by a shell that moves itself into the cgroup and sets
    the unit's OOMScoreAdjust before it execs the server."""

    argv: list[str]
    cgroup: Cgroup
    log: Path
    oom_score_adjust: int
    port: int = PORT
    env: dict = field(default_factory=dict)  # the env file's variables besides the argv (Planned.env)
    proc: subprocess.Popen | None = None
    started: float = 0.0
    load_s: float | None = None
    turns: list[dict] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "Server":
        with socket.socket() as s:  # another server on the port would answer for this one
            if s.connect_ex(("127.0.0.1", self.port)) == 0:
                raise RuntimeError(f"port {self.port} is in use (VOLTAFLEET_KERNEL_PORT: another one)")
        lib = str(Path(self.argv[0]).parents[1] / "lib")
        env = {**os.environ, **self.env, "LD_LIBRARY_PATH": lib + ":" + os.environ.get("LD_LIBRARY_PATH", ""),
               "VF_PROCS": str(self.cgroup.path / "cgroup.procs"), "VF_OOM_ADJ": str(self.oom_score_adjust)}
        wrapper = 'echo $$ > "$VF_PROCS" && echo "$VF_OOM_ADJ" > /proc/$$/oom_score_adj && exec "$@"'
        self.started = time.monotonic()
        self.proc = subprocess.Popen(["sh", "-c", wrapper, "sh", *self.argv], env=env,
                                     stdout=open(self.log, "wb"), stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, timeout: float = 60) -> float:
        """Seconds from the start to /health's 200 (the model loaded); raises with the log's tail if it exits."""
        while time.monotonic() - self.started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.exit_status()}) while loading: {self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    self.load_s = time.monotonic() - self.started
                    return self.load_s
            time.sleep(0.02)
        raise TimeoutError(f"llama-server not ready in {timeout} s: {self.tail()}")

    def complete(self, prompt: str, tokens: int = 8, timeout: float = 60) -> dict:
        r = httpx.post(f"{self.url}/completion", json={"prompt": prompt, "n_predict": tokens, "temperature": 0,
                                                         "cache_prompt": True}, timeout=timeout)
        r.raise_for_status()
        return r.json()

    def converse(self, turns: int, first: str, tokens: int = 4, stop=None) -> list[dict]:
        """A conversation of `turns` follow-ups, each resending the whole history: llama-server processes
        the new part and keeps a context checkpoint of the slot's sliding-window state (one or two a turn,
        up to --ctx-checkpoints). Ends early when the server is gone or `stop(reading)` holds. Each turn:
        its seconds, prompt tokens and the cgroup's reading after it."""
        prompt = first
        for t in range(turns):
            if self.proc.poll() is not None:
                break
            t0 = time.monotonic()
            try:
                answer = self.complete(prompt, tokens)
            except httpx.HTTPError as e:
                self.turns.append({"turn": t, "error": type(e).__name__})
                continue
            prompt += answer["content"] + f"\nQuestion {t + 1}: and what came after step {t + 1}?\nAnswer:"
            r = self.cgroup.read()
            self.turns.append({"turn": t, "s": round(time.monotonic() - t0, 3), "prompt_tokens": answer["tokens_evaluated"],
                               "charged": r.charged, "file": r.file, "anon": r.anon, "events": dict(r.events)})
            if stop and stop(r):
                break
        return self.turns

    def checkpoints(self) -> list[tuple[int, float]]:
        """(how many the slot held then, its size in MiB) of each context checkpoint the server's log says
        it created ("created context checkpoint N of M (..., size = S MiB)")."""
        return [(int(n), float(m)) for n, m in re.findall(r"created context checkpoint (\d+) of \d+ .*size = ([\d.]+) MiB",
                                                           self.log.read_text(errors="replace"))]

    def exit_status(self) -> str:
        rc = self.proc.returncode
        return f"signal {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exit {rc}"

    def tail(self, n: int = 15) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


FIRST_PROMPT = ("A long conversation about the history of computing, from the abacus to the data centre. " * 40
                + "\nQuestion 0: what came first?\nAnswer:")


class Outsider:
    """A process beside the cgroup (in this process's own cgroup), holding `mib` MiB of anonymous memory it
    touched: larger than the server's own heap, so a host-wide OOM killer would weigh it; the cgroup's
    does not see it."""

    def __init__(self, mib: int = 64):
        code = (f"import sys, time\nb = bytearray({mib} << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
                "sys.stdout.write('ready\\n'); sys.stdout.flush()\ntime.sleep(600)\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline() == "ready\n"

    def rss(self) -> int:
        return int(re.search(r"^VmRSS:\s+(\d+) kB$", Path(f"/proc/{self.proc.pid}/status").read_text(), re.M).group(1)) * 1024

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def vmstat_oom_kills() -> int:
    """OOM kills on this machine since boot, every cgroup's and the host's (/proc/vmstat oom_kill)."""
    return int(re.search(r"^oom_kill (\d+)$", Path("/proc/vmstat").read_text(), re.M).group(1))


def kernel_log_since(marker: str) -> str | None:
    """The kernel's log after a line with `marker` (written to /dev/kmsg first), None when it cannot be read."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 or marker not in out.stdout:
        return None
    return out.stdout.split(marker, 1)[1]


def mark_kernel_log(marker: str) -> bool:
    try:
        with open("/dev/kmsg", "w") as f:
            f.write(f"{marker}\n")
        return True
    except OSError:
        return False
