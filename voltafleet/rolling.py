"""Rolling rollouts, the pure part: which hosts go in which batch, when to stop, and the
fleet report. The driver (rollout/) runs pyinfra once per batch and feeds this module
what each host reported.

    >>> batches(["a", "b", "c", "d", "e"], canary=["a"], batch="50%")
    [['a'], ['b', 'c'], ['d', 'e']]
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

STATUSES = ("passed", "rolled_back", "failed", "unreachable", "not_run")


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


def should_stop(results: dict[str, str], fail_percent: float, canary: list[str]) -> str | None:
    """Why the rollout stops now, or None to go on. `results`: host -> status so far.

    A canary that did not pass stops everything; else the share of hosts that failed
    (rolled back or failed) among those tried must stay at or below `fail_percent`."""
    bad = [h for h, s in results.items() if s != "passed"]
    if any(h in bad for h in canary):
        return f"canary {', '.join(h for h in canary if h in bad)} did not pass: no other host was touched"
    tried = len(results)
    if tried and 100.0 * len(bad) / tried > fail_percent:
        return (f"{len(bad)} of {tried} hosts failed ({100.0 * len(bad) / tried:.0f} % > fail percent "
                f"{fail_percent:g} %)")
    return None


@dataclass
class HostResult:
    host: str
    batch: int
    status: str = "not_run"              # one of STATUSES
    fingerprint: str | None = None
    flags: list = field(default_factory=list)
    ttft_ms: float | None = None
    single_tps: float | None = None
    aggregate_tps: float | None = None
    probe: str | None = None             # "reference", "match", "diverged: ...", or None
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def host_result(name: str, batch: int, smoke_report: dict | None, status_report: dict | None,
                error: str | None) -> HostResult:
    """Merge what a host left on the controller: its smoke report (reports/smoke-<host>.json,
    written in this run), its end-of-deploy status, and the error pyinfra printed for it."""
    r = HostResult(name, batch)
    if status_report:
        r.fingerprint = status_report.get("fingerprint")
        r.flags = status_report.get("flags", [])
    if smoke_report:
        inst = [m for m in smoke_report.get("instances", []) if "error" not in m]
        judged = smoke_report.get("judged", {})
        if inst:
            r.ttft_ms = max(m["ttft_ms"] for m in inst)
            r.single_tps = min(judged.get(str(m["instance"]), {}).get("single_tps", m.get("single_tps") or 0)
                               for m in inst)
            r.aggregate_tps = min(m.get("aggregate_tps") or 0 for m in inst)
        r.probe = smoke_report.get("probe", {}).get("verdict")
        r.fingerprint = smoke_report.get("fingerprint") or r.fingerprint
    if status_report and status_report.get("ok"):
        r.status = "passed"
    elif smoke_report and smoke_report.get("rolled_back"):
        r.status = "rolled_back"
        r.detail = "; ".join(smoke_report.get("failures", []))[:300]
    elif error and ("Could not connect" in error or "unreachable" in error.lower()):
        r.status = "unreachable"
        r.detail = error[:300]
    else:
        r.status = "failed"
        r.detail = (error or "; ".join((smoke_report or {}).get("failures", [])) or "no status (see the log)")[:300]
    return r


def table(results: list[HostResult]) -> str:
    def num(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    rows = [f"{'host':<16} {'batch':>5} {'status':<12} {'release':<16} {'TTFT ms':>8} {'1-stream':>9} "
            f"{'N-way':>8} {'probe':<10} detail"]
    for r in results:
        rows.append(f"{r.host:<16} {r.batch:>5} {r.status:<12} {(r.fingerprint or '-'):<16} "
                    f"{num(r.ttft_ms, '.0f'):>8} {num(r.single_tps, '.1f'):>9} {num(r.aggregate_tps, '.1f'):>8} "
                    f"{(r.probe or '-')[:10]:<10} {r.detail}")
    return "\n".join(rows)


def summary(results: list[HostResult], stopped: str | None) -> dict:
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    return {"ok": stopped is None and counts["passed"] == len(results), "stopped": stopped, "counts": counts}
