"""What the roles share (roles never import each other): the run context, the current
host's validated variables, change tracking, shell helpers, ref resolution and release
fingerprints, the restart command, the gateway's runtime API (drain, ready) and the
per-host outcome record the rolling driver reads."""
from __future__ import annotations

import atexit
import copy
import shlex
import sys
import time
from functools import lru_cache
from pathlib import Path
from weakref import WeakKeyDictionary

from gevent.lock import Semaphore
from pyinfra import host, inventory, logger
from pyinfra.api import FunctionCommand, OperationError, operation
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import ContextObject

from roles.facts import Gpus, HAProxyServers, HostBasics, NvccVersion
from voltafleet import gateway as gw
from voltafleet import hostplan, mirror, outcome, refs
from voltafleet.config import SCHEMA, ConfigError, cli_sources, validate_values
from voltafleet.fleetplan import FleetPlan
from voltafleet.groupvars import SOURCES_KEY
from voltafleet.hostplan import BuildSpec
from voltafleet.lock import FleetLock, LockHeld
from voltafleet.modelmeta import remote_size
from voltafleet.once import Once
from voltafleet.runctx import RunContext

REPO = Path(__file__).resolve().parents[1]
SMOKE_CLIENT = "voltafleet-smoke"
WORKLOAD_CLIENT = "voltafleet-workload"
GATEWAY_GROUP = "gateway"


class ConfigRefused(PyinfraError):
    pass


class RefError(PyinfraError):
    pass


def once_per_run(fn):
    """fn(*key) computed once per run and key, however many host greenlets ask at once
    (voltafleet.once.Once with a gevent lock); `.calls` counts the real calls."""
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


def report_dir(cfg: dict) -> Path:
    """The driver's run directory, else smoke_report_dir."""
    d = Path(run_context().report_dir or cfg["smoke_report_dir"])
    return d if d.is_absolute() else REPO / d


def record(cfg: dict, name: str, status: str, reason: str = "", **fields) -> outcome.HostOutcome:
    """Write this run's outcome record for host `name` (the driver's only source of a verdict)."""
    ctx = run_context()
    rec = outcome.HostOutcome(host=name, run=ctx.run, status=status, reason=reason, rollout=ctx.rollout,
                              batch=ctx.batch, time=time.time(), **fields)
    outcome.write(report_dir(cfg), rec)
    return rec



# ---------------------------------------------------------------- variables and changes


def sources() -> dict:
    """{key: the file (or `pyinfra --data`) that set it} for the current host."""
    return cli_sources(host.data.get(SOURCES_KEY), inventory.get_override_data())


def host_config(h) -> dict:
    """Host h's voltafleet variables as its data holds them (another host: a builder, a server
    the gateway lists); the current host's validated ones are config()'s."""
    return {k: h.data.get(k) for k in SCHEMA}


def config() -> dict:
    """This host's variables, validated whatever their source: group_vars and the
    inventory (checked when it loaded) and pyinfra's own `--data key=value`."""
    try:
        return validate_values(host.name, host_config(host), sources())
    except ConfigError as e:
        raise ConfigRefused(str(e)) from None


def changes(op) -> bool:
    """True when operation `op` changes the host: its result once it ran (execute phase),
    else whether it will (prepare phase). pyinfra's own will_change / did_change."""
    if op is None:
        return False
    return op.did_change() if op.is_complete() else op.will_change


# ---------------------------------------------------------------- shell


class LiveCommand(FunctionCommand):
    """A shell command whose output is printed as it comes (`.shell` is the command)."""

    def __init__(self, shell: str):
        self.shell = shell
        super().__init__(self._run, (), {})

    def _run(self, state, host) -> bool:
        ok, out = sh(host, self.shell, print_output=True)
        if not ok:  # the output's tail as the error, not a Python traceback
            host.log_styled("\n".join(out.stderr_lines[-40:]) or f"`{self.shell[:120]}` failed", fg="red",
                            log_func=logger.error)
        return ok

    def __repr__(self):
        return f"LiveCommand({self.shell!r})"


def live(command: str) -> LiveCommand:
    """Run a long command (a compile, a 15 GB download) with its progress lines printed as
    they come, not minutes of silence; fail the host with the output's tail if it fails."""
    return LiveCommand(command)


def connector_args(h) -> dict:
    """Host h's own connector arguments (`_sudo`, `_sudo_user`, ...) from its inventory data:
    what a FunctionCommand's shell commands need, as pyinfra's own commands get them."""
    return {k: h.data.get(k) for k in CONNECTOR_ARGUMENT_KEYS if h.data.get(k) is not None}


def sh(h, command: str, **kwargs):
    """Run a shell command on host h (this one or another: a builder, a gateway) with its
    connector arguments, e.g. sudo on a prod host that connects as an ordinary user."""
    return h.run_shell_command(command, **connector_args(h), **kwargs)


def q(*args: str) -> str:
    return " ".join(shlex.quote(str(a)) for a in args)


def bin_path(plan, name: str) -> str:
    """Where a helper script is installed on the host."""
    return f"{plan.root}/bin/{name}"


# ---------------------------------------------------------------- releases


