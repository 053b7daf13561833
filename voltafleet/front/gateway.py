"""The gateway's backends and runtime commands (HAProxy), decided from the inventory.

Every llama-server instance of every server host is a backend server named `<host>-<index>`,
in its tier's HAProxy backend (voltafleet/front/tiers.py: `llama` for throughput); the rolling
rollout drains one through HAProxy's runtime API before restarting it and sets it ready again
once its host's smoke test passed.

    >>> backend_name("gpu-01.fleet.internal", 3)
    'gpu-01.fleet.internal-3'
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from voltafleet.inputs.settings import Settings
from voltafleet.front import budgets, routes, teams, tiers
from voltafleet.front.haproxy_cli import ADMIN_SOCKET, admin, runtime  # noqa: F401 (the gateway's API, used by the roles)

BACKEND = tiers.BACKEND  # the throughput tier's; another tier's is tiers.backend(tier)
STATE_FILE = "/var/lib/haproxy/server-state"
ERRORFILE = "/etc/haproxy/voltafleet-503.http"  # the busy answer (busy_page)


@dataclass(frozen=True)
class Backend:
    name: str
    address: str
    port: int
    slots: int = 0       # the instance's -np: HAProxy sends it no more concurrent requests (0: no cap)
    tier: str = tiers.DEFAULT  # its host's server_tier: the HAProxy backend it is in


def backend_host(host: str) -> str:
    """A host's part of its instances' HAProxy server names (backend_name: "<it>-<index>")."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", host)


def backend_name(host: str, index: int) -> str:
    return f"{backend_host(host)}-{index}"


def is_backend_of(name: str, host: str) -> bool:
    """The HAProxy server `name` is one of `host`'s instances (backend_name(host, some index))."""
    prefix = backend_host(host) + "-"
    return name.startswith(prefix) and name[len(prefix):].isdigit()


def backends(servers: list[tuple]) -> list[Backend]:
    """servers: (host name, address the gateway reaches it at, its instance ports[, slots[, tier]])."""
    out = []
    for name, address, ports, *rest in servers:
        slots = int(rest[0] or 0) if rest else 0
        tier = rest[1] if len(rest) > 1 and rest[1] else tiers.DEFAULT
        for index, port in enumerate(ports):
            out.append(Backend(backend_name(name, index), address, port, slots, tier))
    return out


def set_state(host: str, index: int, state: str, backend: str = BACKEND) -> str:
    """The runtime command that sets an instance's state in its tier's backend (server_backend
    finds it in `show stat`)."""
    if state not in ("ready", "drain", "maint"):
        raise ValueError(state)
    if tiers.tier_of_backend(backend) is None:
        raise ValueError(backend)
    return runtime(f"set server {backend}/{backend_name(host, index)} state {state}")


def server_rows(stat_csv: str) -> dict[str, dict[str, str]]:
    """{server: its `show stat` row by column name} of every tier's backend's servers (whole rows
    only; a server's backend is its row's `pxname`)."""
    lines = stat_csv.splitlines()
    if not lines or not lines[0].startswith("# "):
        return {}
    cols = lines[0][2:].split(",")
    rows = (line.split(",") for line in lines[1:])
    return {row[1]: dict(zip(cols, row)) for row in rows
            if len(row) >= len(cols) - 1 and tiers.tier_of_backend(row[0]) is not None
            and row[1] not in ("FRONTEND", "BACKEND")}


def server_backend(stat_csv: str, server: str) -> str | None:
    """The backend (a tier's) that lists a server in `show stat` output, None if none does."""
    row = server_rows(stat_csv).get(server)
    return row.get("pxname") if row is not None else None


def current_sessions(stat_csv: str, server: str) -> int | None:
    """scur of one server from `show stat` CSV output (None if it is not listed)."""
    row = server_rows(stat_csv).get(server)
    return int(row.get("scur") or 0) if row is not None else None


def server_states(stat_csv: str) -> dict[str, str]:
    """{server: status} (UP, DOWN, DRAIN, MAINT, ...) of every tier's backend, from `show stat`."""
    return {name: row["status"] for name, row in server_rows(stat_csv).items() if "status" in row}


SERVER_LINE = re.compile(r"^\s*server\s+(\S+)\s+(\S+):(\d+)\b(?:.*\bmaxconn\s+(\d+))?")


def configured_servers(config_text: str) -> list[tuple[str, str, int, int, str]]:
    """[(name, address, port, maxconn, tier)] of every tier's backend's `server` lines in an
    HAProxy configuration."""
    out, tier = [], None
    for line in config_text.splitlines():
        if re.match(r"^\S", line):
            words = line.split()
            tier = tiers.tier_of_backend(words[1]) if len(words) > 1 and words[0] == "backend" else None
            continue
        m = SERVER_LINE.match(line)
        if tier and m:
            out.append((m.group(1), m.group(2), int(m.group(3)), int(m.group(4) or 0), tier))
    return out


def fleet_backends(planned: list[tuple], unplanned: list[str], live: list[tuple]) -> list[Backend]:
    """The gateway's backends: every planned server host's instances, and for a host of the
    inventory whose instances this run does not know (unreachable, or left out by --limit),
    the backends the live configuration already has for it: it never vanishes from the
    gateway because it was not in a run."""
    out = backends(planned)
    for name in unplanned:
        out += [Backend(n, a, p, c, *t) for n, a, p, c, *t in live if is_backend_of(n, name)]
    return out


