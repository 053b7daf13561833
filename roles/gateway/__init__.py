"""Gateway: one endpoint for the fleet, HAProxy from the distribution.

Every llama-server instance of the fleet's server hosts is a backend, health-checked on
/health (a loading server answers 503 and stays out of rotation), least-connections,
stream-friendly timeouts, the client's Authorization header passed through, HAProxy's
Prometheus exporter on. A new configuration is validated with `haproxy -c` before it
replaces the running one, then reloaded without dropping connections; an invalid one
leaves the running gateway untouched.

The rolling rollout drains instances through the runtime API (`drain`, `ready` below).
"""
from __future__ import annotations

import shlex
import time
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import FactBase, OperationError, deploy, operation
from pyinfra.facts.files import Sha1File
from pyinfra.operations import apt, files, systemd

from roles.common import changes, config, host_config, sh
from roles.facts import Gpus
from voltafleet import gateway as gw
from voltafleet import hostplan

GROUP = "gateway"
TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "haproxy.cfg.j2"
LIVE = "/etc/haproxy/haproxy.cfg"
STAGED = "/etc/haproxy/haproxy.cfg.voltafleet"


def is_gateway(h) -> bool:
    return GROUP in h.groups


def gateway_hosts(state) -> list:
    """The gateway hosts taking part in this run (connected, not failed)."""
    return [h for h in state.inventory if is_gateway(h) and h in state.active_hosts]


def server_backends(state) -> list[gw.Backend]:
    """Every llama-server instance of the server hosts in this run, as HAProxy backends."""
    servers = []
    for h in state.inventory:
        if is_gateway(h) or h not in state.active_hosts:
            continue
        cfg = host_config(h)
        gpus = h.get_fact(Gpus) if cfg["voltafleet_backend"] == "cuda" else []
        address = cfg["server_address"] or h.data.get("ssh_hostname") or h.name
        servers.append((h.name, address, [i.port for i in hostplan.instances(cfg, gpus)]))
    return gw.backends(servers)


@operation()
def installed(staged: str, live: str, staged_op=None):
    """Validate the staged configuration with `haproxy -c`, keep the servers' runtime
    state (drained stays drained), then replace the live one and reload seamlessly.

    .. code:: python

        gateway.installed(staged="/etc/haproxy/haproxy.cfg.voltafleet", live="/etc/haproxy/haproxy.cfg")
    """
    if not changes(staged_op) and host.get_fact(Sha1File, path=live) == host.get_fact(Sha1File, path=staged):
        return
    q = shlex.quote
    yield (f"haproxy -c -q -f {q(staged)} || {{ echo 'voltafleet: the new HAProxy configuration is invalid; "
           f"the running gateway is untouched' >&2; haproxy -c -f {q(staged)} >&2; exit 1; }}")
    yield (f"if [ -S {gw.ADMIN_SOCKET} ]; then {gw.runtime('show servers state')} > {gw.STATE_FILE}.tmp "
           f"&& mv -f {gw.STATE_FILE}.tmp {gw.STATE_FILE}; fi")
    yield f"cp {q(staged)} {q(live)}.tmp && mv -f {q(live)}.tmp {q(live)}"
    yield "systemctl reload-or-restart haproxy"


@deploy("Gateway")
def gateway() -> None:
    """HAProxy with every llama-server instance of the fleet as a backend.

    .. code:: python

        gateway()
    """
    cfg = config()
    apt.packages(name="HAProxy and socat (runtime API)", packages=["haproxy", "socat"], update=True,
                 cache_time=24 * 3600, no_recommends=True)
    backends = server_backends(host.state)
    staged = files.template(
        name=f"HAProxy configuration ({len(backends)} backends, staged)", src=str(TEMPLATE), dest=STAGED,
        mode="644", jinja_env_kwargs={"trim_blocks": True, "lstrip_blocks": True},
        backends=backends, bind=cfg["gateway_bind"], metrics_bind=cfg["gateway_metrics_bind"],
        stream_timeout_s=cfg["gateway_stream_timeout_s"], check_interval_ms=cfg["gateway_check_interval_ms"],
        maxconn=cfg["gateway_maxconn"], admin_socket=gw.ADMIN_SOCKET, state_file=gw.STATE_FILE)
    installed(name="Validate (haproxy -c), then install and reload", staged=STAGED, live=LIVE, staged_op=staged)
    systemd.service(name="HAProxy running and enabled", service="haproxy", running=True, enabled=True)


# ---------------------------------------------------------------- runtime API, for the server and smoke roles


def _run(gateway_host, command: str) -> str:
    ok, out = sh(gateway_host, command)
    if not ok:
        raise OperationError(f"gateway {gateway_host.name}: `{command}` failed: {out.stderr.strip()}")
    return out.stdout


def drain(state, server_name: str, index: int, timeout_s: float) -> None:
    """Take an instance out of rotation on every gateway and wait (up to timeout_s) for its
    in-flight streams to finish."""
    gateways = gateway_hosts(state)
    name = gw.backend_name(server_name, index)
    for g in gateways:
        _run(g, gw.set_state(server_name, index, "drain"))
    deadline = time.monotonic() + timeout_s
    for g in gateways:
        while True:
            sessions = gw.current_sessions(_run(g, gw.runtime("show stat")), name)
            if not sessions or time.monotonic() > deadline:
                if sessions:
                    logger.warning(f"{g.name}: {name} still has {sessions} stream(s) after {timeout_s:.0f} s; restarting")
                break
            time.sleep(0.5)


class HAProxyServers(FactBase):
    """{server: status} of the llama backend, from HAProxy's runtime API (`show stat`)."""

    @staticmethod
    def default():
        return {}

    def command(self) -> str:
        return f"[ -S {gw.ADMIN_SOCKET} ] && {gw.runtime('show stat')} || true"

    def process(self, output):
        return gw.server_states("\n".join(output))


def out_of_rotation(state, server_name: str, indexes) -> bool:
    """True when a gateway holds one of these instances drained or in maintenance."""
    names = {gw.backend_name(server_name, i) for i in indexes}
    for g in gateway_hosts(state):
        servers = g.get_fact(HAProxyServers)
        if any(servers.get(n, "").startswith(("DRAIN", "MAINT")) for n in names):
            return True
    return False


def ready(state, server_name: str, indexes) -> None:
    """Put instances back in rotation on every gateway (health checks still apply)."""
    for g in gateway_hosts(state):
        for i in indexes:
            _run(g, gw.set_state(server_name, i, "ready"))


def drain_host(plan):
    """A hook (state, host) that drains every instance of the host on the gateways (the
    toolchain role calls it before the servers stop for a driver change)."""
    def hook(state, host):
        for inst in plan.instances:
            drain(state, host.name, inst.index, plan.cfg["gateway_drain_timeout_s"])
    return hook
