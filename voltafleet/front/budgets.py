"""Token budgets per team at the gateway (issue 39 item 3): what is counted, when it resets,
what an over-budget team is answered, and how the counts are kept.

A team's `tokens_per_day` and `tokens_per_month` (gateway_teams) bound the prompt + completion
tokens of its answers (reasoning is inside completion), as the gateway's Lua filter reads them
from each answer (docs/gateway.md, "Usage per team"). Periods are UTC calendar days and months:
a day resets at 00:00:00 UTC, a month at 00:00:00 UTC on its first day. A request is counted
in the period of the moment HAProxy logs it (its end).

Enforcement: a request of a team whose use in the period has reached its budget is answered 429
with OpenAI's insufficient_quota body (over_budget) and Retry-After, the seconds to the reset;
a request already running when the budget runs out finishes and is counted.

Persistence (roles/gateway/files/voltafleet-teams.lua carries it out; this module is its
specification, unit-tested): HAProxy's worker appends one line `<team> <tokens> <its pid>` a
request to DIR/<YYYY-MM-DD>.log, the UTC day's file, in one write with O_APPEND: lines of two
workers alive at once (a reload: the old one finishes its streams while the new one serves) never
mix. Every worker counts its own requests in memory as it logs them and reads the other workers'
lines from the file as it grows (a background task, never in a request: issue 48), so each sees
every request of both; a starting worker (a reload, a restart) reads the month's files first.
A day that ended over a day ago is never written again: it is compacted into <day>.sum (a line
a team, written aside and renamed), then its .log removed; a reader takes the .log while it
exists, else the .sum. A month's files go once the next month began.

    >>> reset(1767225599, "day")
    1767225600
    >>> iso(reset(1767225600, "month"))
    '2026-02-01T00:00:00Z'
"""
from __future__ import annotations

import calendar
import time
from datetime import datetime, timezone

DIR = "/var/lib/haproxy/voltafleet-budgets"  # the worker's (user haproxy) own folder
PERIODS = ("day", "month")
ADJECTIVE = {"day": "daily", "month": "monthly"}


def start(now: float, period: str) -> int:
    """The UTC epoch second the day or month holding `now` began."""
    t = time.gmtime(int(now))
    if period == "day":
        return calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0))
    if period == "month":
        return calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0))
    raise ValueError(period)


def reset(now: float, period: str) -> int:
    """The UTC epoch second the day or month holding `now` ends: the next one's 00:00:00 UTC."""
    t = time.gmtime(int(now))
    if period == "day":
        return start(now, "day") + 86400
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return calendar.timegm((year, month, 1, 0, 0, 0))


def iso(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def exceeded(budget: dict[str, int], used: dict[str, int]) -> str | None:
    """The period whose budget the team has used up (used >= budget), the month first (its
    reset is the later one: retrying at the day's reset would be refused again); None: serve."""
    for period in ("month", "day"):
        if budget.get(period) and used.get(period, 0) >= budget[period]:
            return period
    return None


def over_budget(team: str, period: str, budget: int, used: int, now: float) -> tuple[dict, int]:
    """The 429's body (OpenAI's shape for an exhausted quota) and its Retry-After in seconds:
    the budget by name, its size, what was used and when it resets (UTC). The gateway's Lua
    builds the same text (tests/gateway_local compares them)."""
    at = reset(now, period)
    message = (f"Your team {team} has used {used} of its {ADJECTIVE[period]} budget of {budget} tokens "
               f"(prompt + completion, UTC {period}): it resets at {iso(at)}")
    body = {"error": {"message": message, "type": "insufficient_quota", "param": None, "code": "insufficient_quota"}}
    return body, max(1, at - int(now))


def day_file(now: float) -> str:
    """The name of the day's file of counts in DIR: <YYYY-MM-DD>.log."""
    return time.strftime("%Y-%m-%d", time.gmtime(int(now))) + ".log"


def sums(text: str) -> dict[str, int]:
    """{team: tokens} of a .log file's lines `<team> <tokens> <worker pid>` or a .sum file's `<team>
    <tokens>`; an unfinished last line (a write seen half done) or a malformed one is not counted."""
    out: dict[str, int] = {}
    for line in text.split("\n")[:-1]:
        parts = line.split(" ")
        if len(parts) in (2, 3) and parts[1].isdigit():
            out[parts[0]] = out.get(parts[0], 0) + int(parts[1])
    return out


# Two gateways or more (issue 52, voltafleet/front/pair.py): each answers its own counts to the others
# (the Lua's vf_budget_spent) and adds theirs, of the same UTC day and month, before it admits a request.

def spent_text(day: str, month: str, today: dict[str, int], month_before_today: dict[str, int]) -> str:
    """A gateway's own counts as it answers them to the other gateways: the UTC day and month, then a
    line a team, `<team> <day tokens> <month tokens>` (the month's including the day's).

    >>> spent_text("2026-12-05", "2026-12", {"web": 5}, {"web": 10, "batch": 7})
    'day 2026-12-05\\nmonth 2026-12\\nweb 5 15\\nbatch 0 7\\n'
    """
    teams = list(dict.fromkeys([*today, *month_before_today]))
    lines = [f"day {day}", f"month {month}"] + [
        f"{t} {today.get(t, 0)} {month_before_today.get(t, 0) + today.get(t, 0)}" for t in teams]
    return "\n".join(lines) + "\n"


def parse_spent(text: str) -> tuple[str, str, dict[str, tuple[int, int]]]:
    """(day, month, {team: (day tokens, month tokens)}) from another gateway's answer; ValueError otherwise."""
    lines = text.splitlines()
    if len(lines) < 2 or not lines[0].startswith("day ") or not lines[1].startswith("month "):
        raise ValueError("not a gateway's token counts")
    teams = {}
    for line in lines[2:]:
        team, d, m = line.split()
        teams[team] = (int(d), int(m))
    return lines[0][4:], lines[1][6:], teams


def used_across(team: str, day: str, month: str, own: dict[str, int], peers: list[str]) -> dict[str, int]:
    """A team's use as its budget counts it on one gateway: its own {day, month} and each other gateway's
    last answer (spent_text) counted only for the same UTC day and month."""
    out = {"day": own.get("day", 0), "month": own.get("month", 0)}
    for text in peers:
        p_day, p_month, teams = parse_spent(text)
        d, m = teams.get(team, (0, 0))
        out["day"] += d if p_day == day else 0
        out["month"] += m if p_month == month else 0
    return out
