"""llama-server's host memory under real multi-turn chats, and what context checkpoints cost and
save (issue 38), on the shipped build (FORCE_MMQ).

    host38:BUILD    plan["host38"] (when its build is BUILD): each config's server at its slots and
                    checkpoint count, concurrent chats through voltafleet's workload client
"""
from __future__ import annotations

import random
import re
import time

import os

from bench.gpu.proof.runner import HostSampler, ProofRun, cgroup_mem, concurrent, proc_mem
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


def chat_rep(run: ProofRun, s: Server, item: dict, rep: int, workload, rng, cgroup: str | None = None) -> dict:
    """One repetition: `slots` fresh conversations of `turns` turns, each turn's requests at once;
    the memory after every turn, the repetition's peak (HostSampler) and the checkpoints its log shows;
    with `cgroup`, the cgroup's figures beside the process's."""
    clients = [workload.Client(run.port, None, rng.__class__(rng.random()), item["thinking_budget"])
               for _ in range(item["slots"])]
    for c in clients:
        c.max_turns = item["turns"]
    offset = len(s.log())
    sampler = HostSampler(s.p.pid, cgroup)
    t0, turns = time.time(), []
    for turn in range(item["turns"]):
        t1 = time.time()
        recs = concurrent(run.port, [(lambda c=c: chat_turn(c, item, turn > 0)) for c in clients])
        turns.append({"turn": turn, "seconds": round(time.time() - t1, 2), "mem": proc_mem(s.p.pid),
                      "recs": recs, **({"cgroup": cgroup_mem(cgroup)} if cgroup else {})})
        say("host38", item["name"], rep, turn, turns[-1]["seconds"], round(turns[-1]["mem"].get("VmRSS", 0)),
            sum("error" in q for q in recs))
    rec = {"rep": rep, "seconds": round(time.time() - t0, 2), "peak": sampler.stop(), "turns": turns,
           "ckpt": ckpt_log(s.log()[offset:])}
    say("host38", item["name"], rep, "peak", rec["peak"].get("VmRSS"), "held", rec["ckpt"]["held"],
        rec["ckpt"]["size_mib"])
    if cgroup:
        cg = rec["peak"].get("cgroup", {})
        say("host49", item["name"], rep, "cgroup peak unreclaimable", round(cg.get("cg_unreclaimable", 0)),
            "current", round(cg.get("cg_current", 0)), "file", round(cg.get("cg_file", 0)),
            "kernel peak", round(cg.get("cg_peak") or 0), "events", cg.get("cg_events"))
    return rec


def make_cgroup(name: str, max_mib: int) -> str:
    """A cgroup v2 folder for one server, its memory.max the unit's MemoryMax (no swap): the ceiling a
    systemd unit of the plan would get, enforced by this machine's kernel."""
    path = f"/sys/fs/cgroup/vf-{name}"
    os.makedirs(path, exist_ok=True)
    with open(f"{path}/memory.max", "w") as f:
        f.write(str(max_mib << 20))
    if os.path.exists(f"{path}/memory.swap.max"):
        with open(f"{path}/memory.swap.max", "w") as f:
            f.write("0")
    return path


def host_memory_chats(run: ProofRun, build: str, key: str = "host38") -> None:
    """`host38:BUILD`: plan["host38"], each config's server (the v100_32gb argv at its slots and
    checkpoints), its host memory after load, a warm-up turn, then `runs` repetitions of chat_rep (the config's
    own `runs` where it has one)
    (fresh conversations a repetition, on the same server); the memory after. Each config's record
    is in the results from its start, every repetition saved as it ends."""
    from voltafleet.hostside import workload

    out = run.results.setdefault(key, [])
    t = run.plan[key]
    if t["build"] != build:
        return
    for item in t["configs"]:
        cgroup, why = None, None
        if item.get("memory_max_mib"):
            try:
                cgroup = make_cgroup(item["name"], item["memory_max_mib"])
            except OSError as e:  # no writable cgroup v2 here: the process's figures alone, and why
                why = repr(e)
        s = run.server(build, item["name"], item["args"], cgroup=cgroup)
        r = {k: item[k] for k in ("name", "kind", "slots", "ckpt", "cms", "turns", "prompt_tokens",
                                  "answer_tokens", "thinking_budget")}
        r.update(build=build, args=s.args, healthy=s.ok, load_s=s.load_s, reps=[],
                 **({"memory_max_mib": item["memory_max_mib"], "planned_mib": item["planned_mib"],
                     "cgroup_load": cgroup_mem(cgroup), "cgroup_error": why} if item.get("memory_max_mib") else {}))
        out.append(r)  # in the results from the start: every repetition is saved as it ends
        try:
            if s.ok:
                time.sleep(2)
                r["mem_load"], r["gpu_load_mib"] = proc_mem(s.p.pid), gpu_mem(s.p.pid).get("proc_mib")
                warm = workload.Client(run.port, None, random.Random(38), item["thinking_budget"])
                r["warmup"] = chat_turn(warm, {**item, "prompt_tokens": 16, "answer_tokens": 8}, False)
                r["mem_warm"] = proc_mem(s.p.pid)
                for rep in range(item.get("runs", t["runs"])):  # a config's own count, else the plan's
                    r["reps"].append(chat_rep(run, s, item, rep, workload, random.Random(3800 + rep), cgroup))
                    run.save()
                r["mem_after"] = proc_mem(s.p.pid)
        finally:
            r["alive_at_end"] = s.p.poll() is None  # not killed by its cgroup's ceiling
            r["cgroup_end"] = cgroup_mem(cgroup)
            s.stop()
            r["log"], r["buffers"] = run.loglines(s), s.buffers()
            if cgroup:
                r["cgroup_end"]["events_after_stop"] = cgroup_mem(cgroup).get("cg_events")
                try:
                    os.rmdir(cgroup)
                except OSError:
                    pass
            run.save()


def host_memory_validation(run: ProofRun, build: str) -> None:
    """`host49:BUILD`: plan["host49"] (issue 49's validation run: the process term at 4, 8, 16 and 24 slots,
    the checkpoints at 0, 4, 8 and 32, the worst case), each server in a cgroup of its own whose memory.max is
    the unit's MemoryMax: RSS and the cgroup's charge beside the plan, on a run the constants were not fitted on."""
    host_memory_chats(run, build, key="host49")
