"""bench/RESULTS.md's issue 48 table (what a budget check adds), recomputed from its raw records
(bench/records/gateway48: every request's latency kept)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from bench.controller.budget_check import percentile

ROOT = Path(__file__).resolve().parents[2]


def test_the_results_table_is_the_records_recomputed():
    text = (ROOT / "bench/RESULTS.md").read_text()
    section = text[text.index("## Issue 48: what a budget check adds"):]
    rows = re.findall(r"^\| (\d) \| (empty|full) \| ([\d.]+) MB \| ([\d.]+) \| ([\d.]+) / ([\d.]+) \| ([\d.]+) / ([\d.]+) \| "
                      r"(-?[\d.]+) / (-?[\d.]+) \|$", section, re.M)
    assert len(rows) == 4, rows
    for run, side, mb, load, bp50, bp99, fp50, fp99, ap50, ap99 in rows:
        rec = json.loads((ROOT / f"bench/records/gateway48/budget-check-run{run}.json").read_text())
        r = next(x for x in rec["runs"] if x["side"] == side)
        lat = r["latency_ms"]
        assert len(lat["budgeted"]) == len(lat["free"]) == rec["requests_a_kind"] == 3000
        assert r["codes"] == {"200": 2 * (3000 + 200)}  # every request served (none refused)
        got = {k: {p: percentile(lat[k], p) for p in (50, 99)} for k in lat}
        assert (f"{got['budgeted'][50]:.3f}", f"{got['budgeted'][99]:.3f}") == (bp50, bp99)
        assert (f"{got['free'][50]:.3f}", f"{got['free'][99]:.3f}") == (fp50, fp99)
        assert (f"{got['budgeted'][50] - got['free'][50]:.3f}", f"{got['budgeted'][99] - got['free'][99]:.3f}") == (ap50, ap99)
        assert f"{r['day_files_bytes'] / 1e6:.1f}" == (mb if side == "full" else "0.0") and f"{r['worker_load_s']:.3f}" == load
