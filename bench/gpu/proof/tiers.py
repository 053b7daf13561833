"""The latency tier (2 slots, MTP speculation) against the throughput tier (issue 41), on the
shipped build: each config's GPU and host memory, its rounds' token arrivals and drafts, and
llama-server's /metrics counters before and after its rounds (issue 51: its own accepted/drafted,
verification steps and acceptance per draft position; bench.gpu.tier41.metrics_acceptance).

    tier41:BUILD    plan["tier41"] (when its build is BUILD): each config's server on its model file
"""
from __future__ import annotations

import os
import time

from bench.gpu.proof.runner import HostSampler, ProofRun, Sampler, concurrent, proc_mem, wall_rate
from bench.gpu.qwen35_bench import complete, gpu_mem, prompt_ids, say
from voltafleet.hostside.smoke_client import metrics

KEEP41 = ("ttft_ms", "t_start", "times_ms", "n", "decode_tps", "prompt_n", "prompt_ms", "draft_n",
          "draft_accepted", "text_sha", "error")


def tier_rounds(run: ProofRun, t: dict, item: dict, r: dict) -> None:
    """`runs` rounds at each of item's stream counts into r["rounds"] (the same prompts in every
    config, so greedy texts compare), saved after each."""
    for rep in range(t["runs"]):
        for k in item["streams"]:
            tag = 4100 + 10 * rep + k
            recs = concurrent(run.port, [
                (lambda i=i: complete(run.port, prompt_ids(tag * 100 + i, t["prompt"]), t["tokens"]))
                for i in range(k)])
            r["rounds"].append({"rep": rep, "streams": k,
                                "recs": [{x: q.get(x) for x in KEEP41} for q in recs]})
            run.save()


def latency_tier(run: ProofRun, build: str) -> None:
    """`tier41:BUILD`: plan["tier41"], each config's server on its model file; its GPU and host memory
    after load, a warm-up, then tier_rounds, the peaks of both memories over the rounds."""
    out = run.results.setdefault("tier41", [])
    t = run.plan["tier41"]
    if t["build"] != build:
        return
    for item in t["configs"]:
        model = os.path.join(run.a.models, item["model"])
        s = run.server(build, item["name"], item["args"], model=model)
        r = {"name": item["name"], "model": item["model"], "build": build, "args": s.args, "healthy": s.ok,
             "load_s": s.load_s, "rounds": []}
        out.append(r)  # in the results from the start
        try:
            if s.ok:
                time.sleep(2)
                r["gpu_load_mib"], r["mem_load"] = gpu_mem(s.p.pid).get("proc_mib"), proc_mem(s.p.pid)
                complete(run.port, prompt_ids(9900, 32), 8)  # warm-up
                gpu, host = Sampler(s.p.pid), HostSampler(s.p.pid)
                r["metrics_before"] = metrics(run.port, None)  # after the warm-up: the rounds' drafts alone
                tier_rounds(run, t, item, r)
                r["metrics_after"] = metrics(run.port, None)
                r["gpu_peak_mib"], r["host_peak"] = gpu.stop(), host.stop()
                r["gpu_after_mib"] = gpu_mem(s.p.pid).get("proc_mib")
        finally:
            s.stop()
            r["log"], r["buffers"] = run.loglines(s), s.buffers()
            run.save()
        say("tier41", item["name"], s.ok, [(x["streams"], wall_rate(x["recs"]),
                                            sum(q.get("draft_accepted") or 0 for q in x["recs"]),
                                            sum(q.get("draft_n") or 0 for q in x["recs"])) for x in r["rounds"]])
