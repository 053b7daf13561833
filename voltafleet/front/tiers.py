"""Tiers (issue 41): a tier is a group of server hosts the gateway serves as one HAProxy backend.

Each server host's group sets `server_tier` (default `throughput`): a `latency` group of 1-2
slots with MTP speculation is a tier of its own, with its own VRAM and host-memory plans (they
are a host's, from its group's variables). The gateway makes one backend per tier served:
`llama` for `throughput` (the fleet's backend as it always was: dashboards, alerts, drains),
`llama_<tier>` for any other. Server names (`<host>-<index>`) stay unique across tiers, so a
drain finds an instance in whichever backend lists it.

A team's requests go to its tier (`gateway_teams[].tier`, default throughput); a request may
name another with the header X-Voltafleet-Tier if the team's `tiers` list it (else 403; a tier
the fleet does not serve: 400). When a tier other than throughput has no free slot (every
usable server at its maxconn, or none usable), the request overflows to throughput at once or
waits in its tier's queue (gateway_queue_timeout_s) and gets the tier's 503 with Retry-After:
the team's `overflow` (default gateway_tier_overflow).

A tier is a host's, not a GPU's: a host's instances share one set of variables, one VRAM plan
and one host-memory plan (voltafleet/planning/hostplan.py), so one host cannot serve a latency GPU beside
throughput GPUs (docs/gateway.md, "A latency tier for a team").

    >>> backend("throughput"), backend("latency")
    ('llama', 'llama_latency')
    >>> tier_of_backend("llama_latency"), tier_of_backend("vf_teams")
    ('latency', None)
"""
from __future__ import annotations

from voltafleet.ground.errors import Problem
from voltafleet.inputs.teamvars import TIER_DEFAULT as DEFAULT, TIER_NAME as NAME  # the settings' names
from voltafleet.models.mirror import GROUP as MIRROR_GROUP

BACKEND = "llama"  # the throughput tier's backend (the fleet's one backend before tiers)
HEADER = "X-Voltafleet-Tier"
GATEWAY_GROUP = "gateway"  # the inventory group whose hosts run HAProxy, not llama-server


def runs_llama_server(groups) -> bool:
    """A host of these inventory groups is a server host: in neither the gateway group nor the
    mirror group (roles/gateway_api.is_server, rollout's Fleet.servers)."""
    return GATEWAY_GROUP not in groups and MIRROR_GROUP not in groups


def backend(tier: str) -> str:
    """The HAProxy backend of a tier."""
    return BACKEND if tier == DEFAULT else f"{BACKEND}_{tier}"


def tier_of_backend(name: str) -> str | None:
    """The tier whose backend is `name`, None for any other proxy (the teams' table, stats)."""
    if name == BACKEND:
        return DEFAULT
    if name.startswith(BACKEND + "_") and NAME.fullmatch(name[len(BACKEND) + 1:]):
        return name[len(BACKEND) + 1:]
    return None


def ordered(served) -> list[str]:
    """The tiers served, throughput first (it always has a backend: the default), then by name."""
    return [DEFAULT] + sorted(set(served) - {DEFAULT})


def errorfile(tier: str, default: str) -> str:
    """Where a tier's 503 page lives beside the fleet's (`default`: /etc/haproxy/voltafleet-503.http)."""
    return default if tier == DEFAULT else default.replace(".http", f"-{tier}.http")


def tiers_map(team_list, default_overflow: str) -> str:
    """TIERS_MAP's text (voltafleet/front/teams.py): for each team `<team> <tier> <tiers,...> <overflow>`
    (its default tier, the tiers it may ask for, and what a request does when its tier is full),
    and `<team>/<tier> 1` for each tier it may ask for by header (HAProxy looks the pair up)."""
    lines = []
    for t in sorted(team_list, key=lambda t: t.name):
        allowed = list(t.tiers or (t.tier,))
        lines.append(f"{t.name} {t.tier} {','.join(allowed)} {t.overflow or default_overflow}\n")
        lines += [f"{t.name}/{name} 1\n" for name in sorted(allowed)]
    return "".join(lines)


def fleet_problems(team_list, served: dict[str, int], source: str | None = None,
                   key: str = "gateway_teams") -> list[Problem]:
    """Every tier a team is sent to or may ask for must have servers (served: {tier: instances
    or hosts}); without teams every request goes to throughput, which then must have them. No
    server known (a gateway set up before its servers): nothing to check."""
    out = []
    if not served:
        return out
    have = ", ".join(f"{t} ({n})" for t, n in sorted(served.items())) or "none"
    fix_tail = (f"put server hosts in a group whose server_tier is that tier (servers per tier now: {have}), "
                "or change the team's tier/tiers")
    if not team_list and served and DEFAULT not in served:
        out.append(Problem(f"is empty, so every request goes to the {DEFAULT} tier, and no server host serves it "
                           f"(tiers served: {have})", f"give teams a tier (gateway_teams[].tier), or give a group "
                           f"server_tier: {DEFAULT}", source, key))
    for t in team_list:
        for name in dict.fromkeys([t.tier, *(t.tiers or ())]):
            if name not in served:
                what = "is sent to" if name == t.tier else "may ask for"
                out.append(Problem(f"team {t.name} {what} the tier {name}, which no server host serves", fix_tail,
                                   source, key))
    return out


def served_tiers(hosts) -> dict[str, int]:
    """{tier: server hosts} of [(host, its variables, its groups)]: hosts of neither the gateway
    nor the mirror group (runs_llama_server)."""
    out: dict[str, int] = {}
    for _, values, groups in hosts:
        if not runs_llama_server(groups):
            continue
        out[values["server_tier"]] = out.get(values["server_tier"], 0) + 1
    return out

