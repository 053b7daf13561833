"""The run, as the roles see it: the rollout <-> deploy context (voltafleet/state/runctx.py), the fleet plan,
the fleet lock, this host's validated variables, change tracking, and the per-host outcome record
the rolling driver reads."""

from __future__ import annotations

import atexit
import sys
import time
from functools import lru_cache
from pathlib import Path

from gevent.lock import Semaphore
from pyinfra import host, inventory, logger
from pyinfra.api.exceptions import PyinfraError

from voltafleet.inputs.config import SCHEMA, ConfigError, cli_sources, settings_of
from voltafleet.inputs.settings import Settings
from voltafleet.state.fleetplan import FleetPlan
from voltafleet.inputs.groupvars import SOURCES_KEY
from voltafleet.state.lock import FleetLock, LockHeld
from voltafleet.state.once import Once
from voltafleet.state.records import Outcome
from voltafleet.state.runctx import RunContext, RunDir


REPO = Path(__file__).resolve().parents[1]


class ConfigRefused(PyinfraError):
    pass


class RefError(PyinfraError):
    pass


def once_per_run(fn):
    """fn(*key) computed once per run and key, however many host greenlets ask at once
    (voltafleet.state.once.Once with a gevent lock); `.calls` counts the real calls."""
    return Once(fn, Semaphore)


# ---------------------------------------------------------------- the run


@lru_cache(maxsize=1)
def run_context() -> RunContext:
    """The rollout <-> deploy settings, read once from the environment."""
    return RunContext.from_env()


@lru_cache(maxsize=1)
def fleet_plan() -> FleetPlan | None:
    """The rolling driver's fleet plan (None in a plain pyinfra run)."""
    path = run_context().fleet_plan
    return FleetPlan.load(path) if path else None


_LOCK: list[FleetLock] = []


def hold_fleet_lock(state) -> None:
    """One rollout at a time: a plain deploy takes the fleet's lock for the whole run; a
    batch of the rolling driver runs under the driver's lock. Another holder refuses the
    run before anything changes."""
    if _LOCK:
        return
    names = [h.name for h in state.inventory]
    lock = FleetLock.for_hosts(names, "pyinfra " + " ".join(sys.argv[1:])[:200])
    try:
        lock.acquire(allow_pid=run_context().lock_owner)
    except LockHeld as e:
        raise PyinfraError(f"voltafleet: {e}") from None
    if lock.warning:
        logger.warning(f"voltafleet: {lock.warning}")
    _LOCK.append(lock)
    atexit.register(lock.release)  # a clean exit leaves no stale lock behind


def report_dir(cfg: Settings) -> Path:
    """The driver's run directory, else smoke_report_dir."""
    d = Path(run_context().report_dir or cfg.smoke.report_dir)
    return d if d.is_absolute() else REPO / d


def record(cfg: Settings, name: str, status: str, reason: str = "", **fields) -> Outcome:
    """Write this run's outcome record for host `name` (the driver's only source of a verdict)."""
    ctx = run_context()
    rec = Outcome(host=name, run=ctx.run, status=status, reason=reason, rollout=ctx.rollout,
                  batch=ctx.batch, time=time.time(), **fields)
    RunDir(report_dir(cfg)).write(rec)
    return rec



# ---------------------------------------------------------------- variables and changes


def sources() -> dict:
    """{key: the file (or `pyinfra --data`) that set it} for the current host."""
    return cli_sources(host.data.get(SOURCES_KEY), inventory.get_override_data())


def host_config(h) -> Settings:
    """Host h's settings as its data holds them (another host: a builder, a server the gateway
    lists; checked when the inventory loaded); the current host's, checked again, are config()'s."""
    return Settings.of({k: h.data.get(k) for k in SCHEMA})


def config() -> Settings:
    """This host's settings, validated whatever their source: group_vars and the
    inventory (checked when it loaded) and pyinfra's own `--data key=value`."""
    try:
        return settings_of(host.name, {k: host.data.get(k) for k in SCHEMA}, sources())
    except ConfigError as e:
        raise ConfigRefused(str(e)) from None


def changes(op) -> bool:
    """True when operation `op` changes the host: its result once it ran (execute phase),
    else whether it will (prepare phase). pyinfra's own will_change / did_change."""
    if op is None:
        return False
    return op.did_change() if op.is_complete() else op.will_change
