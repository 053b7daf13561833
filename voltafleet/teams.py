"""Teams at the gateway: a key per team, limits per team, usage per team (issue 30).

group_vars hold each team's name and the sha256 of its key(s), never a key. The gateway
role renders two HAProxy maps from them, which HAProxy reads at start and which a run
replaces atomically in the running process through the runtime API (prepare/add/commit
map), so an added, rotated or revoked key takes effect on the next request, without a
reload and without touching a server:

- KEYS_MAP: sha256 of a key (hex) -> team name; the gateway hashes the request's Bearer
  token (sha2(256)) and looks it up; no team: 401 at the gateway.
- LIMITS_MAP: team -> "<concurrent> <per_minute>"; a stick table keyed by the team counts its
  requests in flight (conn_cur of the tracked request) and per minute (http_req_rate(60s));
  over either: 429 with Retry-After.

A team's concurrent limit is the smallest of its max_concurrent (or the fleet default) and
its slot_share of the fleet's slots, so a batch team given 0.5 never holds more than half.

    >>> t = parse([{"name": "search", "key_sha256": "a" * 64, "slot_share": 0.5}], "f.yml", "gateway_teams")
    >>> limits(t, default_concurrent=64, default_per_minute=600, fleet_slots=24)["search"]
    (12, 600)
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from voltafleet.errors import Problem

KEYS_MAP = "/etc/haproxy/voltafleet-team-keys.map"
LIMITS_MAP = "/etc/haproxy/voltafleet-team-limits.map"
UPSTREAM_MAP = "/etc/haproxy/voltafleet-upstream.map"  # the servers' one key, for the gateway alone
USAGE_LUA = "/etc/haproxy/voltafleet-teams.lua"
TABLE = "vf_teams"  # the stick table's backend
METRICS_PATH = "/metrics/teams"
NO_TEAM = "-"  # usage of requests without a known key (answered 401 at the gateway)

NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
FIELDS = {"name", "key_sha256", "max_concurrent", "requests_per_minute", "slot_share"}


@dataclass(frozen=True)
class Team:
    name: str
    keys: tuple[str, ...]
    max_concurrent: int | None = None
    requests_per_minute: int | None = None
    slot_share: float | None = None


def problems(teams, source: str | None, key: str = "gateway_teams") -> list[Problem]:
    """What is wrong with the gateway_teams value, each naming the file, the key and the fix."""
    out: list[Problem] = []

    def bad(what: str, fix: str) -> None:
        out.append(Problem(what, fix, source, key))

    if not isinstance(teams, list):
        bad(f"is {teams!r}, not a list", "give a list of teams: [{name: ..., key_sha256: ...}]")
        return out
    names, hashes = set(), set()
    for i, t in enumerate(teams):
        where = f"team {i + 1}"
        if not isinstance(t, dict):
            bad(f"{where} is {t!r}, not a mapping", "give each team as {name: ..., key_sha256: ...}")
            continue
        if "key" in t or "api_key" in t:
            bad(f"{where} ({t.get('name', '?')}) holds a key in plain text",
                "keep only its sha256 (key_sha256: the output of `printf %s \"$KEY\" | sha256sum`) and "
                "give the key to the team another way; rotate this key, it was in a file")
            continue
        extra = sorted(set(t) - FIELDS)
        if extra:
            bad(f"{where} has the unknown field {extra[0]!r}", "use only " + ", ".join(sorted(FIELDS)))
        name = t.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            bad(f"{where} has the name {name!r}", "give a name of lowercase letters, digits, _ or - (up to 32)")
        elif name in names:
            bad(f"{where}: the name {name!r} is used twice", "give each team its own name")
        else:
            names.add(name)
        keys = t.get("key_sha256")
        keys = [keys] if isinstance(keys, str) else keys
        if not isinstance(keys, list) or not keys:
            bad(f"{where} ({name}) has no key_sha256",
                "give the sha256 of its key (a list of two while rotating): printf %s \"$KEY\" | sha256sum")
            continue
        for h in keys:
            if not isinstance(h, str) or not HEX64.fullmatch(h):
                bad(f"{where} ({name}) has the key_sha256 {h!r}", "give 64 lowercase hex digits (sha256sum's output)")
            elif h in hashes:
                bad(f"{where} ({name}): its key_sha256 {h[:12]}... belongs to another team too",
                    "give each team a key of its own")
            else:
                hashes.add(h)
        for f in ("max_concurrent", "requests_per_minute"):
            v = t.get(f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1_000_000):
                bad(f"{where} ({name}) has {f}: {v!r}", "give a whole number from 1 to 1000000, or leave it out "
                    "for the fleet default")
        share = t.get("slot_share")
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float))
                                  or not 0 < share <= 1):
            bad(f"{where} ({name}) has slot_share: {share!r}", "give a share of the fleet's slots above 0 and "
                "at most 1 (0.5: half), or leave it out")
    return out


def parse(teams, source: str | None = None, key: str = "gateway_teams") -> list[Team]:
    found = problems(teams, source, key)
    if found:
        raise ValueError("; ".join(p.what for p in found))
    return [Team(t["name"], tuple([t["key_sha256"]] if isinstance(t["key_sha256"], str) else t["key_sha256"]),
                 t.get("max_concurrent"), t.get("requests_per_minute"), t.get("slot_share")) for t in teams]


def limits(teams: list[Team], default_concurrent: int, default_per_minute: int,
           fleet_slots: int | None) -> dict[str, tuple[int, int]]:
    """{team: (concurrent requests, requests per minute)}: a slot share caps the concurrent
    limit at that share of the fleet's slots (at least 1); unknown slots leave it uncapped."""
    out = {}
    for t in teams:
        conc = t.max_concurrent or default_concurrent
        if t.slot_share is not None and fleet_slots:
            conc = min(conc, max(1, int(t.slot_share * fleet_slots)))
        out[t.name] = (conc, t.requests_per_minute or default_per_minute)
    return out