def resolve_ref(repo: str, ref: str) -> str:
    """The commit of (repo, ref): the fleet plan's (resolved once per rollout), else
    resolved on the controller once per run."""
    plan = fleet_plan()
    if plan and plan.commit(repo, ref):
        return plan.commit(repo, ref)
    try:
        return _resolve(repo, ref)
    except refs.RefError as e:
        raise RefError(str(e)) from None


_resolve = once_per_run(refs.resolve)


@once_per_run
def model_size(url: str) -> int | None:
    """A model file's size: the fleet plan's (one HEAD per rollout), else one HEAD per run
    (however many hosts ask at once)."""
    plan = fleet_plan()
    if plan and url in plan.model_bytes:
        return plan.model_bytes[url]
    return remote_size(url)  # one `git ls-remote` per (repo, ref) and run, not one per greenlet


# ---------------------------------------------------------------- facts read once until a change


_FACTS: WeakKeyDictionary = WeakKeyDictionary()  # {host: {(fact, kwargs): ((stage, changes), value)}}


def real_host(h):
    """The Host object itself: `pyinfra.host` is one context proxy for every host (hashed as
    itself), so a memo keyed by it would mix the hosts up."""
    return h._get_module() if isinstance(h, ContextObject) else h


def changes_so_far(h) -> int | None:
    """How many of host h's operations have run commands on it so far in this run (None:
    not a pyinfra host of a run, a test's fake one)."""
    h = real_host(h)
    ops = getattr(h.state, "ops", None)
    if not isinstance(ops, dict):
        return None
    return sum(1 for data in ops.get(h, {}).values() if data.operation_meta.executed)


def host_fact(h, cls, **kwargs):
    """h.get_fact(cls, **kwargs), read from the host once per run stage (prepare, execute)
    until one of its operations runs a command on it; then once again, and so on: the same
    value pyinfra's fresh read gives, for a fact only an operation changes (the compiler,
    the toolkit, packages, releases, the GPUs a driver shows), never one that moves by
    itself (a clock, a unit's state, the gateway's servers). An operation asks before its
    first command (after it, its own command may have changed the value). A copy each time."""
    h = real_host(h)
    executed = changes_so_far(h)
    if executed is None:
        return h.get_fact(cls, **kwargs)
    key, epoch = (cls, tuple(sorted(kwargs.items()))), (h.state.is_executing, executed)
    memo = _FACTS.setdefault(h, {})
    if key not in memo or memo[key][0] != epoch:
        memo[key] = (epoch, h.get_fact(cls, **kwargs))
    return copy.deepcopy(memo[key][1])


def host_build(h) -> BuildSpec:
    """Host h's build inputs, from its variables and GPUs (the same rule as its plan)."""
    cfg = host_config(h)
    cuda = cfg["voltafleet_backend"] == "cuda"
    archs = hostplan.cuda_archs(cfg, host_fact(h, Gpus)) if cuda else []
    return hostplan.build_spec(cfg, archs, resolve_ref(cfg["llama_cpp_repo"], cfg["llama_cpp_ref"]))


def host_fingerprint(h, build: BuildSpec | None = None) -> str | None:
    """Host h's fingerprint from its live facts; None while it has no compiler yet."""
    cxx = host_fact(h, HostBasics)["cxx"]
    if not cxx:
        return None
    build = build or host_build(h)
    toolkit = host_fact(h, NvccVersion, path=f"{build.cuda_bin}/nvcc") if build.cuda_bin else None
    return build.fingerprint(toolkit, cxx)


def restart_command(index: int) -> str:
    """Enable and restart one instance; `active` only once /health answers (ExecStartPost)."""
    unit = f"llama-server@{index}.service"
    # reset-failed: a unit that crash-looped into its start limit would refuse the restart
    return f"systemctl reset-failed {unit} 2>/dev/null; systemctl enable {unit} && systemctl restart {unit}"


# ---------------------------------------------------------------- the gateway's runtime API


class DrainError(OperationError):
    """An instance could not be confirmed out of rotation: it is not restarted."""


def is_gateway(h) -> bool:
    return GATEWAY_GROUP in h.groups


def is_mirror(h) -> bool:
    """A host of the `mirror` group: nginx caching the model for the server hosts."""
    return mirror.GROUP in h.groups


def is_server(h) -> bool:
    """A host that runs llama-server: neither a gateway nor a mirror."""
    return not is_gateway(h) and not is_mirror(h)


def server_address(h) -> str:
    """Where the gateway and the mirror reach a server host: server_address, else its ssh_hostname,
    else its inventory name."""
    return host_config(h)["server_address"] or h.data.get("ssh_hostname") or h.name


def fleet_mirrors(state) -> tuple:
    """The fleet's model mirrors (voltafleet.mirror.Mirror): the fleet plan's in a rollout
    (decided once), else every `mirror` host of the inventory, reachable in this run or not
    (a server host fetches through its own mirror whatever --limit says)."""
    plan = fleet_plan()
    if plan is not None:
        return plan.mirrors
    return mirror.mirrors_of([(h.name, {**host_config(h), "ssh_hostname": h.data.get("ssh_hostname")})
                              for h in state.inventory if is_mirror(h)])


