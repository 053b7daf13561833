"""Rolling rollouts, the pure part: which hosts go in which batch, when to stop, and the
fleet report. The driver (rollout/) runs pyinfra once per batch and feeds this module
each host's outcome record of that run (voltafleet.state.records.Outcome) and pyinfra's exit code.

    >>> batches(["a", "b", "c", "d", "e"], canary=["a"], batch="50%")
    [['a'], ['b', 'c'], ['d', 'e']]
"""
from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass

from voltafleet.state.records import NOT_FAILED, STATUSES, Outcome


class RollingError(ValueError):
    """A bad rolling option: says which and how to fix it."""


def batch_size(spec: str | int, total: int) -> int:
    """"5" or 5 -> 5 hosts; "25%" -> a quarter of `total` (at least one)."""
    text = str(spec).strip()
    m = re.fullmatch(r"(\d+)(%?)", text)
    if not m or int(m.group(1)) == 0:
        raise RollingError(f"--batch {spec!r}: give a host count (e.g. 2) or a percentage (e.g. 25%)")
    n = int(m.group(1))
    if m.group(2):
        if n > 100:
            raise RollingError(f"--batch {spec!r}: a percentage is at most 100%")
        return max(1, math.ceil(total * n / 100))
    return n


def batches(hosts: list[str], canary: list[str], batch: str | int) -> list[list[str]]:
    """The canary first (alone), then the rest of `hosts` in inventory order, `batch` at a time."""
    unknown = [h for h in canary if h not in hosts]
    if unknown:
        raise RollingError(f"canary host(s) {', '.join(unknown)} not in the rollout")
    rest = [h for h in hosts if h not in canary]
    size = batch_size(batch, len(rest)) if rest else 1
    out = [list(canary)] if canary else []
    return out + [rest[i:i + size] for i in range(0, len(rest), size)]


def gateway_serial(gateways: list[str]) -> bool:
    """Whether the gateway phase's one pyinfra run goes host by host (--serial, stopped at the first host
    that fails): with two gateways or more (one address between them), so one gateway changes at a time,
    its whole deploy (HAProxy reloaded, keepalived) before the next, while the others serve.

    >>> gateway_serial(["gw1"]), gateway_serial(["gw1", "gw2"])
    (False, True)
    """
    return len(gateways) >= 2


def should_stop(results: dict[str, str], fail_percent: float, canary: list[str]) -> str | None:
    """Why the rollout stops now, or None to go on. `results`: host -> status so far.

    A canary that did not pass stops everything; else the share of hosts that failed
    (rolled back or failed) among those tried must stay at or below `fail_percent`. An
    unmeasured host (smoke_enabled: false: the operator's choice, recorded) is neither."""
    bad = [h for h, s in results.items() if s not in NOT_FAILED]
    if any(h in bad for h in canary):
        return f"canary {', '.join(h for h in canary if h in bad)} did not pass: no other host was touched"
    tried = len(results)
    if tried and 100.0 * len(bad) / tried > fail_percent:
        return (f"{len(bad)} of {tried} hosts failed ({100.0 * len(bad) / tried:.0f} % > fail percent "
                f"{fail_percent:g} %)")
    return None


# the fleet report's columns that come from a host's outcome record: {column: Outcome's field}
FROM_OUTCOME = {"fingerprint": "release", "flags": "flags", "ttft_ms": "ttft_ms",
                "ttft_p50_ms": "ttft_p50_ms",  # N concurrent streams
                "ttft_p99_ms": "ttft_p99_ms", "single_tps": "single_tps", "aggregate_tps": "aggregate_tps",
                "probe": "probe",  # "match", "diverged: ...", "recorded", "not run", or None
                "restarted": "restarted",  # instances this run restarted
                "streams_cut": "streams_cut"}  # streams a drain had to cut
NO_OUTCOME = {"flags": [], "restarted": [], "streams_cut": 0}  # the columns of a host without a record (else None)


@dataclass
class HostResult:
    """A host's row of the fleet report: its status and detail (the driver's verdict: its outcome
    record's, unless the run says otherwise), and its outcome record of the run (None: none),
    whose figures are the row's columns (FROM_OUTCOME), read from it, never copied."""

    host: str
    batch: int
    status: str = "not_run"              # one of STATUSES
    detail: str = ""
    outcome: Outcome | None = None

    def __getattr__(self, name: str):
        if name not in FROM_OUTCOME:
            raise AttributeError(name)
        rec = self.__dict__.get("outcome")
        if rec is None:
            return copy.copy(NO_OUTCOME.get(name))
        return copy.copy(getattr(rec, FROM_OUTCOME[name]))

    def to_dict(self) -> dict:
        return {"host": self.host, "batch": self.batch, "status": self.status,
                **{k: getattr(self, k) for k in FROM_OUTCOME}, "detail": self.detail}


def batch_results(batch_no: int, hosts: list[str], records: dict, rc: int, log: str) -> list[HostResult]:
    """Each host's verdict from its own outcome record of this run (voltafleet.state.records.Outcome),
    never from a default: a missing record is a failure; so is a "passed" record when
    pyinfra's exit code is non-zero and no host of the batch explains it with a failure."""
    explained = any(r is not None and r.status not in NOT_FAILED for r in records.values())
    out = []
    for name in hosts:
        rec = records.get(name)
        r = HostResult(name, batch_no, outcome=rec)
        if rec is None:
            r.status = "failed"
            r.detail = (f"no outcome record from this run (pyinfra exited {rc}: stopped before its smoke test, "
                        f"or unreachable; see {log})")
        else:
            r.status, r.detail = rec.status, rec.reason
            if rec.status in NOT_FAILED and rc != 0 and not explained:
                r.status = "failed"
                r.detail = f"pyinfra exited {rc} and no host of the batch recorded why (see {log})"
        out.append(r)
    return out


def table(results: list[HostResult]) -> str:
    def num(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    def pair(a, b):
        return f"{num(a, '.0f')}/{num(b, '.0f')}" if a is not None or b is not None else "-"

    rows = [f"{'host':<16} {'batch':>5} {'status':<12} {'release':<16} {'TTFT ms':>8} {'N p50/p99':>11} "
            f"{'1-stream':>9} {'N-way':>8} {'probe':<10} {'restarted':<9} {'cut':>3} detail"]
    for r in results:
        rows.append(f"{r.host:<16} {r.batch:>5} {r.status:<12} {(r.fingerprint or '-'):<16} "
                    f"{num(r.ttft_ms, '.0f'):>8} {pair(r.ttft_p50_ms, r.ttft_p99_ms):>11} "
                    f"{num(r.single_tps, '.1f'):>9} {num(r.aggregate_tps, '.1f'):>8} "
                    f"{(r.probe or '-')[:10].replace(' ', '-'):<10} "
                    f"{','.join(map(str, r.restarted)) or '-':<9} {r.streams_cut:>3} {r.detail}")
    return "\n".join(rows)


def summary(results: list[HostResult], stopped: str | None) -> dict:
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    judged = counts["passed"] + counts["unmeasured"]
    return {"ok": stopped is None and judged == len(results), "stopped": stopped, "counts": counts,
            "streams_cut": sum(r.streams_cut for r in results)}
