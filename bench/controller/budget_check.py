"""What a token-budget check adds to a request at the gateway, and whether it grows with the day files
(issue 48 item 4): the project's own gateway (template and Lua, this machine's HAProxy) in front of a
stand-in upstream (tests/gateway_local/harness.py's Faked: GET /v1/models answered at once), with 100
teams that have a budget and one that has none. Requests of both kinds alternate on two keep-alive
httpx clients; the added latency of the check is a budgeted team's minus the free team's.

Two sides in one run, on one frozen clock (libfaketime: 2027-01-31 12:00 UTC, so the month holds 30
days before today): `empty` (no day files) and `full` (every one of the 30 days and today as a day file
of --lines lines spread over the 100 teams, the 29 old ones compacted by the starting worker's task).
The starting worker's load time (until voltafleet_gateway_budgets_ready is 1) is recorded too.

    .venv/bin/python -m bench.controller.budget_check [--requests 3000] [--lines 20000] [--out FILE]

Loopback only; bounded (--requests x 2 requests a side)."""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.gateway_local import harness

CLOCK = "2027-01-31 12:00:00"
TEAMS = 100


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def write_days(folder: Path, lines: int) -> int:
    """Jan 1-31 2027: each day's .log of `lines` lines `<team> <tokens> <pid>`; returns the bytes written."""
    rng = random.Random(48)
    total = 0
    for day in range(1, 32):
        text = "".join(f"t{rng.randrange(TEAMS):03d} {rng.randrange(1, 4000)} {rng.randrange(2, 60000)}\n"
                       for _ in range(lines))
        (folder / f"2027-01-{day:02d}.log").write_text(text)
        total += len(text)
    return total


def side(name: str, lines: int, requests: int) -> dict:
    keys = {f"t{i:03d}": f"key-t{i:03d}" for i in range(TEAMS)} | {"free": "key-free"}
    budgets = {f"t{i:03d}": {"tokens_per_day": 10 ** 9, "tokens_per_month": 10 ** 10} for i in range(TEAMS)}
    with tempfile.TemporaryDirectory(prefix=f"vf-budget-{name}-") as tmp:
        g = harness.Faked(Path(tmp), keys, budgets=budgets, answer=lambda mode: ("application/json", b"{}"))
        g.clock = CLOCK
        (Path(tmp) / "budgets").mkdir()
        written = write_days(Path(tmp) / "budgets", lines) if lines else 0
        g.start_servers()
        t0 = time.monotonic()
        g.start_gateway()  # returns once the worker's task has read the month (its gauge says 1)
        load_s = time.monotonic() - t0
        try:
            lat: dict[str, list[float]] = {"budgeted": [], "free": []}
            codes: dict[str, int] = {}
            with httpx.Client(base_url=g.gateway, timeout=30) as a, httpx.Client(base_url=g.gateway, timeout=30) as b:
                for i in range(requests + 200):  # the first 200 of each warm up, not kept
                    for kind, client, key in (("budgeted", a, f"key-t{i % TEAMS:03d}"), ("free", b, "key-free")):
                        t = time.perf_counter()
                        r = client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
                        ms = (time.perf_counter() - t) * 1000
                        codes[str(r.status_code)] = codes.get(str(r.status_code), 0) + 1
                        if i >= 200:
                            lat[kind].append(round(ms, 4))
            used = httpx.get(g.metrics, timeout=10).text.count('voltafleet_team_budget_used_tokens{team="t')
        finally:
            g.stop()
    out = {"side": name, "lines_a_day": lines, "day_files_bytes": written, "worker_load_s": round(load_s, 3),
           "codes": codes, "teams_with_counts_shown": used // 2, "latency_ms": lat}
    for kind in lat:
        out[kind] = {"p50": percentile(lat[kind], 50), "p99": percentile(lat[kind], 99),
                     "mean": round(statistics.fmean(lat[kind]), 4)}
    out["added_ms"] = {p: round(out["budgeted"][p] - out["free"][p], 4) for p in ("p50", "p99")}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--lines", type=int, default=20000, help="lines of each day's file on the full side")
    ap.add_argument("--out", help="the raw record (JSON)")
    a = ap.parse_args(argv)
    why = harness.missing_gateway()
    if why:
        print(f"budget_check: {why}", file=sys.stderr)
        return 2
    runs = [side("empty", 0, a.requests), side("full", a.lines, a.requests)]
    print(f"{'side':6} {'day files':>10} {'load s':>7} {'budgeted p50/p99 ms':>20} {'free p50/p99 ms':>16} "
          f"{'added p50/p99 ms':>17}  teams counted  codes")
    for r in runs:
        print(f"{r['side']:6} {r['day_files_bytes'] / 1e6:>8.1f}MB {r['worker_load_s']:>7.3f} "
              f"{r['budgeted']['p50']:>9.3f}/{r['budgeted']['p99']:<9.3f} {r['free']['p50']:>7.3f}/{r['free']['p99']:<8.3f} "
              f"{r['added_ms']['p50']:>8.3f}/{r['added_ms']['p99']:<8.3f} {r['teams_with_counts_shown']:>13}  {r['codes']}")
    if a.out:
        record = {"argv": ["-m bench.controller.budget_check", *sys.argv[1:]], "clock": CLOCK, "teams_with_budget": TEAMS, "requests_a_kind": a.requests,
                  "machine": "this project's 2-core machine (one HAProxy thread)", "runs": runs}
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
