"""llama-server's host memory under real multi-turn chats, and what context checkpoints cost and
save (issue 38), on the shipped build (FORCE_MMQ).

    host38:BUILD    plan["host38"] (when its build is BUILD): each config's server at its slots and
                    checkpoint count, concurrent chats through voltafleet's workload client
"""
from __future__ import annotations

import random
import re
import time

from bench.gpu.proof.runner import HostSampler, ProofRun, concurrent, proc_mem
from bench.gpu.qwen35_bench import Server, gpu_mem, say

CKPT = re.compile(r"id\s+(\d+) \| task -?\d+ \| created context checkpoint (\d+) of (\d+) .*?size = ([\d.]+) MiB")


def ckpt_log(text: str) -> dict:
    """What the server's log (at -lv 4) says of its context checkpoints: how many were created, each
    one's size, every slot's count after its last creation (what it holds at the end), evictions,
    restores and invalidations."""
    last, sizes, created = {}, set(), 0
    for m in CKPT.finditer(text):
        last[int(m.group(1))] = int(m.group(2))
        sizes.add(float(m.group(4)))
        created += 1
    return {"created": created, "size_mib": sorted(sizes), "held_by_slot": last, "held": sum(last.values()),
            "evicted": text.count("erasing old context checkpoint"),
            "restored": text.count("restored context checkpoint"),
            "invalidated": text.count("erased invalidated context checkpoint")}


def chat_turn(c, item: dict, followup: bool) -> dict:
    """One client's turn of a real chat (workload.Client: the chat template, thinking, the history sent
    back without it); an error is a record, not an exception."""
    try:
        rec = c.one(item["prompt_tokens"], item["answer_tokens"], followup)
        return {k: rec[k] for k in ("ttft_ms", "tokens", "decode_tps", "followup", "cached_share")} | {
            "t_start": rec["start"], "t_end": rec["end"]}
    except Exception as e:  # noqa: BLE001
        c.reset()
        return {"error": repr(e)[:300]}


def chat_rep(run: ProofRun, s: Server, item: dict, rep: int, workload, rng) -> dict:
    """One repetition: `slots` fresh conversations of `turns` turns, each turn's requests at once;
    the memory after every turn, the repetition's peak (HostSampler) and the checkpoints its log shows."""
    clients = [workload.Client(run.port, None, rng.__class__(rng.random()), item["thinking_budget"])
               for _ in range(item["slots"])]
    for c in clients:
        c.max_turns = item["turns"]
    offset = len(s.log())
    sampler = HostSampler(s.p.pid)
    t0, turns = time.time(), []
    for turn in range(item["turns"]):
        t1 = time.time()
        recs = concurrent(run.port, [(lambda c=c: chat_turn(c, item, turn > 0)) for c in clients])
        turns.append({"turn": turn, "seconds": round(time.time() - t1, 2), "mem": proc_mem(s.p.pid),
                      "recs": recs})
        say("host38", item["name"], rep, turn, turns[-1]["seconds"], round(turns[-1]["mem"].get("VmRSS", 0)),
            sum("error" in q for q in recs))
    rec = {"rep": rep, "seconds": round(time.time() - t0, 2), "peak": sampler.stop(), "turns": turns,
           "ckpt": ckpt_log(s.log()[offset:])}
    say("host38", item["name"], rep, "peak", rec["peak"].get("VmRSS"), "held", rec["ckpt"]["held"],
        rec["ckpt"]["size_mib"])
    return rec


def host_memory_chats(run: ProofRun, build: str) -> None:
    """`host38:BUILD`: plan["host38"], each config's server (the v100_32gb argv at its slots and
    checkpoints), its host memory after load, a warm-up turn, then `runs` repetitions of chat_rep
    (fresh conversations a repetition, on the same server); the memory after. Each config's record
    is in the results from its start, every repetition saved as it ends."""
    from voltafleet.hostside import workload

    out = run.results.setdefault("host38", [])
    t = run.plan["host38"]
    if t["build"] != build:
        return
    for item in t["configs"]:
        s = run.server(build, item["name"], item["args"])
        r = {k: item[k] for k in ("name", "kind", "slots", "ckpt", "cms", "turns", "prompt_tokens",
                                  "answer_tokens", "thinking_budget")}
        r.update(build=build, args=s.args, healthy=s.ok, load_s=s.load_s, reps=[])
        out.append(r)  # in the results from the start: every repetition is saved as it ends
        try:
            if s.ok:
                time.sleep(2)
                r["mem_load"], r["gpu_load_mib"] = proc_mem(s.p.pid), gpu_mem(s.p.pid).get("proc_mib")
                warm = workload.Client(run.port, None, random.Random(38), item["thinking_budget"])
                r["warmup"] = chat_turn(warm, {**item, "prompt_tokens": 16, "answer_tokens": 8}, False)
                r["mem_warm"] = proc_mem(s.p.pid)
                for rep in range(t["runs"]):
                    r["reps"].append(chat_rep(run, s, item, rep, workload, random.Random(3800 + rep)))
                    run.save()
                r["mem_after"] = proc_mem(s.p.pid)
        finally:
            s.stop()
            r["log"], r["buffers"] = run.loglines(s), s.buffers()
            run.save()
