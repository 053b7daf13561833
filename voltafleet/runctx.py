"""What one pyinfra run of deploy.py was asked to do, read once from the environment the
rolling driver (python -m rollout) sets; a plain `pyinfra ... deploy.py` gets the defaults.

    >>> ctx = RunContext.from_env({"VOLTAFLEET_PHASE": "batch", "VOLTAFLEET_RUN": "r1"})
    >>> ctx.phase, ctx.run
    ('batch', 'r1')
"""
from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass

PHASES = ("all", "preflight", "gateway", "batch", "plan", "tune")


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

    @classmethod
    def from_env(cls, env=None) -> "RunContext":
        env = os.environ if env is None else env
        phase = env.get("VOLTAFLEET_PHASE") or "all"
        if phase not in PHASES:
            raise ValueError(f"VOLTAFLEET_PHASE={phase!r}: one of {', '.join(PHASES)}")
        owner = env.get("VOLTAFLEET_LOCK_OWNER")
        return cls(phase=phase, run=env.get("VOLTAFLEET_RUN") or new_id(),
                   rollout=env.get("VOLTAFLEET_ROLLOUT") or None, batch=env.get("VOLTAFLEET_BATCH") or None,
                   report_dir=env.get("VOLTAFLEET_REPORT_DIR") or None,
                   fleet_plan=env.get("VOLTAFLEET_FLEET_PLAN") or None,
                   smoke_always=env.get("VOLTAFLEET_SMOKE") == "always",
                   no_gateway=env.get("VOLTAFLEET_NO_GATEWAY") == "1",
                   record_probe=env.get("VOLTAFLEET_PROBE") == "record",
                   lock_owner=int(owner) if owner and owner.isdigit() else None)

    @property
    def holds_drained(self) -> bool:
        """A tune trial: the canary's instances stay out of rotation (roles.common.ready)."""
        return self.phase == "tune"
