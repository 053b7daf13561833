"""Gateway: one endpoint for the fleet, HAProxy from the distribution.

Every llama-server instance of the fleet's server hosts is a backend, health-checked on
/health (a loading server answers 503 and stays out of rotation), least-connections,
stream-friendly timeouts, the client's Authorization header passed through, HAProxy's
Prometheus exporter on. A new configuration is validated with `haproxy -c` before it
replaces the running one, then reloaded without dropping connections; an invalid one
leaves the running gateway untouched.

With gateway_teams, the gateway checks a key per team (the sha256 of the Bearer token in a
map), limits each team (requests in flight, per minute: 429 with Retry-After), counts its
usage (/metrics/teams on the metrics bind), refuses a team over its token budget (per UTC
day and month, counted in files that survive reloads: voltafleet/front/budgets.py), and sends the
servers their own key instead
(voltafleet/front/teams.py). A key or limit change brings the maps of the running process to
the files, then reads them back (a mismatch fails the run): no reload, no server touched.

The rolling rollout drains instances through the runtime API (roles/gateway_api: drain, ready).
"""
from __future__ import annotations

import shlex
from io import StringIO
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import FactBase, FunctionCommand, deploy, operation
from pyinfra.facts.files import Sha1File
from pyinfra.operations import apt, files, systemd

from roles.factcache import host_fact, model_header

from roles.gateway_api import fleet_pair, is_server, server_address

from roles.run import ConfigRefused, changes, config, fleet_plan, host_config, sources
from roles.shell import sh
from roles.facts import Gpus, HAProxyBackends
from voltafleet.front import gateway as gw
from voltafleet.ground.errors import format_errors
from voltafleet.front import budgets, teams, tiers
from voltafleet.planning import hostplan

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "haproxy.cfg.j2"
LIVE = "/etc/haproxy/haproxy.cfg"
STAGED = "/etc/haproxy/haproxy.cfg.voltafleet"
ERRORFILE = gw.ERRORFILE
USAGE_LUA_SRC = Path(__file__).resolve().parent / "files" / "voltafleet-teams.lua"


def server_backends(state) -> list[gw.Backend]:
    """Every llama-server instance of the fleet as HAProxy backends: from the fleet plan in a
    rollout (decided once, every server host of the inventory); in a plain run from each
    server host's variables and GPUs, and for a server host this run cannot reach (or
    leaves out) the backends the live configuration already has for it."""
    plan = fleet_plan()
    if plan is not None:
        return gw.backends([(s.host, s.address, list(s.ports), s.slots, s.tier) for s in plan.servers])
    planned, unplanned = [], []
    for h in state.inventory:
        if not is_server(h):  # a gateway or a model mirror
            continue
        if h not in state.active_hosts:
            unplanned.append(h.name)
            continue
        cfg = host_config(h)
        gpus = host_fact(h, Gpus) if cfg.preflight.backend == "cuda" else []
        # slots: the instance's -np as its host plan decides it (the VRAM plan's on a CUDA host)
        slots, _, _ = hostplan.decided_slots_ctx(cfg, gpus, model_header(cfg.model.url) if gpus else None)
        planned.append((h.name, server_address(h), [i.port for i in hostplan.instances(cfg, gpus)], slots,
                        cfg.server.tier))
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


class RunningMap(FactBase):
    """The running HAProxy's copy of the map at `path`: its `show map` output, or None when the
    running process does not use that map (or does not run)."""

    def command(self, path: str) -> str:
        return teams.show_running(path)

    def process(self, output):
        return teams.running_copy("\n".join(output) + "\n")


def matches_running(state, host, path: str) -> bool:
    """Read the map at `path` back from the running HAProxy and compare it with the file: a
    mismatch fails the host, naming the gateway and the map."""
    ok, out = sh(host, teams.readback(path))
    problem = teams.check_running(path, out.stdout + "\n") if ok else \
        f"the running HAProxy's map {path} could not be read back ({out.stderr.strip()[:200] or 'no output'})"
    if problem:
        host.log_styled(f"gateway {host.name}: {problem}. Fix: run the gateway again; `systemctl reload haproxy` "
                        "loads the files as they are", fg="red", log_func=logger.error)
    return not problem


@operation()
def maps_live(paths: list[str], texts: list[str]):
    """Bring each map the running HAProxy holds to its file's new content through the runtime
    API, without a reload, when its running copy differs (a changed file, or a copy an earlier
    run left incomplete); then read it back and compare it with the file: a mismatch fails the
    run. A map the running process does not use is left to the reload that loads it.

    .. code:: python

        gateway.maps_live(paths=[teams.LIMITS_MAP, teams.KEYS_MAP], texts=[limits_text, keys_text])
    """
    for path, text in zip(paths, texts):
        running = host.get_fact(RunningMap, path=path)
        if running is not None and teams.map_mismatch(path, text, running):
            yield teams.runtime_replace(path)
            yield FunctionCommand(matches_running, (path,), {})


