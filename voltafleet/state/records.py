"""The records a run leaves for the driver and for people, typed: one dataclass per kind of
voltafleet.state.runctx.RunDir (its file names are spelled there, and only there). A role builds its
record and writes it with `RunDir(dir).write(record)`; a reader gets the record back with
`RunDir(dir).read(Kind, host, run)` (or `read(dir, Kind, host, run)`), or None: missing,
unreadable, another run's, or not this kind's fields and types. A record that does not parse is
no record, so a failure: a verdict is never a default.

    >>> rec = Outcome(host="gpu-01", run="r1", status="passed")
    >>> Outcome.of(rec.to_dict()) == rec, Outcome.of({**rec.to_dict(), "streams_cut": "2"})
    (True, None)

Who writes and reads each kind: docs/records.md.
"""
from __future__ import annotations

import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from pathlib import Path

from voltafleet.state.fleetplan import ServerEntry
from voltafleet.state.runctx import RunDir

STATUSES = ("passed", "unmeasured", "rolled_back", "failed", "interrupted", "unreachable", "not_run")
# unmeasured: serving, but not judged (smoke_enabled: false): never counted as passed, nor as failed
NOT_FAILED = ("passed", "unmeasured")


class RecordError(ValueError):
    """A record's fields are not its kind's: which field, and why."""


# ---------------------------------------------------------------- fields and types


def _parse(value, tp, where: str):
    """`value` (as JSON gives it) as type `tp`: the value (a tuple for a tuple, a dataclass for
    a dataclass), or RecordError. An int is a float (JSON writes 2.0 as 2.0, people write 2);
    a bool is never a number."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is typing.Any:
        return value
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            try:
                return _parse(value, arg, where)
            except RecordError:
                pass
        raise RecordError(f"{where}: {value!r} is not {tp}")
    if tp is type(None):
        if value is None:
            return None
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    elif tp is str:
        if isinstance(value, str):
            return value
    elif isinstance(tp, type) and is_dataclass(tp):
        return _build(tp, value, where, strict=False)
    elif tp is tuple or origin is tuple:
        if isinstance(value, (list, tuple)):
            if not args:
                return tuple(value)
            item = args[0]  # tuple[X, ...]: the only tuples of a record
            return tuple(_parse(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    elif tp is list or origin is list:
        if isinstance(value, (list, tuple)):
            if not args:
                return list(value)
            return [_parse(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
    elif tp is dict or origin is dict:
        if isinstance(value, dict):
            if not args:
                return dict(value)
            return {_parse(k, args[0], f"{where} key"): _parse(v, args[1], f"{where}[{k!r}]") for k, v in value.items()}
    else:
        raise RecordError(f"{where}: a record field of an unsupported type {tp}")
    raise RecordError(f"{where}: {value!r} is not {getattr(tp, '__name__', tp)}")


def _build(cls, data, where: str, strict: bool):
    """An instance of dataclass `cls` from a mapping: every field present or defaulted, each of
    its type. `strict`: a key that is not a field is an error too (a writer's typo); a reader
    skips it (a newer writer's field)."""
    if not isinstance(data, dict):
        raise RecordError(f"{where}: {type(data).__name__}, not a mapping")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls) if f.init}
    if strict and set(data) - set(known):
        raise RecordError(f"{where}: no field {', '.join(sorted(set(data) - set(known)))} in {cls.__name__}")
    kw = {}
    for name, f in known.items():
        if name in data:
            kw[name] = _parse(data[name], hints[name], f"{where}.{name}")
        elif f.default is MISSING and f.default_factory is MISSING:
            raise RecordError(f"{where}: {cls.__name__} has no {name}")
    try:
        return cls(**kw)
    except (TypeError, ValueError) as e:
        raise RecordError(f"{where}: {e}") from None


