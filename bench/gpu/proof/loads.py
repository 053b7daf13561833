"""GPU memory of a loaded server: after load, its peak while one prompt per slot runs at once
(sampled every 0.1 s), and after; the load log's buffer lines with it.

    vram:BUILD[:once]          plan["vram"]: the v100_16gb argv at 2/3/4 slots (and the v100_32gb
                               variants), one 1,536-token prompt per slot; `cublas` 3 runs each
    vram_named:BUILD=A+B       one run each of the named entries of plan["vram"]
    peak:BUILD                 plan["peaks"] of that build (issue 27): short and long prompts per slot
"""
from __future__ import annotations

import time

from bench.gpu.proof.runner import ProofRun, Sampler, concurrent
from bench.gpu.qwen35_bench import Server, complete, gpu_mem, prompt_ids, say


def peak_of(run: ProofRun, s: Server, jobs: list, keys: tuple) -> dict:
    """A loaded server's memory after load, its peak while `jobs` run at once (sampled every
    0.1 s) and after; each request's `keys`. Only mem_load when the server is not healthy."""
    time.sleep(1)
    r = {"mem_load": gpu_mem(s.p.pid).get("proc_mib")}
    if s.ok:
        sampler = Sampler(s.p.pid)
        reqs = concurrent(run.port, jobs)
        time.sleep(0.5)
        r.update(mem_peak=sampler.stop(), mem_after=gpu_mem(s.p.pid).get("proc_mib"),
                 requests=[{k: q.get(k) for k in keys} for q in reqs])
    return r


def vram_items(run: ProofRun, label: str, items: list, once: bool) -> None:
    """Each item's server on build `label`, one prompt per slot at once: its memory into results["vram"].
    Unless `once`: the cuBLAS build runs each item 3 times, the others only v16-np2 and v16-np4."""
    out = run.results.setdefault("vram", [])
    runs = 3 if label == "cublas" and not once else 1
    for item in items:
        if label != "cublas" and not once and item["name"] not in ("v16-np2", "v16-np4"):
            continue
        for rep in range(1 if "ub" in item["name"] else runs):
            s = run.server(label, item["name"], item["args"])
            r = {"build": label, "name": item["name"], "run": rep, "args": s.args, "healthy": s.ok}
            try:
                r.update(peak_of(run, s, [(lambda i=i: complete(run.port, prompt_ids(500 + 10 * rep + i,
                                                                                    item["prompt"]), 8))
                                          for i in range(item["parallel"])],
                                 ("prompt_n", "prompt_ms", "ttft_ms", "error")))
            finally:
                s.stop()
            r["buffers"], r["log"] = s.buffers(), run.loglines(s)
            out.append(r)
            run.save()
            say("vram", label, item["name"], rep, r.get("mem_load"), r.get("mem_peak"), r.get("mem_after"))


def vram(run: ProofRun, build: str) -> None:
    """`vram:BUILD[:once]`: plan["vram"] on that build (vram_items)."""
    vram_items(run, build.split(":")[0], run.plan["vram"], build.endswith(":once"))


def vram_named(run: ProofRun, build_names: str) -> None:
    """`vram_named:BUILD=name1+name2`: one run each of the named entries of plan["vram"]."""
    label, _, names = build_names.partition("=")
    vram_items(run, label, [v for v in run.plan["vram"] if v["name"] in names.split("+")], once=True)


def peak(run: ProofRun, build: str) -> None:
    """plan["peaks"] of this build: load, then one prompt per slot at once (each its own
    tokens), the peak of the process's GPU memory sampled every 0.1 s, and after; the load
    log's buffer lines (compute buffer re-reservations included)."""
    out = run.results.setdefault("peaks", [])
    for item in run.plan["peaks"]:
        if item["build"] != build:
            continue
        s = run.server(build, item["name"], item["args"])
        r = {k: item[k] for k in ("build", "name", "group", "ctx", "parallel", "prompt", "tokens", "kind")}
        r.update(args=s.args, healthy=s.ok, spec=item.get("spec"))
        plen = item["prompt"]
        ids = (lambda i: prompt_ids(700 + i, 32) * (plen // 32)) if item["kind"] == "repeat" else \
            (lambda i: prompt_ids(700 + i, plen))
        try:
            r.update(peak_of(run, s, [(lambda i=i: complete(run.port, ids(i), item["tokens"]))
                                      for i in range(item["parallel"])],
                             ("prompt_n", "prompt_ms", "ttft_ms", "n", "draft_n", "draft_accepted", "error")))
        finally:
            s.stop()
        r["buffers"], r["log"] = s.buffers(), run.loglines(s)
        out.append(r)
        run.save()
        say("peak", build, item["name"], r.get("mem_load"), r.get("mem_peak"), r.get("mem_after"))
