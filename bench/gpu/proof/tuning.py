"""The v100_32gb group's tune settings under the group's workload (issue 29, planned by
bench/gpu/tune29.py): each setting's loaded memory, golden probe and workload repetitions.

    tune29[:KEY]    plan[KEY] (tune29: every setting, run 1; tune29b: the follow-up workload, run 2),
                    records in results[KEY]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from bench.gpu.proof.runner import ProofRun
from bench.gpu.qwen35_bench import Server, gpu_mem, say


def tune_settings(run: ProofRun, key: str = "tune29") -> None:
    """`tune29[:KEY]`: each fitting setting's server, its GPU's memory once loaded (/health answered,
    before any request: `loaded_mib`, the CUDA context the calibration reads), the golden probe,
    then the workload (plan[key]: voltafleet/hostside/workload.py, as shipped to hosts); records
    appended to results[key]. A setting that does not fit is recorded as refused, never run."""
    from voltafleet.hostside import workload  # run as a script, as shipped to hosts

    workload_py = os.path.abspath(workload.__file__)
    plan = run.plan[key]
    out = run.results.setdefault(key, [])
    for item in plan["settings"]:
        r = {k: item[k] for k in ("name", "values", "build", "fits", "refusal", "planned_mib", "planned_static_mib")}
        if not item["fits"]:
            r.update(status="refused", reps=[])
            out.append(r)
            run.save()
            continue
        t0 = time.time()
        s = run.server(item["build"], "tune-" + item["name"].replace(" ", "_"), item["args"])
        r.update(args=s.args, healthy=s.ok, load_s=s.load_s)
        try:
            if s.ok:
                r.update(measure_setting(run, s, plan, workload_py))
            else:
                r.update(status="failed", reps=[], reason="the server did not start")
        finally:
            s.stop()
        r["seconds"] = round(time.time() - t0, 1)
        r["log"] = run.loglines(s)
        out.append(r)
        run.save()
        say(key, item["name"], r["status"], [(x.get("throughput_tps"), x.get("followups")) for x in r.get("reps", [])])


def measure_setting(run: ProofRun, s: Server, plan: dict, workload_py: str) -> dict:
    """A healthy setting's figures: the GPU's memory after load, the golden probe's tokens, then the
    workload's repetitions (status measured) or why it failed."""
    from voltafleet.hostside import smoke_client as smoke  # the host-side client, as shipped: its greedy probe against the shipped setting's

    time.sleep(1)  # as the VRAM proof reads after-load (loads.peak_of); memory.used as the peaks
    r = {"loaded_mib": gpu_mem().get("gpu_used_mib")}
    pr = run.plan["probe"]
    r["probe_tokens"] = smoke.probe(run.port, None, pr["short"], pr["tokens"])["tokens"]
    cmd = [sys.executable, workload_py, "--port", str(run.port), "--gpu", "0", *plan["workload"]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    got = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    r.update(status="measured" if got else "failed", reps=got["reps"] if got else [],
             after_load_mib=got["after_load_mib"] if got else None,
             reason="" if got else (done.stderr.strip().splitlines() or ["no output"])[-1][:300])
    return r
