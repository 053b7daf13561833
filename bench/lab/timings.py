"""Where the lab suite's time goes: every pyinfra run and rolling driver the lab tests start
is timed into reports/lab-timings.jsonl (tests/lab/helpers.timed); this sums it per test
file and per kind, and lists the slowest runs.

    .venv/bin/python -m bench.lab.timings        # after a lab test run
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "reports" / "lab-timings.jsonl"


def summary(rows: list[dict]) -> dict:
    """{"files": {file: {"runs": n, "seconds": s}}, "kinds": {...}, "total": s, "runs": n}."""
    files: dict = defaultdict(lambda: {"runs": 0, "seconds": 0.0})
    kinds: dict = defaultdict(lambda: {"runs": 0, "seconds": 0.0})
    for r in rows:
        for key, table in ((r["test"].split("::")[0] or "(no test)", files), (r["kind"], kinds)):
            table[key]["runs"] += 1
            table[key]["seconds"] += r["seconds"]
    return {"files": dict(files), "kinds": dict(kinds), "runs": len(rows),
            "total": sum(r["seconds"] for r in rows)}


def main() -> int:
    if not RECORD.exists():
        print(f"no {RECORD.relative_to(REPO)}: run the lab tests first", file=sys.stderr)
        return 1
    rows = [json.loads(line) for line in RECORD.read_text().splitlines() if line.strip()]
    s = summary(rows)
    print(f"{s['runs']} runs, {s['total']:.0f} s in pyinfra runs and rolling drivers")
    for title, table in (("file", s["files"]), ("kind", s["kinds"])):
        print(f"\n{title:<40} {'runs':>5} {'seconds':>8}")
        for k, v in sorted(table.items(), key=lambda kv: -kv[1]["seconds"]):
            print(f"{k:<40} {v['runs']:>5} {v['seconds']:>8.1f}")
    print("\nslowest runs:")
    for r in sorted(rows, key=lambda r: -r["seconds"])[:15]:
        print(f"{r['seconds']:>7.1f} s  rc {r['rc']}  {r['kind']:<8} {r['test'][:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
