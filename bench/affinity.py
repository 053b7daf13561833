"""Conversation affinity, measured: multi-turn chats through the gateway with affinity on and
with least connections, same load, same run. Prints the mean TTFT of follow-up turns, the
prompt tokens each follow-up made the server process (llama-server's own timings), and each
instance's share of the requests (HAProxy's per-server totals).

    .venv/bin/python bench/affinity.py --conversations 12 --turns 5 [--modes on off]

It serves Gemma 3 270M on the lab fleet (a rollout with 4K tokens a slot), switches the
gateway's `gateway_affinity` for each mode (a gateway-only pyinfra run), and puts the lab's
own configuration back at the end. Loopback only; every loop is bounded.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lab.fleet import load_state  # noqa: E402

URL = "http://127.0.0.1:18800"
SYSTEM = ("You are the support assistant of a company that runs fleets of GPU servers for language models. "
          "Answer briefly, precisely and politely. ") * 24  # a long shared system prompt (~600 tokens)


def stats(gw_ssh: list[str]) -> dict[str, int]:
    out = subprocess.run(gw_ssh + ["echo 'show stat' | socat stdio UNIX-CONNECT:/run/haproxy/admin.sock"],
                         capture_output=True, text=True, check=True).stdout
    cols = out.splitlines()[0][2:].split(",")
    return {r.split(",")[1]: int(dict(zip(cols, r.split(",")))["stot"]) for r in out.splitlines()[1:]
            if r.startswith("llama,") and r.split(",")[1] not in ("FRONTEND", "BACKEND")}


def conversation(c: httpx.Client, n: int, turns: int, out: list) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Customer {n}: what is a GPU?"}]
    for turn in range(turns):
        t0 = time.monotonic()
        ttft = None
        final = {}
        with c.stream("POST", "/v1/chat/completions", json={"messages": messages, "max_tokens": 16, "stream": True,
                                                             "temperature": 0, "timings_per_token": False}) as r:
            r.raise_for_status()
            text = ""
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
        out.append({"conversation": n, "turn": turn, "ttft_ms": ttft, "prompt_n": final.get("prompt_n"),
                    "cache_n": final.get("cache_n")})
        messages += [{"role": "assistant", "content": text or "."},
                     {"role": "user", "content": f"Thanks. Follow-up question {turn + 1} from customer {n}?"}]


def run_mode(conversations: int, turns: int, parallel: int, gw_ssh: list[str]) -> dict:
    before = stats(gw_ssh)
    out: list[dict] = []
    with httpx.Client(base_url=URL, timeout=300,
                      limits=httpx.Limits(max_connections=parallel, max_keepalive_connections=parallel)) as c:
        todo = list(range(conversations))
        lock = threading.Lock()

        def worker():
            while True:
                with lock:
                    if not todo:
                        return
                    n = todo.pop(0)
                conversation(c, n, turns, out)

        threads = [threading.Thread(target=worker) for _ in range(parallel)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=1800)
    after = stats(gw_ssh)
    per = {k: after[k] - before.get(k, 0) for k in after}
    follow = [r for r in out if r["turn"] > 0 and r["ttft_ms"] is not None]
    mean_load = statistics.mean(per.values()) if per else 0
    return {"requests": len(out), "follow_up_ttft_mean_ms": round(statistics.mean(r["ttft_ms"] for r in follow), 1),
            "follow_up_ttft_p50_ms": round(statistics.median(r["ttft_ms"] for r in follow), 1),
            "follow_up_prompt_tokens_mean": round(statistics.mean(r["prompt_n"] or 0 for r in follow), 1),
            "first_turn_ttft_mean_ms": round(statistics.mean(r["ttft_ms"] for r in out if r["turn"] == 0), 1),
            "per_instance": per, "max_over_mean_load": round(max(per.values()) / mean_load, 2) if mean_load else None}


def pyinfra(args: list[str], vars_: dict) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump(vars_, f)
    env = {**os.environ, "VOLTAFLEET_VARS": f.name}
    cmd = [str(Path(sys.executable).with_name("pyinfra")), "-y", *args, "inventory/lab.py", "deploy.py"]
    subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=12)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--parallel", type=int, default=6)
    p.add_argument("--modes", nargs="+", default=["on", "off"])
    a = p.parse_args()
    st = load_state()
    g = st["gemma"]
    gemma = {"model_url": g["url"], "model_sha256": g["sha256"], "smoke_probe_prompt": g["prompt"],
             "server_ctx": 16384, "smoke_tokens": 16, "smoke_parallel": 2}
    gw_ssh = ["ssh", "-F", st["ssh_config"], st["gateway"]["name"]]
    results = {}
    try:
        pyinfra([], gemma)  # every server serves Gemma, 4K tokens a slot
        for mode in a.modes:
            pyinfra(["--limit", st["gateway"]["name"]], {**gemma, "gateway_affinity": mode == "on"})
            results[mode] = run_mode(a.conversations, a.turns, a.parallel, gw_ssh)
            print(f"affinity {mode}: {json.dumps(results[mode])}", flush=True)
    finally:
        pyinfra([], {})  # the lab's own configuration again
    if {"on", "off"} <= set(results):
        on, off = results["on"], results["off"]
        print(f"follow-up TTFT: affinity {on['follow_up_ttft_mean_ms']} ms, least connections "
              f"{off['follow_up_ttft_mean_ms']} ms ({off['follow_up_ttft_mean_ms'] / on['follow_up_ttft_mean_ms']:.2f}x); "
              f"prompt tokens a follow-up: {on['follow_up_prompt_tokens_mean']} vs {off['follow_up_prompt_tokens_mean']}; "
              f"max/mean load {on['max_over_mean_load']} vs {off['max_over_mean_load']}")
    (REPO / "reports").mkdir(exist_ok=True)
    (REPO / "reports" / "affinity.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
