"""Conversation affinity, measured: multi-turn chats through the gateway with affinity on and
with least connections, same load, same run. Prints the mean TTFT of follow-up turns, the
prompt tokens each follow-up made the server process (llama-server's own timings), and each
instance's load: its time-averaged concurrent requests (HAProxy's `scur`, sampled on the
gateway every 0.25 s: what the bounded-load hash bounds) and its share of the requests.

    .venv/bin/python -m bench.lab.affinity [--conversations 24] [--turns 5] [--parallel 8] [--think 4] [--reps 2]
        [--factor 125] [--queue-timeout S]

bench/RESULTS.md's figures: --conversations 36 --turns 5 --parallel 28 --think 4 --queue-timeout 600 --reps 2.

The workload is a support desk's: every conversation opens with the same long system prompt
(~600 tokens, cached everywhere after the first request) and its own incident log (~1,000
tokens), then asks short follow-up questions about it, a user reading each answer for a while
before the next one (--think: a mean in seconds, exponential, the same draws in every mode). It serves Gemma 3 270M on the lab fleet
(a rollout with 4K tokens a slot), warms every instance directly, then runs the modes in turn
(off, on, off, on for --reps 2), each with conversations no earlier mode has seen, switching
`gateway_affinity` with a gateway-only pyinfra run; the lab's own configuration is put back at
the end. Loopback only; every loop is bounded. Raw record: reports/affinity.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

from lab.fleet import BRIDGE_ADDR, GATEWAY_PORT, GATEWAY_VIP, load_state
from voltafleet.front import gateway

REPO = Path(__file__).resolve().parents[2]

URL = f"http://{GATEWAY_VIP}:{GATEWAY_PORT}"  # the lab's gateway pair's one address
SYSTEM = ("You are the support assistant of a company that runs fleets of GPU servers for language models. "
          "Answer briefly, precisely and politely. ") * 24  # a long shared system prompt (~600 tokens)
WORDS = ("gpu driver server fleet rollout gateway slot cache prompt token model build compile kernel memory "
         "error warning restart drain health check latency throughput queue request stream client operator "
         "ticket incident node rack power fan temperature clock firmware reboot upgrade downgrade version "
         "branch commit release binary library toolkit nvcc cmake flag thread batch context window state "
         "checkpoint replica instance port socket timeout retry failure success pass fail log line journal "
         "unit service daemon network switch cable link bandwidth disk file download checksum mirror").split()


def incident(seed: str, words: int = 700) -> str:
    """A conversation's own incident log (~1,000 Gemma tokens), the same for the same seed."""
    rng = random.Random(seed)
    lines = []
    for i in range(words // 14):
        lines.append(f"{i:03d} " + " ".join(rng.choice(WORDS) for _ in range(14)) + ".")
    return "\n".join(lines)


def first_messages(seed: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Incident {seed}. Here is the log:\n{incident(seed)}\n\n"
                                        "Which component failed first?"}]


