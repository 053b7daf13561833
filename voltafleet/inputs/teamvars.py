"""The gateway's settings, checked before any host: each entry of gateway_teams (name, key
hashes, limits, budgets, tier, tiers, overflow) and the names a tier may have. The gateway
(voltafleet/front/teams.py, tiers.py) makes HAProxy's maps from what passes.

    >>> team_problems([{"name": "search", "key_sha256": "a" * 64}], "f.yml")
    []
"""
from __future__ import annotations

import re

from voltafleet.ground.errors import Problem

TIER_DEFAULT = "throughput"
OVERFLOWS = ("throughput", "refuse")
TIER_NAME = re.compile(r"^[a-z][a-z0-9-]{0,23}$")  # a backend name suffix and a map value: no space, no _ (llama_<tier>)
TIER_NAME_HINT = "lowercase letters, digits and -, starting with a letter (up to 24), like latency"
TEAM_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
FIELDS = {"name", "key_sha256", "max_concurrent", "requests_per_minute", "slot_share", "tokens_per_day",
          "tokens_per_month", "tier", "tiers", "overflow"}
MAX_BUDGET = 10 ** 12  # tokens: far above any fleet's month, far below a Lua integer's limit


def team_problems(teams, source: str | None, key: str = "gateway_teams") -> list[Problem]:
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
        if not isinstance(name, str) or not TEAM_NAME.fullmatch(name):
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
        for f in ("tokens_per_day", "tokens_per_month"):
            v = t.get(f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_BUDGET):
                bad(f"{where} ({name}) has {f}: {v!r}", f"give a whole number of tokens (prompt + completion) from 1 "
                    f"to {MAX_BUDGET}, or leave it out (null) for no budget")
        tier_problems(t, f"{where} ({name})", bad)
    return out


def tier_problems(team: dict, where: str, bad) -> None:
    """A team entry's tier, tiers and overflow (team_problems calls it for each team)."""
    tier = team.get("tier", TIER_DEFAULT)
    if not isinstance(tier, str) or not TIER_NAME.fullmatch(tier):
        bad(f"{where} has tier: {tier!r}", f"give the name of a tier ({TIER_NAME_HINT}), or leave it out for {TIER_DEFAULT}")
        return
    allowed = team.get("tiers")
    if allowed is not None:
        if not isinstance(allowed, list) or not allowed or not all(isinstance(t, str) and TIER_NAME.fullmatch(t) for t in allowed):
            bad(f"{where} has tiers: {allowed!r}", f"give a list of tier names ({TIER_NAME_HINT}), e.g. [{TIER_DEFAULT}, latency], "
                "or leave it out (the team's tier alone)")
        elif tier not in allowed:
            bad(f"{where} has tier: {tier} but its tiers {allowed} do not list it",
                f"add {tier} to tiers, or set tier to one of them")
    overflow = team.get("overflow")
    if overflow is not None and overflow not in OVERFLOWS:
        bad(f"{where} has overflow: {overflow!r}", "use throughput (served there when its tier is full) or refuse "
            "(503 with Retry-After), or leave it out for gateway_tier_overflow")
