"""Rollback as a decision: what a host that failed after its first change must do to serve
what it served before. Facts and the failure in, steps out; the activation role carries them out.

    >>> decide(Failure("restart", "instance 0 did not start", restarted=[0]),
    ...        Facts(has_good=True, rollback=True, instances=[0, 1]))
    [Step('restore'), Step('restart', 0), Step('smoke'), Step('ready')]
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

PHASES = ("gateway", "drain", "restart", "health", "smoke", "probe")
OOM = "cudaMalloc failed: out of memory"
CUDA_NOTE = ("the VRAM plan fits, so this is likely llama.cpp #28416 (sm_70 builds with CUDA 12.9.x fail to "
             "allocate the weights on a V100): set cuda_toolkit_version: \"12.8\" for this group")
ERROR_LINE = re.compile(r"error|failed|invalid|unknown|abort|exception|not supported|out of memory|terminate",
                        re.IGNORECASE)


class StepFailed(Exception):
    """A step of a host's activation failed (restart, smoke, probe, rollback): `phase` and a
    one-line `reason`, raised by the roles and turned into a Failure."""

    def __init__(self, phase: str, reason: str):
        super().__init__(reason)
        self.phase, self.reason = phase, reason


@dataclass(frozen=True)
class Failure:
    phase: str                        # one of PHASES: where the new release failed
    reason: str                       # one line, for the report
    restarted: list = field(default_factory=list)  # instances this run drained and (tried to) restart


@dataclass(frozen=True)
class Facts:
    has_good: bool                    # a snapshot of the last release, flags, unit that passed exists
    rollback: bool                    # smoke_rollback
    instances: list = field(default_factory=list)  # the plan's instances


@dataclass(frozen=True)
class Step:
    action: str                       # restore | restart | smoke | ready
    instance: int | None = None

    def __repr__(self):
        return f"Step({self.action!r}" + (f", {self.instance})" if self.instance is not None else ")")


def decide(failure: Failure, facts: Facts) -> list[Step]:
    """The steps back to the last good state; [] when there is none to go back to (the
    report then says why: see `why_not`). The restore puts every instance's files back; only
    the instances this run restarted (or tried to) run anything else, so only they restart,
    each drained first (the activation role confirms the drain, as for any restart). An instance
    this run never touched still runs the process it ran before, which is what the restored
    files describe: it keeps serving and is never restarted under load."""
    if why_not(facts):
        return []
    touched = [i for i in facts.instances if i in failure.restarted]
    return [Step("restore")] + [Step("restart", i) for i in touched] + [Step("smoke"), Step("ready")]


def why_not(facts: Facts) -> str | None:
    """Why there is no rollback, or None."""
    if not facts.rollback:
        return "smoke_rollback is off: the new release stays"
    if not facts.has_good:
        return "no release has passed a smoke test on this host yet: nothing to roll back to"
    return None


def last_error(log_lines: list[str]) -> str | None:
    """The server's own last error line (llama-server's log on the journal), if any."""
    for line in reversed([ln.strip() for ln in log_lines if ln.strip()]):
        if ERROR_LINE.search(line) and "systemd" not in line.split(":", 1)[0]:
            return line
    return None


def likely_cause(log_lines: list[str], plan_fits: bool | None) -> str | None:
    """The likely cause of a server that did not start: its last error line, and for a CUDA
    out-of-memory while the VRAM plan fits, the known CUDA 12.9 / V100 issue and its fix."""
    line = last_error(log_lines)
    if line and OOM in line and plan_fits:
        return f"{line} ({CUDA_NOTE})"
    return line


def outcome_status(steps: list[Step], passed_again: bool | None) -> str:
    """rolled_back when the steps ran and the old release passes again, else failed."""
    return "rolled_back" if steps and passed_again else "failed"
