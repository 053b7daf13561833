"""Gateway: one endpoint for the fleet, HAProxy from the distribution.

Every llama-server instance of the fleet's server hosts is a backend, health-checked on
/health (a loading server answers 503 and stays out of rotation), least-connections,
stream-friendly timeouts, the client's Authorization header passed through, HAProxy's
Prometheus exporter on. A new configuration is validated with `haproxy -c` before it
replaces the running one, then reloaded without dropping connections; an invalid one
leaves the running gateway untouched.

The rolling rollout drains instances through the runtime API (roles/common: drain, ready).
"""
from __future__ import annotations

import shlex
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.files import Sha1File
from pyinfra.operations import apt, files, systemd

from roles.common import changes, config, fleet_plan, host_config, host_fact, is_server, server_address
from roles.facts import Gpus, HAProxyBackends
from voltafleet import gateway as gw
from voltafleet import hostplan

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "haproxy.cfg.j2"
LIVE = "/etc/haproxy/haproxy.cfg"
STAGED = "/etc/haproxy/haproxy.cfg.voltafleet"
ERRORFILE = "/etc/haproxy/voltafleet-503.http"


def server_backends(state) -> list[gw.Backend]:
    """Every llama-server instance of the fleet as HAProxy backends: from the fleet plan in a
    rollout (decided once, every server host of the inventory); in a plain run from each
    server host's variables and GPUs, and for a server host this run cannot reach (or
    leaves out) the backends the live configuration already has for it."""
    plan = fleet_plan()
    if plan is not None:
        return gw.backends([(s.host, s.address, list(s.ports), s.slots) for s in plan.servers])
    planned, unplanned = [], []
    for h in state.inventory:
        if not is_server(h):  # a gateway or a model mirror
            continue
        if h not in state.active_hosts:
            unplanned.append(h.name)
            continue
        cfg = host_config(h)
        gpus = host_fact(h, Gpus) if cfg["voltafleet_backend"] == "cuda" else []
        # slots: the instance's -np (unset, the VRAM plan picks it: known in a rollout's fleet plan)
        planned.append((h.name, server_address(h), [i.port for i in hostplan.instances(cfg, gpus)], cfg["server_parallel"]))
    live = host.get_fact(HAProxyBackends, path=LIVE) if unplanned else []
    return gw.fleet_backends(planned, unplanned, live)


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
        maxconn=cfg["gateway_maxconn"], admin_socket=gw.ADMIN_SOCKET, state_file=gw.STATE_FILE,
        queue_timeout_s=cfg["gateway_queue_timeout_s"], keepalive_timeout_s=cfg["gateway_keepalive_timeout_s"],
        affinity=cfg["gateway_affinity"], hash_balance_factor=cfg["gateway_hash_balance_factor"], model_alias=cfg["server_model_alias"],
        errorfile=ERRORFILE)
    files.put(name="503 page: no free slot (Retry-After)", src=StringIO(gw.busy_page(cfg["gateway_retry_after_s"])),
              dest=ERRORFILE, mode="644")
    installed(name="Validate (haproxy -c), then install and reload", staged=STAGED, live=LIVE, staged_op=staged)
    systemd.service(name="HAProxy running and enabled", service="haproxy", running=True, enabled=True)
