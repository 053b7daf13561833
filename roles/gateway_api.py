"""The fleet's shape and the gateway's runtime API: which hosts are gateways, mirrors and
servers, and draining an instance out of rotation and putting it back (HAProxy's admin socket)."""

from __future__ import annotations

import time

from pyinfra import logger
from pyinfra.api import OperationError, operation

from roles.facts import HAProxyServers
from roles.run import ConfigRefused, fleet_plan, host_config, once_per_run, run_context
from roles.shell import sh
from voltafleet.front import gateway as gw
from voltafleet.front import pair
from voltafleet.inputs import pairvars
from voltafleet.inputs.settings import Settings
from voltafleet.ground.errors import Problem, format_errors
from voltafleet.front.tiers import GATEWAY_GROUP, runs_llama_server
from voltafleet.models import mirror


class DrainError(OperationError):
    """An instance could not be confirmed out of rotation: it is not restarted."""


def is_gateway(h) -> bool:
    return GATEWAY_GROUP in h.groups


def is_mirror(h) -> bool:
    """A host of the `mirror` group: nginx caching the model for the server hosts."""
    return mirror.GROUP in h.groups


def is_server(h) -> bool:
    """A host that runs llama-server: neither a gateway nor a mirror."""
    return runs_llama_server(h.groups)


def server_address(h) -> str:
    """Where the gateway and the mirror reach a server host: server_address, else its ssh_hostname,
    else its inventory name."""
    return host_config(h).server.address or h.data.get("ssh_hostname") or h.name


def fleet_mirrors(state) -> tuple:
    """The fleet's model mirrors (voltafleet.models.mirror.Mirror): the fleet plan's in a rollout
    (decided once), else every `mirror` host of the inventory, reachable in this run or not
    (a server host fetches through its own mirror whatever --limit says)."""
    plan = fleet_plan()
    if plan is not None:
        return plan.mirrors
    return mirror.mirrors_of([(h.name, host_config(h), h.data.get("ssh_hostname"))
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


def fleet_pair(state) -> pair.Pair | None:
    """The gateway group as one address (voltafleet/front/pair.py): None for one gateway; every gateway
    of the inventory, reachable in this run or not. Refuses the run, naming each host and key, when the
    group's variables cannot work as one address."""
    gateways = [(h.name, host_config(h), h.data.get("ssh_hostname")) for h in state.inventory if is_gateway(h)]
    found = pairvars.problems([(name, cfg.flat(), ssh) for name, cfg, ssh in gateways])
    if found:
        raise ConfigRefused("\n".join(format_errors(name, [Problem(what, fix, key=key)], "configuration refused")
                                      for name, key, what, fix in found))
    return pair.decide(gateways)


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
        # the instance's tier's backend (voltafleet/front/tiers.py), as the running gateway lists it
        backend = gw.server_backend(_run(g, gw.runtime("show stat"), "show stat"), name)
        if backend is None:
            raise DrainError(f"gateway {g.name} does not list backend {name}: it cannot be drained, so it is "
                             "not restarted. Fix: re-run the gateway (its configuration lacks this instance)")
        try:
            _run(g, gw.set_state(server_name, index, "drain", backend), f"drain {name}")
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
            listed = _run(g, gw.runtime("show stat"), "show stat")
            for i in indexes:
                backend = gw.server_backend(listed, gw.backend_name(server_name, i)) or gw.BACKEND
                _run(g, gw.set_state(server_name, i, "ready", backend), f"ready {gw.backend_name(server_name, i)}")
        finally:
            _changed_gateway(g)


def drain_timeout(cfg: Settings) -> float:
    """How long a drain waits for streams: gateway_drain_timeout_s, by default the gateway's
    own stream timeout (no stream is cut)."""
    return cfg.gateway.drain_timeout_s if cfg.gateway.drain_timeout_s is not None \
        else cfg.gateway.stream_timeout_s


def drain_host(plan):
    """A hook (state, host) that drains every instance of the host on the gateways (the
    toolchain role calls it before the servers stop for a driver change)."""
    def hook(state, host):
        for inst in plan.instances:
            drain(state, host.name, inst.index, drain_timeout(plan.settings))
    return hook
