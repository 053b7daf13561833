"""A busy fleet's traffic (issue 51, bench/traffic): seeded multi-turn chats with thinking, Poisson
arrivals at 80 % of the slots, 1x/2x/4x the slots' conversations, replayed on one server.

    traffic51:BUILD    plan["traffic51"] (when its build is BUILD): {"build", "runs", "configs": [{"name",
                       "args", "model" (a file in --models; default q4ks.gguf: gpu_proof.sh writes q4ks-vary.gguf,
                       whose answers differ with the prompt), "traffic": bench.traffic.model.Params as a dict,
                       "calibrate": bool}]}; each
                       config's server, a warm-up, turn_s measured (driver.calibrate) when asked, then
                       `runs` replays of the schedule (seed, seed + 1, ...), host memory sampled
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, replace

from bench.gpu.proof.runner import HostSampler, ProofRun, proc_mem
from bench.gpu.qwen35_bench import say


def traffic(run: ProofRun, build: str, key: str = "traffic51") -> None:
    """`traffic51:BUILD`: each config's records (bench.traffic.driver.replay: per request and the
    summary), the schedule's params and fingerprint, the server's host memory peak a replay."""
    from bench.traffic import driver
    from bench.traffic.model import params_from, schedule

    out = run.results.setdefault(key, [])
    t = run.plan[key]
    if t["build"] != build:
        return
    for item in t["configs"]:
        model = os.path.join(run.a.models, item["model"]) if item.get("model") else None
        s = run.server(build, item["name"], item["args"], model=model)
        r = {"name": item["name"], "model": item.get("model"), "build": build, "args": s.args, "healthy": s.ok, "load_s": s.load_s, "reps": []}
        out.append(r)
        try:
            if s.ok:
                p = params_from(item["traffic"])
                driver.calibrate(p, run.port, n=1)  # warm-up: one request
                if item.get("calibrate"):
                    p = replace(p, turn_s=round(driver.calibrate(p, run.port), 3))
                r["params"] = asdict(p)
                for rep in range(t.get("runs", 1)):
                    sampler, t0 = HostSampler(s.p.pid), time.time()
                    got = driver.replay(schedule(replace(p, seed=p.seed + rep)), run.port)
                    got.update(rep=rep, seconds=round(time.time() - t0, 2), peak=sampler.stop(), mem=proc_mem(s.p.pid))
                    r["reps"].append(got)
                    say(key, item["name"], rep, got["summary"])
                    run.save()
        finally:
            s.stop()
            r["log"] = run.loglines(s)
            run.save()