def field_types(cls) -> dict[str, object]:
    """{field: its type} of a record kind (the contract test checks them)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


class Record:
    """What every kind has: KIND (its RunDir name), `host` and `run` fields, to_dict / of / make.

    `of(data)` is the reader's: the record, or None when `data` is not one. `make(data)` is the
    writer's: the record, or RecordError naming the field (a writer's mistake is loud)."""

    KIND = ""
    INDENT: int | None = 1  # the JSON's indent on disk

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, data):
        try:
            return _build(cls, data, cls.KIND, strict=False)
        except RecordError:
            return None

    @classmethod
    def make(cls, data: dict):
        return _build(cls, data, cls.KIND, strict=True)


# ---------------------------------------------------------------- the kinds


@dataclass(frozen=True, kw_only=True)
class Preflight(ServerEntry, Record):
    """preflight-<host>.json: what the fleet plan needs of a server host (the fields of
    fleetplan.ServerEntry, declared there once: host, address, ports, slots, fingerprint, tier),
    the run, or why preflight refused it (`refusals`: the driver learns a refusal here, never from text)."""

    KIND = "preflight"

    run: str
    refusals: tuple[str, ...] = ()    # why preflight refused the host (nothing changed); () when it passed

    def entry(self) -> ServerEntry | None:
        """The fleet plan's entry of this host (a plain ServerEntry); None when preflight refused it."""
        if self.refusals:
            return None
        return ServerEntry(**{f.name: getattr(self, f.name) for f in fields(ServerEntry)})


@dataclass(frozen=True)
class Timings:
    """What the activation role timed (seconds), for the plan's calibration (voltafleet/state/calibrate.py)."""

    drain_s: list[float] = field(default_factory=list)    # each drain, confirmed
    restart_s: list[float] = field(default_factory=list)  # each restart until /health answered
    smoke_s: float | None = None                          # the smoke test (None: not run)


@dataclass(frozen=True)
class Smoke(Record):
    """smoke-<host>.json: the smoke client's figures of every instance, judged on the controller
    (voltafleet/measure/smoke.py), and the verdict. `instances` are the client's own per-instance
    mappings (voltafleet/hostside/smoke_client.py: port, ttft_ms, single_tps, aggregate_tps, errors,
    probes, gpu...), or {"port", "instance", "error"}."""

    KIND = "smoke"
    INDENT = 2

    host: str
    run: str
    passed: bool
    failures: list[str]
    instances: list[dict] = field(default_factory=list)
    timings: Timings = field(default_factory=Timings)
    fingerprint: str | None = None    # the release it serves now
    batch: str | None = None
    time: str = ""                    # when, local time (ISO 8601)
    epoch: float = 0.0
    flags: list[str] = field(default_factory=list)   # instance 0's llama-server argv
    thresholds: dict = field(default_factory=dict)   # smoke_max_ttft_ms, smoke_min_single_tps, smoke_min_aggregate_tps
    judged: dict = field(default_factory=dict)       # {instance: the single-stream figure judged, and each source's}
    disagreements: list[str] = field(default_factory=list)
    probe_only_failures: bool = False  # every failure is the golden probe's
    probe_diverged: str | None = None  # the first divergence from the golden probe
    gpu_health: dict | None = None     # voltafleet.gpu.gpuhealth.summary of the boards (CUDA)
    rolled_back: bool = False
    after_rollback: dict | None = None  # the old release's smoke test after a rollback


@dataclass
class Outcome(Record):
    """outcome-<host>.json: the host's verdict of one run (the driver's only source of one)."""

    KIND = "outcome"
    INDENT = 2

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


@dataclass(frozen=True)
class Tune(Record):
    """tune-<host>.json: one --tune trial's measurement on the drained canary (voltafleet.measure.tune.Trial.of)."""

    KIND = "tune"

    host: str
    run: str
    status: str                       # measured | failed
    reason: str = ""
    probe: str | None = None          # the golden probe's verdict in its smoke test
    reps: list[dict] = field(default_factory=list)  # the workload's repetitions (voltafleet/hostside/workload.py)
    loaded_mib: float | None = None   # the GPU's memory once loaded, before any request
    after_load_mib: float | None = None
    planned_mib: float | None = None  # the VRAM plan of the setting (CUDA)
    planned_static_mib: float | None = None
    gpu: dict | None = None           # the GPU measured on: name, compute_cap, memory_mib, driver_version


@dataclass(frozen=True)
class Profile(Record):
    """profile-<host>.json: a host's log lines of the --profile-hours window (voltafleet/measure/profile.py)."""

    KIND = "profile"
    INDENT = None  # up to 200000 lines

    host: str
    run: str
    kind: str                         # "server" (llama-server's journal) or "gateway" (HAProxy's, its fields only)
    ok: bool                          # the journal could be read
    lines: list[str] = field(default_factory=list)
    reason: str = ""                  # why not ok


