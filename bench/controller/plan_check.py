"""The plan's timeline against real rollouts on the lab fleet (issue 20 part 1): for each case,
`python -m rollout inventory/lab.py --plan` (nothing changes), then the same rollout for real,
then the lab's own configuration back (a plain deploy). Prints predicted vs measured seconds
(total and per run) and the error; the raw pairs go to reports/plan-check.json.

    .venv/bin/python -m bench.controller.plan_check [--cases flag-b1 flag-b2 model-b1 model-b2]

Cases: a flag change (`server_ctx_checkpoints: 16`: every instance restarts) and a model change
(the same tiny model under another URL: a download and a restart everywhere), each with the
canary alone and then `--batch 1` (3 batches) or `--batch 2` (2 batches).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from lab.fleet import load_state

REPO = Path(__file__).resolve().parents[2]


def variables(case: str) -> dict:
    st = load_state()
    if case.startswith("flag"):
        return {"server_ctx_checkpoints": 16}
    src = Path(st["mirror_root"]) / "models" / Path(st["model_url"]).name
    copy = src.with_name("tiny-plan.gguf")
    if not copy.exists():
        copy.write_bytes(src.read_bytes())
    return {"model_url": st["model_url"].rsplit("/", 1)[0] + "/tiny-plan.gguf", "model_sha256": st["model_sha256"],
            "smoke_probe": False}


def run(args: list[str], vars_: dict | None) -> tuple[int, str]:
    env = dict(os.environ)
    env.pop("VOLTAFLEET_VARS", None)
    if vars_:
        f = tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False)
        yaml.safe_dump(vars_, f)
        f.close()
        env["VOLTAFLEET_VARS"] = f.name
    p = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def latest(kind: str) -> dict:
    if kind == "rollout":
        return json.loads((REPO / "reports" / "rollout-latest.json").read_text())
    plans = sorted((REPO / "reports").glob("rollout-*/plan.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(plans[-1].read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", default=["flag-b1", "flag-b2", "model-b1", "model-b2"])
    a = p.parse_args()
    py = sys.executable
    pyinfra = str(Path(py).with_name("pyinfra"))
    rows = []
    for case in a.cases:
        batch = case.split("-b")[1]
        vars_ = variables(case)
        args = [py, "-m", "rollout", "inventory/lab.py", "--canary", "1", "--batch", batch]
        rc, out = run(args + ["--plan"], vars_)
        if rc != 0:
            print(out[-3000:])
            return 1
        plan = latest("plan")
        rc, out = run(args, vars_)
        report = latest("rollout") if rc == 0 else {}
        back, _ = run([pyinfra, "-y", "inventory/lab.py", "deploy.py"], None)
        if rc != 0 or back != 0:
            print(out[-3000:])
            return 1
        est = plan["estimate"]
        measured = report.get("seconds")
        runs = report.get("runs") or {}
        row = {"case": case, "estimate_s": est["total_s"], "measured_s": measured,
               "error": round((est["total_s"] - measured) / measured, 3) if measured else None,
               "runs": {"preflight": [est["preflight_s"], runs.get("preflight")],
                        "gateway": [est["gateway_s"], runs.get("gateway")],
                        **{f"batch-{b['index']}": [b["seconds"], runs.get(f"batch-{b['index']}")]
                           for b in est["batches"]}}}
        rows.append(row)
        print(f"{case}: predicted {est['total_s']:.1f} s, measured {measured:.1f} s ({100 * row['error']:+.0f} %); "
              + ", ".join(f"{k} {v[0]:.1f}/{v[1] if v[1] is None else round(v[1], 1)}" for k, v in row["runs"].items()),
              flush=True)
    (REPO / "reports").mkdir(exist_ok=True)
    (REPO / "reports" / "plan-check.json").write_text(json.dumps(rows, indent=1) + "\n")
    worst = max(abs(r["error"]) for r in rows if r["error"] is not None)
    print(f"worst error: {100 * worst:.0f} % (goal: within 25 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
