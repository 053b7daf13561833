"""The result contract: one typed record per host and run, written by the roles on the
controller and read by the rolling driver. A host is "passed" only when its own record of
this run says so; no record, a record of another run, or an unreadable one is a failure.

    >>> r = HostOutcome(host="gpu-01", run="r1", status="passed", reason="")
    >>> read(write(Path("/tmp"), r), "gpu-01", "r1").status
    'passed'
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from voltafleet.runctx import RunDir

STATUSES = ("passed", "unmeasured", "rolled_back", "failed", "interrupted", "unreachable", "not_run")
# unmeasured: serving, but not judged (smoke_enabled: false): never counted as passed, nor as failed
NOT_FAILED = ("passed", "unmeasured")


@dataclass
class HostOutcome:
    host: str
    run: str
    status: str                       # one of STATUSES
    reason: str = ""                  # one line: why it is not passed ("" when passed)
    rollout: str | None = None
    batch: str | None = None
    release: str | None = None        # the release it serves now
    flags: list = field(default_factory=list)
    model_sha256: str | None = None
    probe: str | None = None          # "match", "diverged: ...", "recorded", "not run", or None (no probe)
    ttft_ms: float | None = None      # single stream (the worst instance)
    ttft_p50_ms: float | None = None  # N concurrent streams: p50 and p99 (the worst instance)
    ttft_p99_ms: float | None = None
    single_tps: float | None = None
    aggregate_tps: float | None = None
    restarted: list = field(default_factory=list)   # instances restarted by this run
    streams_cut: int = 0              # streams still open when a drain gave up waiting
    converged: bool = False           # nothing restarted: probed only
    time: float = 0.0

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")
        self.reason = one_line(self.reason)


def one_line(text: str, limit: int = 300) -> str:
    """A reason as one line: whitespace folded, at most `limit` characters."""
    line = " ".join(str(text or "").split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def path(directory: Path, host: str) -> Path:
    return RunDir(directory).file("outcome", host)


def write(directory: Path, outcome: HostOutcome) -> Path:
    """Write the record atomically (a reader never sees half of it)."""
    return RunDir(directory).write("outcome", outcome.host, asdict(outcome), indent=2)


def read(directory: Path, host: str, run: str) -> HostOutcome | None:
    """The host's record of run `run`, or None (missing, unreadable, another run's)."""
    data = RunDir(directory).read("outcome", host, run=run)
    if data is None:
        return None
    known = {f.name for f in fields(HostOutcome)}
    try:
        return HostOutcome(**{k: v for k, v in data.items() if k in known})
    except (TypeError, ValueError):
        return None