def busy_page(retry_after_s: int, tier: str | None = None) -> str:
    """HAProxy's raw 503 answer when no instance has a free slot within the queue timeout:
    fast, with Retry-After, and never forwarded to a llama-server. `tier`: a tier's own page (its
    servers busy or none up, and its team does not overflow), naming the tier."""
    who, code = ("the fleet", "fleet_busy") if tier is None else (f"the {tier} tier", "tier_busy")
    body = json.dumps(openai_error(f"every instance of {who} is busy: retry after {int(retry_after_s)} s",
                                   "server_error", code)) + "\n"
    return ("HTTP/1.1 503 Service Unavailable\r\n"
            "Content-Type: application/json\r\n"
            f"Retry-After: {int(retry_after_s)}\r\n"
            "Cache-Control: no-cache\r\n"
            f"Content-Length: {len(body)}\r\n"
            "\r\n" + body)


def openai_error(message: str, kind: str, code: str, param: str | None = None) -> dict:
    """The body of an error the gateway answers itself, shaped as OpenAI's API shapes its
    own (the SDKs read error.message, .type, .param and .code)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def haproxy_string(body: dict) -> str:
    """A JSON body for `http-request return ... string '<body>'` (no single quote inside)."""
    text = json.dumps(body, separators=(",", ":"))
    if "'" in text:
        raise ValueError(f"a single quote in a gateway answer: {text}")
    return text


def teams_vars(cfg: Settings, backends: list[Backend]) -> dict | None:
    """The template's `teams` block (None: no team keys; the client's Authorization goes through)."""
    team_list = teams.parse(cfg.gateway.teams)
    if not team_list:
        return None
    retry = cfg.gateway.team_retry_after_s
    served = tiers.ordered({b.tier for b in backends})
    return {
        "lua": teams.USAGE_LUA, "usage_filter": teams.USAGE_FILTER, "keys_map": teams.KEYS_MAP, "limits_map": teams.LIMITS_MAP,
        "upstream_map": teams.UPSTREAM_MAP, "upstream_key": bool(cfg.server.api_key_file),
        "table": teams.TABLE, "metrics_path": teams.METRICS_PATH, "retry_after_s": retry,
        "budgets_map": teams.BUDGETS_MAP, "budget_dir": budgets.DIR, "tiers_map": teams.TIERS_MAP,
        "tier_header": tiers.HEADER.lower(), "tier_names": " ".join(served),
        "unknown_tier": haproxy_string(openai_error(
            f"The header {tiers.HEADER} names a tier this fleet does not serve: it serves {', '.join(served)}",
            "invalid_request_error", "tier_not_found")),
        # the team's name and its tiers come from the map at request time (names of [a-z0-9_-] only)
        "tier_not_allowed": haproxy_string(openai_error(
            f"Your team %[var(txn.team)] may not use the tier named in {tiers.HEADER}: its tiers are "
            "%[var(txn.tiers_allowed)]", "invalid_request_error", "tier_not_allowed")),
        "unauthorized": haproxy_string(openai_error(
            "Incorrect API key provided: the gateway knows no team with this key", "invalid_request_error",
            "invalid_api_key")),
        "over_concurrent": haproxy_string(openai_error(
            f"Your team has reached its limit of requests in flight: retry after {retry} s", "requests",
            "rate_limit_exceeded")),
        "over_rate": haproxy_string(openai_error(
            f"Your team has reached its limit of requests per minute: retry after {retry} s", "requests",
            "rate_limit_exceeded")),
        "response_fields": haproxy_string(openai_error(
            "response_fields is not accepted at this gateway: it would hide tokens_evaluated and tokens_predicted, "
            "which the usage and token budget of your team count; send the request without it and pick the fields "
            "from the whole answer", "invalid_request_error", "unsupported_parameter", "response_fields")),
    }


def tier_backends(backends: list[Backend], errorfile: str = ERRORFILE) -> list[dict]:
    """One HAProxy backend a tier served, throughput's (`llama`) always and first: its name, its
    servers and its 503 page."""
    return [{"name": t, "backend": tiers.backend(t), "servers": [b for b in backends if b.tier == t],
             "errorfile": tiers.errorfile(t, errorfile)} for t in tiers.ordered({b.tier for b in backends})]


def template_vars(cfg: Settings, backends: list[Backend], pair: dict | None = None) -> dict:
    """Everything templates/haproxy.cfg.j2 reads, from the gateway host's variables; `pair`: this
    gateway's part of the gateway pair (voltafleet/front/pair.py Pair.haproxy_vars), None for one gateway."""
    return dict(
        backends=backends, tiers=tier_backends(backends), bind=cfg.gateway.bind, metrics_bind=cfg.gateway.metrics_bind,
        stream_timeout_s=cfg.gateway.stream_timeout_s, check_interval_ms=cfg.gateway.check_interval_ms,
        maxconn=cfg.gateway.maxconn, admin_socket=ADMIN_SOCKET, state_file=STATE_FILE,
        queue_timeout_s=cfg.gateway.queue_timeout_s, keepalive_timeout_s=cfg.gateway.keepalive_timeout_s,
        affinity=cfg.gateway.affinity, hash_balance_factor=cfg.gateway.hash_balance_factor,
        model_alias=cfg.server.model_alias, errorfile=ERRORFILE, teams=teams_vars(cfg, backends),
        routes=routes_vars(), pair=pair)


def routes_vars() -> dict:
    """The template's `routes` block: the team routes HAProxy lets through (METHOD:/path), its own 404 for any
    other, its 503 when a check or the counting failed (voltafleet/front/routes.py)."""
    return {"allowed": " ".join(routes.allowed()), "retry_after_s": 1,
            "not_found": haproxy_string(openai_error(routes.NOT_FOUND, "invalid_request_error", "route_not_found")),
            "gateway_error": haproxy_string(openai_error(routes.GATEWAY_ERROR, "server_error", "gateway_error"))}