def ask(c: httpx.Client, messages: list[dict]) -> dict:
    t0 = time.monotonic()
    ttft, text, final = None, "", {}
    with c.stream("POST", "/v1/chat/completions", json={"messages": messages, "max_tokens": 16, "stream": True,
                                                         "temperature": 0}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            delta = (chunk.get("choices") or [{}])[0].get("delta", {}).get("content")
            if delta:
                ttft = ttft or (time.monotonic() - t0) * 1000
                text += delta
            if chunk.get("timings"):
                final = chunk["timings"]
    return {"ttft_ms": ttft, "text": text, "prompt_n": final.get("prompt_n"), "cache_n": final.get("cache_n"),
            "seconds": time.monotonic() - t0}


def think_s(seed: str, turn: int, mean_s: float) -> float:
    """The pause before a follow-up: exponential, drawn from the conversation's number and the turn, so
    that every mode's n-th conversation pauses the same."""
    return random.Random(f"{seed.rsplit('-', 1)[-1]}/{turn}").expovariate(1 / mean_s) if mean_s > 0 else 0.0


def conversation(c: httpx.Client, seed: str, turns: int, out: list, think: float = 0.0) -> None:
    messages = first_messages(seed)
    for turn in range(turns):
        if turn:
            time.sleep(think_s(seed, turn, think))
        r = ask(c, messages)
        out.append({"conversation": seed, "turn": turn, **{k: r[k] for k in ("ttft_ms", "prompt_n", "cache_n")}})
        messages += [{"role": "assistant", "content": r["text"] or "."},
                     {"role": "user", "content": f"Thanks. Question {turn + 1}: what should the operator check next?"}]


class Sampler:
    """HAProxy's per-server `scur` (requests in flight) every 0.25 s, from one ssh session on the gateway."""

    END = "#end"

    def __init__(self, gw_ssh: list[str]):
        loop = f"while :; do {gateway.runtime('show stat')}; echo '{self.END}'; sleep 0.25; done"
        self.p = subprocess.Popen(gw_ssh + [loop], stdout=subprocess.PIPE, text=True)
        self.samples: list[dict[str, int]] = []
        self.at: list[float] = []  # monotonic time of each sample
        self.t = threading.Thread(target=self.read, daemon=True)
        self.t.start()

    def read(self) -> None:
        block: list[str] = []
        for line in self.p.stdout:
            if line.strip() != self.END:
                block.append(line)
                continue
            rows = gateway.server_rows("".join(block))
            block = []
            if rows:
                self.samples.append({name: int(row["scur"] or 0) for name, row in rows.items()})
                self.at.append(time.monotonic())

    def stop(self, until: float | None = None) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
        """The samples while the load ran, and those of them taken before `until` (every user still busy)."""
        self.p.terminate()
        self.p.wait(timeout=10)
        self.t.join(timeout=10)
        busy = [(s, t) for s, t in zip(self.samples, self.at) if sum(s.values())]
        return [s for s, _ in busy], [s for s, t in busy if until is None or t < until]


def time_averaged(samples: list[dict[str, int]]) -> dict[str, float]:
    """Each instance's mean requests in flight over the samples."""
    return {k: round(statistics.mean(s.get(k, 0) for s in samples), 3) for k in samples[0]} if samples else {}


def over_bound(samples: list[dict[str, int]], factor: int) -> list[dict[str, int]]:
    """The samples where an instance held more requests than the bounded-load hash lets it take: the
    mean in flight times factor/100, in whole requests (HAProxy's hash-balance-factor), never below 1."""
    return [s for s in samples
            if max(s.values()) > max(1, math.ceil(sum(s.values()) * factor / 100 / len(s) - 1e-9))]


def totals(gw_ssh: list[str]) -> dict[str, int]:
    out = subprocess.run(gw_ssh + [gateway.runtime("show stat")], capture_output=True, text=True, check=True).stdout
    return {name: int(row["stot"]) for name, row in gateway.server_rows(out).items()}


def ratio(per: dict[str, float]) -> float | None:
    mean = statistics.mean(per.values()) if per else 0
    return round(max(per.values()) / mean, 2) if mean else None


def run_mode(tag: str, conversations: int, turns: int, parallel: int, gw_ssh: list[str], think: float = 0.0,
             factor: int = 125) -> dict:
    before = totals(gw_ssh)
    sampler = Sampler(gw_ssh)
    out: list[dict] = []
    t0 = time.monotonic()
    with httpx.Client(base_url=URL, timeout=600,
                      limits=httpx.Limits(max_connections=parallel, max_keepalive_connections=parallel)) as c:
        todo = [f"{tag}-{n}" for n in range(conversations)]
        lock = threading.Lock()
        drained: list[float] = []  # when a user found no conversation left: from then on, the tail
        failed: list[str] = []  # conversations a request of which failed: counted, never dropped unseen

        def worker():
            while True:
                with lock:
                    if not todo:
                        drained.append(time.monotonic())
                        return
                    seed = todo.pop(0)
                try:
                    conversation(c, seed, turns, out, think)
                except Exception as e:  # noqa: BLE001 - a failed request is a result of the run
                    with lock:
                        failed.append(f"{seed}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=worker) for _ in range(parallel)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=3600)
    seconds = time.monotonic() - t0
    samples, steady = sampler.stop(min(drained) if drained else None)
    concurrency, steady_concurrency = time_averaged(samples), time_averaged(steady)
    over = over_bound(samples, factor)
    after = totals(gw_ssh)
    per = {k: after[k] - before.get(k, 0) for k in after}
    follow = [r for r in out if r["turn"] > 0 and r["ttft_ms"] is not None]
    first = [r for r in out if r["turn"] == 0 and r["ttft_ms"] is not None]
    return {"tag": tag, "requests": len(out), "failed": len(failed), "failures": failed[:5],
            "seconds": round(seconds, 1),
            "follow_up_ttft_mean_ms": round(statistics.mean(r["ttft_ms"] for r in follow), 1),
            "follow_up_ttft_p50_ms": round(statistics.median(r["ttft_ms"] for r in follow), 1),
            "follow_up_prompt_tokens_mean": round(statistics.mean(r["prompt_n"] or 0 for r in follow), 1),
            # a follow-up that reprocessed its incident log (~1,000 tokens): its instance had no cache of it
            "follow_up_log_reprocessed": sum(1 for r in follow if (r["prompt_n"] or 0) > 500),
            "first_turn_ttft_mean_ms": round(statistics.mean(r["ttft_ms"] for r in first), 1),
            "first_turn_prompt_tokens_mean": round(statistics.mean(r["prompt_n"] or 0 for r in first), 1),
            "concurrency": concurrency, "max_over_mean_concurrency": ratio(concurrency),
            # the same while every user had a conversation to run (before the first ran out: the tail)
            "steady_samples": len(steady), "steady_concurrency": steady_concurrency,
            "steady_max_over_mean_concurrency": ratio(steady_concurrency),
            # the bounded-load check, sample by sample: an instance above factor/100 of the mean in flight
            "samples": len(samples), "samples_over_bound": len(over), "over_bound_examples": over[:5],
            "per_instance": per, "max_over_mean_requests": ratio(per), "turns": out}


def pyinfra(args: list[str], vars_: dict) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump(vars_, f)
    env = {**os.environ, "VOLTAFLEET_VARS": f.name}
    cmd = [str(Path(sys.executable).with_name("pyinfra")), "-y", *args, "inventory/lab.py", "deploy.py"]
    subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)


def warm(st: dict) -> None:
    """One request straight to every instance: the model's pages in, before any mode is timed."""
    for h in st["hosts"]:
        for i in range(2):
            with httpx.Client(base_url=f"http://{BRIDGE_ADDR}:{h['server_port_base'] + i}", timeout=300) as c:
                ask(c, first_messages(f"warm-{h['name']}-{i}")[:1] + [{"role": "user", "content": "Hello."}])


def summary(results: list[dict]) -> dict:
    """Per mode, the mean over its repetitions."""
    out = {}
    for mode in ("on", "off"):
        runs = [r for r in results if r["mode"] == mode]
        if runs:
            out[mode] = {k: round(statistics.mean(r[k] for r in runs), 2) for k in (
                "follow_up_ttft_mean_ms", "follow_up_prompt_tokens_mean", "first_turn_ttft_mean_ms",
                "max_over_mean_concurrency", "max_over_mean_requests", "follow_up_log_reprocessed")}
            steady = [r["steady_max_over_mean_concurrency"] for r in runs if r.get("steady_max_over_mean_concurrency")]
            out[mode]["steady_max_over_mean_concurrency"] = round(statistics.mean(steady), 2) if steady else None
            out[mode]["failed"] = sum(r.get("failed", 0) for r in runs)  # conversations cut by a failed request
            samples = sum(r.get("samples", 0) for r in runs)
            out[mode]["samples_over_bound_share"] = (
                round(sum(r.get("samples_over_bound", 0) for r in runs) / samples, 4) if samples else None)
    if {"on", "off"} <= set(out):
        out["follow_up_ttft_ratio"] = round(out["off"]["follow_up_ttft_mean_ms"] / out["on"]["follow_up_ttft_mean_ms"], 2)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=24)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--parallel", type=int, default=8)
    p.add_argument("--think", type=float, default=4.0, help="mean seconds a user reads before a follow-up")
    p.add_argument("--factor", type=int, default=125, help="gateway_hash_balance_factor under affinity")
    p.add_argument("--queue-timeout", type=int, default=None,
                   help="gateway_queue_timeout_s for the run (both modes); default: the group's")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--modes", nargs="+", default=["off", "on"])
    a = p.parse_args()
    st = load_state()
    g = st["gemma"]
    gemma = {"model_url": g["url"], "model_sha256": g["sha256"], "smoke_probe_prompt": g["prompt"],
             "server_ctx": 16384, "smoke_tokens": 16, "smoke_parallel": 2}
    gw_ssh = ["ssh", "-F", st["ssh_config"], st["gateway"]["name"]]  # the first gateway: it holds the address
    results: list[dict] = []
    record = {"argv": sys.argv, "conversations": a.conversations, "turns": a.turns, "parallel": a.parallel,
              "think_s": a.think, "factor": a.factor, "queue_timeout_s": a.queue_timeout, "runs": results}
    run_id = time.strftime("%H%M%S")
    queue = {"gateway_queue_timeout_s": a.queue_timeout} if a.queue_timeout else {}
    try:
        pyinfra([], gemma)  # every server serves Gemma, 4K tokens a slot
        warm(st)
        for rep in range(a.reps):
            for mode in a.modes:
                pyinfra(["--limit", "gateway"], {**gemma, "gateway_affinity": mode == "on",
                                                         "gateway_hash_balance_factor": a.factor, **queue})
                r = run_mode(f"{run_id}-{mode}{rep}", a.conversations, a.turns, a.parallel, gw_ssh, a.think, a.factor)
                results.append({"mode": mode, "rep": rep, **r})
                print(f"affinity {mode} (rep {rep}): " + json.dumps({k: v for k, v in r.items() if k != "turns"}),
                      flush=True)
    finally:
        pyinfra([], {})  # the lab's own configuration again
        record["summary"] = summary(results)
        (REPO / "reports").mkdir(exist_ok=True)
        (REPO / "reports" / "affinity.json").write_text(json.dumps(record, indent=1) + "\n")
    s = record["summary"]
    if "follow_up_ttft_ratio" in s:
        on, off = s["on"], s["off"]
        print(f"failed conversations: affinity {on['failed']}, least connections {off['failed']}")
        print(f"follow-up TTFT: affinity {on['follow_up_ttft_mean_ms']} ms, least connections "
              f"{off['follow_up_ttft_mean_ms']} ms ({s['follow_up_ttft_ratio']}x); prompt tokens a follow-up: "
              f"{on['follow_up_prompt_tokens_mean']} vs {off['follow_up_prompt_tokens_mean']}; max/mean concurrency "
              f"{on['max_over_mean_concurrency']} vs {off['max_over_mean_concurrency']}; max/mean requests "
              f"{on['max_over_mean_requests']} vs {off['max_over_mean_requests']}; samples with an instance above "
              f"the bound: {on['samples_over_bound_share']} vs {off['samples_over_bound_share']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