@dataclass(frozen=True)
class Build(Record):
    """build-<host>.json: the llama.cpp release this run put on the host: compiled here
    (`built`, with vf-build-release's seconds) or installed from another host's build."""

    KIND = "build"

    host: str
    run: str
    fingerprint: str
    built: bool                       # True: compiled on this host; False: installed (no compile)
    seconds: float | None = None      # the compile's (configure and build), or the install's
    source: str = ""                  # installed: the host that compiled it ("" when built here or unknown)


@dataclass(frozen=True)
class Download:
    """One model file fetched: the bytes this run downloaded (a resumed download's rest) and the
    seconds curl took (vf-fetch-model)."""

    dest: str
    bytes: int
    seconds: float

    @property
    def mib_s(self) -> float | None:
        return self.bytes / 2**20 / self.seconds if self.seconds > 0 and self.bytes > 0 else None


@dataclass(frozen=True)
class Fetch(Record):
    """fetch-<host>.json: the model files this run downloaded to the host (none: no record)."""

    KIND = "fetch"

    host: str
    run: str
    downloads: tuple[Download, ...] = ()


@dataclass
class HostChange(Record):
    """plan-<host>.json (`python -m rollout --plan`): what a rollout would change on the host,
    decided without changing anything (voltafleet/state/dryrun.py decides it)."""

    KIND = "plan"

    host: str
    refusals: list = field(default_factory=list)   # preflight's refusals: the rollout would not start
    warnings: list = field(default_factory=list)
    fingerprint: str | None = None     # the release it should run (None: known after the toolchain)
    release_key: str | None = None     # the fingerprint, or a stand-in of the build inputs
    current: str | None = None         # the release it runs now
    present: bool = False              # the release it should run is on the host
    shared: bool = True                # llama_cpp_build_strategy: shared
    toolchain: list = field(default_factory=list)  # installed first: "build tools", "CUDA toolkit 12.9"
    flags: dict = field(default_factory=dict)      # {instance: ["-t 1 -> 2", ...]} of changed env files
    unit: bool = False                 # the systemd unit changes
    downloads: list = field(default_factory=list)  # [{"dest", "bytes"}]: model files to fetch
    driver: str | None = None          # None: unchanged; "install", "upgrade" or "reboot"
    driver_why: str = ""
    driver_managed: bool = False       # a CUDA host whose driver voltafleet manages
    restart: list = field(default_factory=list)    # instances restarted (drained, one at a time)
    restart_why: list = field(default_factory=list)
    retire: list = field(default_factory=list)     # instances stopped and removed
    instances: int = 0
    smoke: bool = True                 # smoke_enabled
    probe: bool = True                 # smoke_probe: a converged host is probed
    constants: dict = field(default_factory=dict)  # voltafleet.planning.timeline.Constants of this host
    resources: list = field(default_factory=list)  # HostPlan.resource_lines: host memory, per instance, CPU
    run: str = ""                      # the plan run's id

    def to_dict(self) -> dict:
        d = asdict(self)
        d["flags"] = {str(k): v for k, v in self.flags.items()}  # JSON's keys are strings
        return d

    @classmethod
    def of(cls, data):
        out = super().of(data)
        if out is not None:
            try:
                out.flags = {int(k): v for k, v in out.flags.items()}
            except ValueError:
                return None
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "HostChange":
        """The record, or ValueError / TypeError (dryrun's callers)."""
        out = cls.of(d)
        if out is None:
            raise ValueError(f"not a plan record: {d!r}"[:300])
        return out


KINDS = (Preflight, Smoke, Outcome, Tune, Profile, Build, Fetch, HostChange)  # every RunDir kind, typed


def read(directory: str | Path, kind: type, host: str, run: str | None = None):
    """The host's record of `kind` (of run `run`, when given) in a run directory, or None."""
    return RunDir(directory).read(kind, host, run)


def entry(record: Preflight | None) -> ServerEntry | None:
    """A preflight record's fleet plan entry: None for no record, or a refused host."""
    return record.entry() if record is not None else None
