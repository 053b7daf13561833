"""Teams at the gateway: a key per team, limits per team, usage per team (issue 30).

group_vars hold each team's name and the sha256 of its key(s), never a key. The gateway
role renders two HAProxy maps from them, which HAProxy reads at start and which a run
brings the running process to through the runtime API (add, set, del map; values with
spaces escaped, read back and compared with the file), so an added, rotated or revoked key
and a changed limit take effect on the next request, without a reload and without touching
a server:

- KEYS_MAP: sha256 of a key (hex) -> team name; the gateway hashes the request's Bearer
  token (sha2(256)) and looks it up; no team: 401 at the gateway.
- LIMITS_MAP: team -> "<concurrent> <per_minute>"; a stick table keyed by the team counts its
  requests in flight (conn_cur of the tracked request) and per minute (http_req_rate(60s));
  over either: 429 with Retry-After.
- BUDGETS_MAP: team -> "<tokens per UTC day> <tokens per UTC month>" (0: none), only teams
  with a budget; voltafleet/front/budgets.py says how they are counted, kept and enforced.
- TIERS_MAP: team -> "<tier> <tiers it may ask for> <overflow>", and "<team>/<tier>" for each
  tier it may ask for (X-Voltafleet-Tier); voltafleet/front/tiers.py says how requests are routed.

A team's concurrent limit is the smallest of its max_concurrent (or the fleet default) and
its slot_share of the fleet's slots, so a batch team given 0.5 never holds more than half.

    >>> t = parse([{"name": "search", "key_sha256": "a" * 64, "slot_share": 0.5}], "f.yml", "gateway_teams")
    >>> limits(t, default_concurrent=64, default_per_minute=600, fleet_slots=24)["search"]
    (12, 600)
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from voltafleet.front import tiers as tiermod
from voltafleet.inputs.teamvars import team_problems  # the settings' check
from voltafleet.front.haproxy_cli import ADMIN_SOCKET, admin

KEYS_MAP = "/etc/haproxy/voltafleet-team-keys.map"
LIMITS_MAP = "/etc/haproxy/voltafleet-team-limits.map"
BUDGETS_MAP = "/etc/haproxy/voltafleet-team-budgets.map"  # tokens per day and month (issue 39)
TIERS_MAP = "/etc/haproxy/voltafleet-team-tiers.map"  # each team's tier, the tiers it may ask for (issue 41)
UPSTREAM_MAP = "/etc/haproxy/voltafleet-upstream.map"  # the servers' one key, for the gateway alone
USAGE_LUA = "/etc/haproxy/voltafleet-teams.lua"
USAGE_FILTER = "vf_usage"  # the Lua filter in USAGE_LUA that reads each answer's token figures
TABLE = "vf_teams"  # the stick table's backend
METRICS_PATH = "/metrics/teams"
NO_TEAM = "-"  # usage of requests without a known key (answered 401 at the gateway)



@dataclass(frozen=True)
class Team:
    name: str
    keys: tuple[str, ...]
    max_concurrent: int | None = None
    requests_per_minute: int | None = None
    slot_share: float | None = None
    tokens_per_day: int | None = None  # prompt + completion tokens a UTC day (None: no budget)
    tokens_per_month: int | None = None  # prompt + completion tokens a UTC calendar month
    tier: str = tiermod.DEFAULT  # the tier its requests go to (voltafleet/front/tiers.py)
    tiers: tuple[str, ...] = ()  # the tiers it may ask for by header (empty: its tier alone)
    overflow: str | None = None  # its tier full: "throughput" or "refuse" (None: gateway_tier_overflow)


def parse(teams, source: str | None = None, key: str = "gateway_teams") -> list[Team]:
    found = team_problems(teams, source, key)
    if found:
        raise ValueError("; ".join(p.what for p in found))
    return [Team(t["name"], tuple([t["key_sha256"]] if isinstance(t["key_sha256"], str) else t["key_sha256"]),
                 t.get("max_concurrent"), t.get("requests_per_minute"), t.get("slot_share"), t.get("tokens_per_day"),
                 t.get("tokens_per_month"), t.get("tier", tiermod.DEFAULT), tuple(t.get("tiers") or ()),
                 t.get("overflow")) for t in teams]


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


def budgets_map(teams: list[Team]) -> str:
    """BUDGETS_MAP's text: `<team> <tokens per day> <tokens per month>` (0: no budget for that
    period) for each team with a budget, sorted; a team without one has no line (never refused)."""
    return "".join(f"{t.name} {t.tokens_per_day or 0} {t.tokens_per_month or 0}\n"
                   for t in sorted(teams, key=lambda t: t.name) if t.tokens_per_day or t.tokens_per_month)


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
    (about 1 run in 3), so it is not used.

    The CLI splits a command into words and `set map`/`add map` keep only the word after the
    key, so each space, tab, `;` and backslash of a key or value is escaped with a backslash
    (HAProxy's CLI unescapes it): "64 3" and "Bearer KEY" arrive whole. check_running reads
    the result back."""
    _check_path(path)
    sock = admin(socket or ADMIN_SOCKET)
    diff = ("awk -v m=" + path + " 'function esc(s,  o, i, c) { o = \"\"; for (i = 1; i <= length(s); i++)"
            " { c = substr(s, i, 1); if (c == \" \" || c == \"\\t\" || c == \";\" || c == \"\\\\\") o = o \"\\\\\";"
            " o = o c } return o }"
            " { k = $2; v = $0; sub(/^[LF][ \\t]+[^ \\t]+[ \\t]*/, \"\", v); sub(/[ \\t]+$/, \"\", v) }"
            " $1 == \"L\" { live[k] = v; next }"
            " $1 == \"F\" && NF >= 3 && substr(k, 1, 1) != \"#\" { want[k] = v }"
            " END { for (k in want) if (!(k in live)) print \"add map \" m \" \" esc(k) \" \" esc(want[k]);"
            " else if (live[k] != want[k]) print \"set map \" m \" \" esc(k) \" \" esc(want[k]);"
            " for (k in live) if (!(k in want)) print \"del map \" m \" \" esc(k) }'")
    return (f"if echo 'show map' | {sock} | grep -qF '({path})'; then "
            f"out=$({{ echo 'show map {path}' | {sock} | sed -n 's/^0x[0-9a-f]* /L /p'; sed 's/^/F /' {path}; }} "
            f"| {diff} | tr '\\n' ';' | {sock}); "
            f"if printf '%s' \"$out\" | grep -q '[A-Za-z]'; then echo \"voltafleet: HAProxy refused {path}: $out\" >&2; exit 1; fi; fi")


