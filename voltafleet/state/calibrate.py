"""Calibrate the plan's timeline (voltafleet.planning.timeline) from a real rollout: each run's estimated
and measured seconds side by side, and the `plan_*` values the rollout measured.

    python -m voltafleet.state.calibrate reports/rollout-<plan id>/plan.json reports/rollout-<id>.json

Where each measured value comes from (the records in the rollout's run directory,
reports/rollout-<id>/: voltafleet.state.records, never the text of the pyinfra logs):

- plan_compile_s: each compile's seconds (build-<host>.json, `built`: vf-build-release's configure and build)
- plan_model_mib_s: each model download's bytes over curl's seconds (fetch-<host>.json, from vf-fetch-model)
- plan_drain_s, plan_restart_s, plan_smoke_s: the timings of smoke-<host>.json (the activation role
  times each drain, each restart until /health answers, and the smoke test)
- plan_run_s: the preflight run's seconds (a run that only reads facts), and each batch's
  seconds minus the steps the timeline counted for it (what is left is the run's own cost)

The figures print as medians; paste them into group_vars (all.yml, or the group's file).
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from voltafleet.state.records import Build, Fetch, Smoke
from voltafleet.state.runctx import RunDir


def build_figures(run_dir: Path) -> dict[str, list[float]]:
    """Each compile's seconds (build records) and each model download's MiB/s (fetch records)."""
    d = RunDir(run_dir)
    return {"compile_s": [b.seconds for b in d.all(Build) if b.built and b.seconds is not None],
            "model_mib_s": [round(x.mib_s, 1) for f in d.all(Fetch) for x in f.downloads if x.mib_s is not None]}


def smoke_timings(run_dir: Path) -> dict[str, list[float]]:
    """Every drain, restart and smoke test the activation role timed (smoke-<host>.json)."""
    out: dict[str, list[float]] = {"drain_s": [], "restart_s": [], "smoke_s": []}
    for record in RunDir(run_dir).all(Smoke):
        t = record.timings
        out["drain_s"] += t.drain_s
        out["restart_s"] += t.restart_s
        out["smoke_s"] += [t.smoke_s] if t.smoke_s is not None else []
    return out


def runs(plan: dict, report: dict) -> list[tuple[str, float | None, float | None]]:
    """(run, estimated s, measured s): preflight, gateway, then every batch."""
    est, measured = plan["estimate"], report.get("runs") or {}
    rows = [("preflight", est["preflight_s"], measured.get("preflight"))]
    if est["gateway_s"] or "gateway" in measured:
        rows.append(("gateway", est["gateway_s"], measured.get("gateway")))
    rows += [(f"batch-{b['index']}", b["seconds"], measured.get(f"batch-{b['index']}")) for b in est["batches"]]
    return rows


def run_residuals(plan: dict, report: dict) -> list[float]:
    """Each batch's measured seconds minus the steps the timeline counted (its run's own cost)."""
    measured = report.get("runs") or {}
    out = []
    for b in plan["estimate"]["batches"]:
        actual = measured.get(f"batch-{b['index']}")
        if actual is not None:
            out.append(round(actual - (b["seconds"] - b["steps"].get("run", 0)), 1))
    return out


def suggestions(plan: dict, report: dict, run_dir: Path) -> dict[str, tuple[float, int]]:
    """{plan variable: (median, how many measurements)} of what this rollout measured."""
    found = {**build_figures(run_dir), **smoke_timings(run_dir)}
    pre = (report.get("runs") or {}).get("preflight")
    found["run_s"] = run_residuals(plan, report) + ([pre] if pre is not None else [])
    return {f"plan_{k}": (round(statistics.median(v), 1), len(v)) for k, v in found.items() if v}


def report_text(plan: dict, report: dict, run_dir: Path) -> str:
    lines = [f"{'run':<12} {'estimated':>10} {'measured':>10} {'ratio':>7}"]
    for name, est, actual in runs(plan, report):
        ratio = f"{actual / est:.2f}" if est and actual is not None else "-"
        lines.append(f"{name:<12} {est:>10.1f} {('-' if actual is None else f'{actual:.1f}'):>10} {ratio:>7}")
    lines += ["", "measured (median, count): paste into group_vars to calibrate"]
    for key, (value, n) in sorted(suggestions(plan, report, run_dir).items()):
        lines.append(f"{key + ':':<18} {value:<8g} # {n} measurement(s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    plan, report = (json.loads(Path(p).read_text()) for p in args)
    print(report_text(plan, report, Path(args[1]).with_suffix("")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