@operation()
def after_mirrors_and_gateways():
    """Nothing on the host: an operation that every host of a plain run reaches from the same
    line of deploy.py, so it is one step of pyinfra's operation order, after the mirrors' and
    gateways' operations and before any server host's. pyinfra orders operations host by
    host (each host's in its order, hosts side by side), not by the deploy file's lines: a
    server host with fewer operations before its model fetch would otherwise fetch before
    its mirror is up.

    .. code:: python

        after_mirrors_and_gateways(name="Mirrors and gateways first")
    """
    return
    yield  # an operation is a generator; this one runs nothing


def mirrors_and_gateways_first(state) -> None:
    """In a run whose inventory has mirrors or gateways: every host's step after theirs."""
    if any(is_mirror(h) or is_gateway(h) for h in state.inventory):
        after_mirrors_and_gateways(name="Mirrors and gateways configured (server hosts from here)")


def gateway_hosts(state) -> list:
    """The gateway hosts taking part in this run (connected, not failed)."""
    return [h for h in state.inventory if is_gateway(h) and h in state.active_hosts]


def missing_gateways(state) -> list[str]:
    """Gateways of the inventory that this run cannot reach (or does not include)."""
    return [h.name for h in state.inventory if is_gateway(h) and h not in state.active_hosts]


def _run(gateway_host, command: str, what: str) -> str:
    ok, out = sh(gateway_host, command)
    if not ok:
        raise DrainError(f"gateway {gateway_host.name}: {what} failed ({out.stderr.strip()[:200] or 'no output'})")
    return out.stdout


def drain(state, server_name: str, index: int, timeout_s: float) -> int:
    """Take an instance out of rotation on every gateway, confirm it, and wait (up to
    timeout_s) for its streams to finish. Returns the streams still open at the deadline
    (cut by the restart). DrainError when a gateway does not list the instance or its
    runtime API does not answer: then nothing may restart."""
    name = gw.backend_name(server_name, index)
    gateways = gateway_hosts(state)
    for g in gateways:
        try:
            _run(g, gw.set_state(server_name, index, "drain"), f"drain {name}")
        finally:
            _changed_gateway(g)
        status = gw.server_states(_run(g, gw.runtime("show stat"), "show stat")).get(name)
        if status is None:
            raise DrainError(f"gateway {g.name} does not list backend {name}: it cannot be drained, so it is "
                             "not restarted. Fix: re-run the gateway (its configuration lacks this instance)")
        if not status.startswith(("DRAIN", "MAINT", "DOWN")):
            raise DrainError(f"gateway {g.name}: {name} is {status} after `drain`: not confirmed, not restarted")
    deadline = time.monotonic() + timeout_s
    open_streams = 0
    for g in gateways:
        while True:
            open_streams = gw.current_sessions(_run(g, gw.runtime("show stat"), "show stat"), name) or 0
            if not open_streams or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if open_streams:
            logger.warning(f"{g.name}: {name} still has {open_streams} stream(s) after {timeout_s:.0f} s: "
                           "the restart cuts them")
    return open_streams


# {server: status} of each gateway, read once per run stage (prepare, execute) for every
# server host of the fleet, and read again after this run's own drain or ready changed it.
_gateway_states = once_per_run(lambda g, executing: g.get_fact(HAProxyServers))


def gateway_states(g) -> dict:
    """Gateway g's {server: status} (HAProxyServers), shared by every server host of the run."""
    return _gateway_states(g, g.state.is_executing)


def _changed_gateway(g) -> None:
    _gateway_states.forget(lambda key: key[0] is not g)


def out_of_rotation(state, server_name: str, indexes) -> bool:
    """True when a gateway holds one of these instances drained or in maintenance."""
    names = {gw.backend_name(server_name, i) for i in indexes}
    for g in gateway_hosts(state):
        servers = gateway_states(g)
        if any(servers.get(n, "").startswith(("DRAIN", "MAINT")) for n in names):
            return True
    return False


def ready(state, server_name: str, indexes) -> None:
    """Put instances back in rotation on every gateway (health checks still apply); not in a
    tune trial, whose canary stays drained until the tune restores it."""
    if run_context().holds_drained:
        return
    for g in gateway_hosts(state):
        try:
            for i in indexes:
                _run(g, gw.set_state(server_name, i, "ready"), f"ready {gw.backend_name(server_name, i)}")
        finally:
            _changed_gateway(g)


def drain_timeout(cfg: dict) -> float:
    """How long a drain waits for streams: gateway_drain_timeout_s, by default the gateway's
    own stream timeout (no stream is cut)."""
    return cfg["gateway_drain_timeout_s"] if cfg["gateway_drain_timeout_s"] is not None \
        else cfg["gateway_stream_timeout_s"]


def drain_host(plan):
    """A hook (state, host) that drains every instance of the host on the gateways (the
    toolchain role calls it before the servers stop for a driver change)."""
    def hook(state, host):
        for inst in plan.instances:
            drain(state, host.name, inst.index, drain_timeout(plan.cfg))
    return hook
