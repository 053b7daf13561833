"""The run contract between the rolling driver (python -m rollout) and deploy.py: every
environment variable and every file name that passes between them is spelled here, and
only here. The driver makes a RunContext and hands pyinfra `ctx.to_env()`; deploy.py's roles
read the same context back with `RunContext.from_env()`; the records a run leaves for the
driver go through RunDir (atomic, and each carrying its run id: a record of another run is
never read as this one's). A plain `pyinfra ... deploy.py` gets the defaults.

    >>> ctx = RunContext.from_env({"VOLTAFLEET_PHASE": "batch", "VOLTAFLEET_RUN": "r1"})
    >>> ctx.phase, ctx.run
    ('batch', 'r1')
    >>> RunContext.from_env(ctx.to_env()) == ctx
    True
"""
from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass, fields
from pathlib import Path

PHASES = ("all", "preflight", "gateway", "batch", "plan", "tune", "profile")

# RunContext's field -> the environment variable that carries it to deploy.py
ENV = {"phase": "VOLTAFLEET_PHASE", "run": "VOLTAFLEET_RUN", "rollout": "VOLTAFLEET_ROLLOUT",
       "batch": "VOLTAFLEET_BATCH", "report_dir": "VOLTAFLEET_REPORT_DIR", "fleet_plan": "VOLTAFLEET_FLEET_PLAN",
       "smoke_always": "VOLTAFLEET_SMOKE", "no_gateway": "VOLTAFLEET_NO_GATEWAY", "record_probe": "VOLTAFLEET_PROBE",
       "lock_owner": "VOLTAFLEET_LOCK_OWNER", "vars_file": "VOLTAFLEET_VARS"}


def new_id() -> str:
    """A run id unique across concurrent runs: the time (readable) and 48 random bits."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(6)


@dataclass(frozen=True)
class RunContext:
    phase: str = "all"                # all | preflight | gateway | batch | plan (read only: --plan) | tune (a trial
                                      # on the drained canary: it stays drained, the workload runs: --tune)
    run: str = ""                     # this pyinfra run's id: every record it writes carries it
    rollout: str | None = None        # the rolling driver's rollout id (None: a plain pyinfra run)
    batch: str | None = None          # the batch number, as the driver counts them
    report_dir: str | None = None     # where records and reports go (the driver's run directory)
    fleet_plan: str | None = None     # the driver's fleet plan (JSON): resolved once per rollout
    smoke_always: bool = False        # measure even hosts where nothing restarted (make demo)
    no_gateway: bool = False          # restart without a drain when the gateway is unreachable
    record_probe: bool = False        # record the golden probe from this run's canary
    lock_owner: int | None = None     # pid of the driver that holds the fleet lock for this run

    vars_file: str | None = None      # a YAML file of variables applied last to every host (a tune trial)

    @classmethod
    def from_env(cls, env=None) -> "RunContext":
        env = os.environ if env is None else env
        phase = env.get(ENV["phase"]) or "all"
        if phase not in PHASES:
            raise ValueError(f"{ENV['phase']}={phase!r}: one of {', '.join(PHASES)}")
        owner = env.get(ENV["lock_owner"])
        return cls(phase=phase, run=env.get(ENV["run"]) or new_id(),
                   rollout=env.get(ENV["rollout"]) or None, batch=env.get(ENV["batch"]) or None,
                   report_dir=env.get(ENV["report_dir"]) or None,
                   fleet_plan=env.get(ENV["fleet_plan"]) or None,
                   smoke_always=env.get(ENV["smoke_always"]) == "always",
                   no_gateway=env.get(ENV["no_gateway"]) == "1",
                   record_probe=env.get(ENV["record_probe"]) == "record",
                   lock_owner=int(owner) if owner and owner.isdigit() else None,
                   vars_file=env.get(ENV["vars_file"]) or None)

    def to_env(self) -> dict[str, str]:
        """What a pyinfra run of deploy.py gets on top of the driver's own environment, so that
        it reads back as this context (the driver starts from RunContext.from_env() of its own
        environment, so `VOLTAFLEET_SMOKE=always python -m rollout ...` reaches every run)."""
        on = {"smoke_always": "always", "no_gateway": "1", "record_probe": "record"}
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None or v is False:
                continue
            out[ENV[f.name]] = on[f.name] if f.name in on else str(v)
        return out

    @property
    def holds_drained(self) -> bool:
        """A tune trial: the canary's instances stay out of rotation (roles.gateway_api.ready)."""
        return self.phase == "tune"


class RunDir:
    """A run directory: the only place the names of the records a run leaves are spelled.

    Each kind is `<kind>-<host>.json` (a "/" of a host name as "_"), written atomically with
    the run id inside. The records are typed (voltafleet.state.records: a kind's class has KIND, host,
    run, to_dict and of): `write(record)`; `read(Kind, host, run)` returns the record, or None
    for a missing, unreadable, other run's or malformed one. Nothing reads a record as a raw
    mapping: a kind's name is refused (TypeError)."""

    KINDS = ("preflight", "outcome", "smoke", "plan", "tune", "profile", "build", "fetch")
    FLEET_PLAN = "fleet-plan.json"
    PLAN = "plan.json"

    def __init__(self, path):
        self.path = Path(path)

    def file(self, kind, host: str) -> Path:
        kind = kind if isinstance(kind, str) else kind.KIND
        if kind not in self.KINDS:
            raise ValueError(f"no record kind {kind!r}: one of {', '.join(self.KINDS)}")
        return self.path / f"{kind}-{host.replace('/', '_')}.json"

    def write(self, record) -> Path:
        """The record (voltafleet.state.records), atomically: a reader never sees half of one. A record
        that would not read back (a field not of its type) is not written: RecordError, naming it."""
        p = self.file(record.KIND, record.host)
        data = record.to_dict()
        record.make(data)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=record.INDENT) + "\n")
        tmp.replace(p)
        return p

    def read(self, kind, host: str, run: str | None = None):
        """The host's record of `kind` (a record class), or None: missing, unreadable, not a
        mapping, not the kind's fields, or (with `run`) another run's."""
        return self._load(self.file(self._typed(kind), host), kind, run)

    def all(self, kind) -> list:
        """Every readable record of a kind (a record class), in file-name order."""
        self.file(self._typed(kind), "x")  # a known kind
        found = (self._load(p, kind, None) for p in sorted(self.path.glob(f"{kind.KIND}-*.json")))
        return [r for r in found if r is not None]

    @staticmethod
    def _typed(kind):
        if isinstance(kind, str):
            raise TypeError(f"RunDir reads typed records only: pass the record class of {kind!r} "
                            "(voltafleet.state.records), not its name")
        return kind

    @staticmethod
    def _load(path: Path, kind, run: str | None):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or (run is not None and data.get("run") != run):
            return None
        return kind.of(data)
