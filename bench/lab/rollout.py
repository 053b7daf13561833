"""Rollout benchmark on the lab fleet (not a test: it prints numbers).

For each fleet size: lab up time (fresh hosts, cached rootfs), first rollout time, no-op
re-run time, and the compile time on each host (from the build logs' timestamps), with
the build strategy given. `--cold` empties the compiler cache for the first rollout
(and puts it back afterwards), so compile times are those of a fresh fleet.

    .venv/bin/python -m bench.lab.rollout --hosts 1 3 --strategy shared per_host [--cold]
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab import fleet
from tests.lab.helpers import compiled_here, deploy, lab, ssh

REPO = Path(__file__).resolve().parents[2]


def timed(fn):
    t0 = time.monotonic()
    out = fn()
    return out, time.monotonic() - t0


def compile_seconds(host: dict) -> list[float]:
    """Seconds each compile on the host took (configure + build), as the build script recorded."""
    out = ssh(host, "cat /opt/voltafleet/build/*.seconds 2>/dev/null", check=False)
    return [float(x) for x in out.split()]


class ColdCache:
    def __init__(self, enabled: bool):
        self.enabled, self.saved = enabled, None

    def __enter__(self):
        if self.enabled:
            cache = fleet.CACHE / "ccache"
            self.saved = Path(tempfile.mkdtemp(prefix="ccache-saved-", dir=fleet.CACHE))
            for p in cache.iterdir():
                shutil.move(str(p), self.saved / p.name)
        return self

    def __exit__(self, *exc):
        if self.saved:
            cache = fleet.CACHE / "ccache"
            subprocess.run(f"rm -rf {cache}/*", shell=True, check=True)
            for p in self.saved.iterdir():
                shutil.move(str(p), cache / p.name)
            self.saved.rmdir()


def bench(n: int, strategy: str, cold: bool, tmp: Path) -> dict:
    fleet.down()
    _, up_s = timed(lambda: fleet.up(n))
    vars_ = {"llama_cpp_build_strategy": strategy}
    with ColdCache(cold):
        run, first_s = timed(lambda: deploy(vars_, tmp))
    assert run.rc == 0, run
    again, noop_s = timed(lambda: deploy(vars_, tmp))
    assert again.rc == 0 and again.changed == 0, again
    hosts = lab()["hosts"]
    return {"hosts": n, "strategy": strategy, "cold": cold, "lab_up_s": up_s, "first_rollout_s": first_s,
            "noop_rerun_s": noop_s, "noop_changes": again.changed,
            "compiles": sum(len(compiled_here(h)) for h in hosts),
            "compile_s": [c for h in hosts for c in compile_seconds(h)]}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--hosts", type=int, nargs="+", default=[1, 3])
    p.add_argument("--strategy", nargs="+", default=["shared"], choices=["shared", "per_host"])
    p.add_argument("--cold", action="store_true")
    a = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in a.hosts:
            for s in a.strategy:
                r = bench(n, s, a.cold, Path(tmp))
                rows.append(r)
                print(f"# {r}", flush=True)
    print(f"\n{'hosts':>5} {'strategy':>9} {'ccache':>6} {'lab up s':>9} {'1st rollout s':>13} "
          f"{'no-op s':>8} {'compiles':>8}  compile s per build")
    for r in rows:
        print(f"{r['hosts']:>5} {r['strategy']:>9} {'cold' if r['cold'] else 'warm':>6} {r['lab_up_s']:>9.1f} "
              f"{r['first_rollout_s']:>13.1f} {r['noop_rerun_s']:>8.1f} {r['compiles']:>8}  "
              + ", ".join(f"{c:.0f}" for c in r["compile_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