def _check_path(path: str) -> None:
    if not re.fullmatch(r"/[A-Za-z0-9._/-]+", path):
        raise ValueError(f"unexpected characters in map path {path!r}")


# check_running's output when the running HAProxy does not use the map (or does not run):
# nothing to compare, it reads the file when it starts or reloads
NOT_LOADED = "voltafleet: map not loaded"
FILE_MARK = "voltafleet: the map file"


def show_running(path: str, socket: str | None = None) -> str:
    """A shell command that prints the running HAProxy's copy of the map at `path` (`show map`),
    or NOT_LOADED when the running process does not use that map (or does not run)."""
    _check_path(path)
    sock = admin(socket or ADMIN_SOCKET)
    return (f"if echo 'show map' | {sock} | grep -qF '({path})'; then echo 'show map {path}' | {sock}; "
            f"else echo '{NOT_LOADED}'; fi")


def readback(path: str, socket: str | None = None) -> str:
    """show_running, then FILE_MARK and the file: what check_running compares."""
    return f"{show_running(path, socket)}; echo '{FILE_MARK}'; cat {path}"


def running_copy(show_running_output: str) -> str | None:
    """show_running's output as `show map` text, None when the map is not loaded."""
    return None if show_running_output.strip() == NOT_LOADED else show_running_output


def file_entries(text: str) -> list[tuple[str, str]]:
    """A map file's [(key, value)] as HAProxy reads it at start: the first word is the key, the
    rest of the line its value (inner spaces kept, outer ones dropped); lines that begin with #
    and blank lines are skipped."""
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, *value = re.split(r"[ \t]+", line.strip(" \t\r"), maxsplit=1)
        out.append((key, value[0] if value else ""))
    return out


SHOW_MAP_LINE = re.compile(r"^0x[0-9a-f]+ (\S+) ?(.*)$")


def running_entries(show_map: str) -> list[tuple[str, str]]:
    """[(key, value)] from the runtime API's `show map <file>`: one `<entry id> <key> <value>`
    line an entry (HAProxy 2.6: `0x55d1c0e0a1b0 slow 64 3`), then an empty line. Anything else
    (an error such as "Unknown map identifier") is a ValueError: never read as an empty map."""
    out = []
    for line in show_map.splitlines():
        if not line.strip():
            continue
        m = SHOW_MAP_LINE.match(line)
        if not m:
            raise ValueError(f"unexpected `show map` output: {line[:120]!r}")
        out.append((m.group(1), m.group(2)))
    return out


def map_mismatch(path: str, file_text: str, show_map: str) -> str | None:
    """What the running HAProxy's copy of the map at `path` (its `show map` output) lacks or
    holds beyond the file (file_text), naming the map and each entry; None when they are equal.
    The servers' key map never shows its values."""
    secret = path == UPSTREAM_MAP
    try:
        running = running_entries(show_map)
    except ValueError as e:
        return f"the running HAProxy's map {path} could not be read: " + ("unexpected output" if secret else str(e))
    want = dict(file_entries(file_text))
    live: dict[str, list[str]] = {}
    for k, v in running:
        live.setdefault(k, []).append(v)
    diffs = []
    for k in sorted(set(want) | set(live)):
        name = k if not secret or k == "upstream" else "an entry"  # a stray line of a key file is a key
        if k not in live:
            diffs.append(f"{name}: missing")
        elif k not in want:
            diffs.append(f"{name}: not in the file")
        elif len(live[k]) > 1:
            diffs.append(f"{name}: {len(live[k])} entries")
        elif live[k][0] != want[k]:
            diffs.append(f"{name}: the running value differs from the file's" if secret
                         else f"{name}: running {live[k][0]!r}, file {want[k]!r}")
    if not diffs:
        return None
    more = f" (and {len(diffs) - 5} more)" if len(diffs) > 5 else ""
    return f"the running HAProxy's map {path} does not hold what the file holds: " + "; ".join(diffs[:5]) + more


def check_running(path: str, output: str) -> str | None:
    """map_mismatch from readback(path)'s output; None when the map matches or is not loaded."""
    show, mark, file_text = output.partition(FILE_MARK + "\n")
    if mark and running_copy(show) is None:
        return None
    if not mark:  # the runtime API did not answer (its output is not shown: it may hold the servers' key)
        return f"the running HAProxy's map {path} could not be read back"
    return map_mismatch(path, file_text, show)
