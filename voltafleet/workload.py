#!/usr/bin/env python3
"""The tune's workload client, shipped to hosts (stdlib only), run on a drained canary:
`clients` keep-alive clients send `requests` streamed completions to one llama-server,
each a prompt of about `prompt_tokens` tokens and an answer of `answer_tokens`; a share
of them (`followup_share`) continue the client's conversation (its turns so far and a new
question: the server's prompt cache serves the prefix), the others start a new one. Every
client opens a conversation before the first repetition (not measured), and conversations
carry over from one repetition to the next, so follow-ups happen even when each client
sends one request a repetition; a conversation ends after MAX_TURNS turns. Repeated `reps` times; each
repetition's throughput, TTFT p50/p99, decode tok/s and memory peak (the GPU's, sampled
with nvidia-smi, or on the CPU backend the server's peak RSS) go out as one JSON line.

    python3 voltafleet-workload --port 8080 --clients 16 --requests 48 --reps 3 \\
        --prompt-tokens 1024 --answer-tokens 256 --followup-share 0.5 [--gpu 0] [--unit llama-server@0.service]
"""
from __future__ import annotations

import argparse
import http.client
import json
import random
import subprocess
import threading
import time

WORDS = ("the fleet serves every team its answer while the canary measures what wins on its own "
         "hardware under the plan").split()


MAX_TURNS = 4  # a conversation's turns before the client starts a new one (bounds the prompt)


def prompt(n_tokens: int, rng: random.Random) -> str:
    """About n_tokens tokens of plain words (a word is about one token), varied so that two
    conversations do not share a cached prefix."""
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n_tokens)))


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


class Client:
    """One client with its connection (renewed after each stream, as llama-server closes it);
    a conversation it continues on follow-up turns."""

    def __init__(self, port: int, key: str | None, rng: random.Random):
        self.port, self.key, self.rng = port, key, rng
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        self.history, self.turns = "", 0

    def reset(self) -> None:
        """A new connection for the next request (after a stream, or one that failed)."""
        self.conn.close()
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)

    def one(self, prompt_tokens: int, answer_tokens: int, followup: bool) -> dict:
        followup = followup and bool(self.history) and self.turns < MAX_TURNS  # what is sent, not what was drawn
        if followup:
            text = self.history + "\nAnd then? " + prompt(max(8, prompt_tokens // 8), self.rng)
        else:
            text, self.turns = prompt(prompt_tokens, self.rng), 0
        body = json.dumps({"prompt": text, "n_predict": answer_tokens, "stream": True, "ignore_eos": True,
                           "cache_prompt": True, "temperature": 0}).encode()
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        t0 = time.monotonic()
        self.conn.request("POST", "/completion", body, headers)
        r = self.conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status} {r.read()[:200]!r}")
        first = last = None
        n, answer, final = 0, [], {}
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            chunk = json.loads(line[5:])
            if chunk.get("content"):
                now = time.monotonic()
                first = first if first is not None else now
                last, n = now, n + 1
                answer.append(chunk["content"])
            if chunk.get("stop"):
                final = chunk
                break
        r.read()
        # llama-server closes its side after a streamed answer without saying so: a new
        # connection for the next request rather than a request lost on a closed one
        self.reset()
        if first is None:
            raise RuntimeError("no token streamed")
        self.history, self.turns = text + "".join(answer), self.turns + 1
        tokens = int(final.get("tokens_predicted") or n)
        return {"ttft_ms": (first - t0) * 1000, "tokens": tokens, "start": t0, "end": last,
                "decode_tps": (n - 1) / (last - first) if last > first else None, "followup": followup}


class Peak:
    """The memory peak while a repetition runs: the GPU's memory.used (MiB) or, on the CPU
    backend, the server process's peak resident set (VmHWM, MiB)."""

    def __init__(self, gpu: int | None, unit: str | None):
        self.gpu, self.unit, self.peak, self.stop = gpu, unit, None, threading.Event()

    def read(self) -> float | None:
        try:
            if self.gpu is not None:
                out = subprocess.run(["nvidia-smi", "-i", str(self.gpu), "--query-gpu=memory.used",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
                return float(out.stdout.strip().splitlines()[0])
            if self.unit:
                pid = subprocess.run(["systemctl", "show", "-P", "MainPID", self.unit], capture_output=True,
                                     text=True, timeout=10).stdout.strip()
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            return int(line.split()[1]) / 1024
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            return None
        return None

    def run(self) -> None:
        while not self.stop.is_set():
            v = self.read()
            if v is not None:
                self.peak = v if self.peak is None else max(self.peak, v)
            self.stop.wait(0.5)


def opened(a, key: str | None) -> list[Client]:
    """The clients, each with a conversation opened (one turn each, at once, not measured)."""
    rng = random.Random(1000)
    clients = [Client(a.port, key, random.Random(rng.random())) for _ in range(a.clients)]

    def first(c: Client) -> None:
        try:
            c.one(a.prompt_tokens, a.answer_tokens, False)
        except Exception:  # not measured: the repetitions count theirs; a client without a conversation opens one there
            c.reset()

    threads = [threading.Thread(target=first, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return clients


def repetition(a, clients: list[Client], seed: int) -> dict:
    rng = random.Random(seed)
    lock = threading.Lock()
    todo = list(range(a.requests))
    results, errors = [], []

    def work(c: Client) -> None:
        while True:
            with lock:
                if not todo:
                    return
                todo.pop()
                followup = rng.random() < a.followup_share
            try:
                rec = c.one(a.prompt_tokens, a.answer_tokens, followup)
                with lock:
                    results.append(rec)
            except Exception as e:  # counted, the verdict fails on it
                with lock:
                    errors.append(f"{type(e).__name__}: {e}"[:200])
                c.reset()

    peak = Peak(a.gpu, a.unit)
    watcher = threading.Thread(target=peak.run, daemon=True)
    watcher.start()
    threads = [threading.Thread(target=work, args=(c,)) for c in clients]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    peak.stop.set()
    watcher.join()
    last = peak.read()
    mem = max(v for v in (peak.peak, last) if v is not None) if (peak.peak, last) != (None, None) else None
    ttft = [r["ttft_ms"] for r in results]
    decode = [r["decode_tps"] for r in results if r["decode_tps"]]
    return {"requests": len(results), "errors": errors, "seconds": round(wall, 3),
            "throughput_tps": round(sum(r["tokens"] for r in results) / wall, 2) if results else None,
            "ttft_p50_ms": percentile(ttft, 50), "ttft_p99_ms": percentile(ttft, 99),
            "decode_tps": percentile(decode, 50), "peak_mib": mem,
            "followups": sum(r["followup"] for r in results)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="voltafleet's tune workload")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--answer-tokens", type=int, default=64)
    p.add_argument("--followup-share", type=float, default=0.5)
    p.add_argument("--api-key-file")
    p.add_argument("--gpu", type=int, help="the instance's GPU (nvidia-smi index) for the memory peak")
    p.add_argument("--unit", help="the instance's systemd unit (CPU backend: its process's peak RSS)")
    a = p.parse_args(argv)
    key = open(a.api_key_file).read().strip() if a.api_key_file else None
    after_load = Peak(a.gpu, None).read() if a.gpu is not None else None
    clients = opened(a, key)
    reps = [repetition(a, clients, seed) for seed in range(a.reps)]
    print(json.dumps({"port": a.port, "after_load_mib": after_load, "reps": reps}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
