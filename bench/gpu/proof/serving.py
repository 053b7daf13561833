"""A server's rounds: after a warm-up, N concurrent streams at once (TTFT and every token's arrival
kept), multi-turn conversations on the prompt cache, and n-gram drafting.

    serve[:A+B]      each plan["serve"] config (or those named): 3 rounds of 1 and N streams, then
                     multi-turn conversations where the config has them
    serve27:BUILD    issue 27: the shipped argv on that build, 3 rounds at 1/4/16 clients,
                     512-token prompts
    spec[:A+B]       each plan["spec"] config (or those named): n-gram drafting, drafts drafted and
                     accepted, each text's hash
"""
from __future__ import annotations

from bench.gpu.proof.runner import ProofRun, concurrent, wall_rate
from bench.gpu.qwen35_bench import complete, gpu_mem, prompt_ids, say

ROUND_KEYS = ("ttft_ms", "t_start", "times_ms", "n", "decode_tps", "prompt_n", "prompt_ms", "cache_n", "error")
SPEC_KEYS = ("ttft_ms", "t_start", "times_ms", "n", "decode_tps", "draft_n", "draft_accepted", "text_sha", "error")


def one_round(run: ProofRun, k: int, tokens: int, plen: int, tag: int) -> list:
    """k requests at once, each its own plen-token prompt (seeded by tag), `tokens` tokens each."""
    recs = concurrent(run.port, [(lambda i=i: complete(run.port, prompt_ids(tag * 100 + i, plen), tokens))
                                 for i in range(k)])
    return [{key: r.get(key) for key in ROUND_KEYS} for r in recs]


def rounds(run: ProofRun, r: dict, item: dict, runs: int, tag) -> None:
    """A warm-up, then `runs` rounds at each of item's client counts into r["rounds"] (saved
    after each); tag(rep, k) seeds the round's distinct prompts."""
    one_round(run, 1, 8, 32, 9900)
    for rep in range(runs):
        for k in item["streams"]:
            recs = one_round(run, k, item["tokens"], item["prompt"], tag(rep, k))
            r["rounds"].append({"rep": rep, "streams": k, "recs": recs})
            run.save()


def conversation(run: ProofRun, conv: int, m: dict, rep: int) -> list:
    """One conversation of m["turns"] turns on the prompt cache: each turn's prompt is the last one,
    its reply and a new user turn (token ids, no chat template)."""
    prompt = prompt_ids(5000 + 100 * rep + conv, m["first"])
    turns = []
    for t in range(m["turns"]):
        r = complete(run.port, prompt, m["reply"], cache_prompt=True)
        turns.append({k: r.get(k) for k in ("ttft_ms", "prompt_n", "prompt_ms", "cache_n", "n", "decode_tps",
                                             "error")} | {"turn": t, "prompt_len": len(prompt)})
        prompt = prompt + prompt_ids(7000 + conv, m["reply"]) + prompt_ids(9000 + 1000 * t + conv, m["turn"])
    return turns


def serve_configs(run: ProofRun, names: str = "") -> None:
    """`serve[:A+B]`: each plan["serve"] config (those named, if any): plan["runs"] rounds at each
    stream count, then as many repetitions of its concurrent conversations (item["multi"])."""
    out = run.results.setdefault("serve", [])
    for item in run.plan["serve"]:
        if names and item["name"] not in names.split("+"):
            continue
        s = run.server(item.get("build", "default"), item["name"], item["args"])
        r = {"name": item["name"], "build": item.get("build", "default"), "args": s.args, "healthy": s.ok, "load_s": s.load_s, "rounds": [], "multi": []}
        try:
            if s.ok:
                rounds(run, r, item, run.plan["runs"], lambda rep, k: 1000 * (rep + 1) + k)
                m = item.get("multi")
                for rep in range(run.plan["runs"] if m else 0):
                    convs = concurrent(run.port, [(lambda c=c: conversation(run, c, m, rep))
                                                  for c in range(m["conversations"])])
                    r["multi"].append({"rep": rep, **m, "convs": convs})
                r["mem_after"] = gpu_mem(s.p.pid).get("proc_mib")
        finally:
            run.close(s, r, out)
        say("serve", item["name"], s.ok, [(x["streams"], wall_rate(x["recs"])) for x in r["rounds"]])