def team_maps(cfg: dict, backends: list[gw.Backend]) -> None:
    """The teams' maps (limits and budgets first: a new key's team always finds them), the usage
    script and the folder where HAProxy's worker keeps the budgets' counts (its own: user
    haproxy, 0750; kept when teams go, so the month's counts return with them); each map 0640,
    HAProxy's group. Without teams, the maps and the script are removed."""
    team_list = teams.parse(cfg.gateway.teams)
    paths = [teams.LIMITS_MAP, teams.BUDGETS_MAP, teams.TIERS_MAP, teams.KEYS_MAP, teams.UPSTREAM_MAP]
    if not team_list:
        for path in paths + [teams.USAGE_LUA]:
            files.file(name=f"No team file {path}", path=path, present=False)
        return
    slots = sum(b.slots for b in backends) if backends and all(b.slots for b in backends) else None
    lim = teams.limits(team_list, cfg.gateway.team_max_concurrent, cfg.gateway.team_requests_per_minute, slots)
    key = Path(cfg.server.api_key_file).read_text().strip() if cfg.server.api_key_file else None
    texts = [teams.limits_map(lim), teams.budgets_map(team_list), tiers.tiers_map(team_list, cfg.gateway.tier_overflow),
             teams.keys_map(team_list), teams.upstream_map(key)]
    budgeted = sum(1 for t in team_list if t.tokens_per_day or t.tokens_per_month)
    what = [f"Team limits ({len(lim)} teams)", f"Team token budgets ({budgeted} teams)",
            f"Team tiers ({sum(t.tier != tiers.DEFAULT for t in team_list)} teams off {tiers.DEFAULT})",
            f"Team keys ({sum(len(t.keys) for t in team_list)} sha256)", "The servers' key, for the gateway alone"]
    for w, t, path in zip(what, texts, paths):
        files.put(name=w, src=StringIO(t), dest=path, mode="640", user="root", group="haproxy")
    files.put(name="Usage per team (Lua)", src=str(USAGE_LUA_SRC), dest=teams.USAGE_LUA, mode="644")
    files.directory(name="Token budgets' counts (HAProxy's worker writes them)", path=budgets.DIR, user="haproxy",
                    group="haproxy", mode="750")
    maps_live(name="Team maps brought to the running gateway, read back", paths=paths, texts=texts)


def tier_check(cfg: dict, backends: list[gw.Backend]) -> None:
    """Every tier a team is sent to or may ask for has servers, else the run stops before the
    gateway changes (the inventory loader refuses it first; this covers pyinfra --data); a tier
    no team uses is only a warning (its servers would get no request: a tier being set up)."""
    team_list = teams.parse(cfg.gateway.teams)
    served: dict[str, int] = {}
    for b in backends:
        served[b.tier] = served.get(b.tier, 0) + 1
    problems = tiers.fleet_problems(team_list, served, sources().get("gateway_teams"))
    if problems:
        raise ConfigRefused(format_errors(host.name, problems, "configuration refused"))
    used = {tiers.DEFAULT} if not team_list else {n for t in team_list for n in (t.tier, *t.tiers)}
    for name in sorted(set(served) - used):
        logger.warning(f"gateway {host.name}: no team of gateway_teams uses the {name} tier: its {served[name]} "
                       f"instance(s) get no request (give a team tier: {name})")


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
    tier_check(cfg, backends)
    pair = fleet_pair(host.state)  # two gateways or more: one address, one table of limits, budgets counted across

    team_maps(cfg, backends)
    staged = files.template(
        name=f"HAProxy configuration ({len(backends)} backends, staged)", src=str(TEMPLATE), dest=STAGED,
        mode="644", jinja_env_kwargs={"trim_blocks": True, "lstrip_blocks": True}, **gw.template_vars(cfg, backends, pair.haproxy_vars(host.name) if pair else None))
    files.put(name="503 page: no free slot (Retry-After)", src=StringIO(gw.busy_page(cfg.gateway.retry_after_s)),
              dest=ERRORFILE, mode="644")
    for t in gw.tier_backends(backends)[1:]:
        files.put(name=f"503 page of the {t['name']} tier", src=StringIO(gw.busy_page(cfg.gateway.retry_after_s, t["name"])),
                  dest=t["errorfile"], mode="644")
    installed(name="Validate (haproxy -c), then install and reload", staged=STAGED, live=LIVE, staged_op=staged)
    systemd.service(name="HAProxy running and enabled", service="haproxy", running=True, enabled=True)