def keys_map(teams: list[Team]) -> str:
    """KEYS_MAP's text: one `<sha256> <team>` line a key, sorted (a stable file)."""
    return "".join(f"{h} {t.name}\n" for t in sorted(teams, key=lambda t: t.name) for h in sorted(t.keys))


def limits_map(lim: dict[str, tuple[int, int]]) -> str:
    return "".join(f"{name} {c} {r}\n" for name, (c, r) in sorted(lim.items()))


def upstream_map(key: str | None) -> str:
    """UPSTREAM_MAP's text: the Authorization value the gateway sends the servers (their one
    key), or nothing when the servers take no key (the header is then removed)."""
    return f"upstream Bearer {key}\n" if key else ""


def runtime_replace(path: str, socket: str | None = None) -> str:
    """A shell script that brings the running HAProxy's copy of the map at `path` to the file's
    current content through the admin socket: first every new entry (`add map`) and changed
    value (`set map`), then every entry the file no longer has (`del map`), so a rotated key's
    successor is valid before its predecessor goes. Each command takes effect at once; the
    entries go through stdin, never argv (the upstream map holds a key). Nothing happens when
    the running process does not use that map (a reload loads it). HAProxy 2.6's versioned
    swap (prepare/commit map) left a committed key unfound for a while under load in the lab
    (about 1 run in 3), so it is not used."""
    from voltafleet.gateway import ADMIN_SOCKET, admin

    if not re.fullmatch(r"/[A-Za-z0-9._/-]+", path):
        raise ValueError(f"unexpected characters in map path {path!r}")
    sock = admin(socket or ADMIN_SOCKET)
    diff = ("awk -v m=" + path + " '$1 == \"L\" { k = $2; $1 = \"\"; $2 = \"\"; sub(/^ +/, \"\"); live[k] = $0; next }"
            " $1 == \"F\" && NF >= 3 { k = $2; $1 = \"\"; $2 = \"\"; sub(/^ +/, \"\"); want[k] = $0 }"
            " END { for (k in want) if (!(k in live)) print \"add map \" m \" \" k \" \" want[k];"
            " else if (live[k] != want[k]) print \"set map \" m \" \" k \" \" want[k];"
            " for (k in live) if (!(k in want)) print \"del map \" m \" \" k }'")
    return (f"if echo 'show map' | {sock} | grep -qF '({path})'; then "
            f"out=$({{ echo 'show map {path}' | {sock} | sed -n 's/^0x[0-9a-f]* /L /p'; sed 's/^/F /' {path}; }} "
            f"| {diff} | tr '\\n' ';' | {sock}); "
            f"if printf '%s' \"$out\" | grep -q '[A-Za-z]'; then echo \"voltafleet: HAProxy refused {path}: $out\" >&2; exit 1; fi; fi")