def serve_shipped(run: ProofRun, build: str) -> None:
    """`serve27:BUILD`: the shipped argv: a warm-up, then runs27 rounds at each client count
    (distinct 512-token prompts, 128 tokens): TTFT and every token's arrival kept."""
    out = run.results.setdefault("serve27", [])
    for item in run.plan["serve27"]:
        if item["build"] != build:
            continue
        s = run.server(build, item["name"], item["args"])
        r = {"name": item["name"], "build": build, "group": item["group"], "args": s.args, "healthy": s.ok,
             "load_s": s.load_s, "rounds": []}
        try:
            if s.ok:
                rounds(run, r, item, run.plan["runs27"], lambda rep, k: 2000 + 100 * rep + k)
                r["mem_after"] = gpu_mem(s.p.pid).get("proc_mib")
        finally:
            run.close(s, r, out)
        say("serve27", build, item["name"], [(x["streams"], wall_rate(x["recs"])) for x in r["rounds"]])


def spec_prompt(kind: str, i: int) -> list:
    """`plain`: 128 distinct tokens; `repeat`: one 32-token run 8 times (n-grams to draft from)."""
    return prompt_ids(i, 128) if kind.split("-")[0] == "plain" else prompt_ids(i, 32) * 8


def spec_sampling(kind: str, i: int) -> dict | None:
    """`-kN`: sampled from the top N tokens at temperature 1 (seeded); else greedy."""
    k = kind.partition("-k")[2]
    return {"temperature": 1.0, "top_k": int(k), "top_p": 1.0, "min_p": 0.0, "seed": i} if k else None


def spec_round(run: ProofRun, item: dict, kind: str, k: int, tag: int) -> list:
    """k requests of prompt `kind` at once (prompt cache off): each one's SPEC_KEYS."""
    recs = concurrent(run.port, [
        (lambda i=i: complete(run.port, spec_prompt(kind, tag * 100 + i), item["tokens"],
                              sampling=spec_sampling(kind, tag * 100 + i)))
        for i in range(k)])
    return [{x: q.get(x) for x in SPEC_KEYS} for q in recs]


def ngram_drafting(run: ProofRun, names: str = "") -> None:
    """`spec[:A+B]`: each plan["spec"] server (those named, if any): a warm-up, then plan["runs"]
    rounds of each prompt kind at each stream count (greedy, prompt cache off), every request's
    TTFT, token times, drafts drafted and accepted, and its text's hash (speculation must not change
    greedy output)."""
    out = run.results.setdefault("spec", [])
    for item in run.plan["spec"]:
        if names and item["name"] not in names.split("+"):
            continue
        s = run.server(item["build"], item["name"], item["args"])
        r = {"name": item["name"], "build": item["build"], "args": s.args, "healthy": s.ok, "load_s": s.load_s,
             "rounds": []}
        try:
            if s.ok:
                complete(run.port, prompt_ids(9900, 32), 8)  # warm-up
                for rep in range(run.plan["runs"]):
                    for kind in item.get("kinds", ["plain", "repeat"]):
                        for k in item["streams"]:
                            recs = spec_round(run, item, kind, k, 1000 * (rep + 1) + k)
                            r["rounds"].append({"rep": rep, "kind": kind, "streams": k, "recs": recs})
                            run.save()
                r["mem_after"] = gpu_mem(s.p.pid).get("proc_mib")
        finally:
            run.close(s, r, out)
        say("spec", item["name"], s.ok, [(x["kind"], x["streams"], wall_rate(x["recs"]),
                                          sum(q.get("draft_accepted") or 0 for q in x["recs"]))
                                         for x in r["rounds"]])
