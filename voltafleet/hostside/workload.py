#!/usr/bin/env python3
"""The tune's workload client, shipped to hosts (stdlib only), run on a drained canary:
`clients` keep-alive clients send `requests` streamed chat completions (/v1/chat/completions:
the server's own chat template, thinking on) to one llama-server, each a question of about
`prompt_tokens` tokens and an answer of `answer_tokens` (thinking included); a share of them
(`followup_share`) continue the client's conversation as a chat client does: the history is
sent back re-rendered by the template, each earlier answer as its content only (a client
never sends the thinking back, and the Qwen3.6 template drops it), so a follow-up leaves the
server's cached sequence where the last answer began, as real follow-ups do; the others start a
new one. Every client opens a conversation before the first repetition (not measured), and
conversations carry over from one repetition to the next, so follow-ups happen even when each
client sends one request a repetition; a conversation ends after MAX_TURNS turns. Repeated
`reps` times; each repetition's throughput, TTFT p50/p99 (all requests and follow-ups alone),
the share of follow-up prompts the server found cached, decode tok/s, the GPU's memory peak
(nvidia-smi; on the CPU backend the server's peak RSS) and the server's host memory peak
(sampled VmRSS) go out as one JSON line.

    python3 voltafleet-workload --port 8080 --clients 16 --requests 48 --reps 3 \\
        --prompt-tokens 1024 --answer-tokens 256 --followup-share 0.5 [--gpu 0] [--unit llama-server@0.service]
        [--pid PID] [--thinking-budget N]
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


HOST = ["127.0.0.1"]  # --host: the address the server binds (the host's own)
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
    the conversation it continues on follow-up turns, as the messages it sends back."""

    def __init__(self, port: int, key: str | None, rng: random.Random, thinking_budget: int | None = None):
        self.port, self.key, self.rng, self.thinking_budget = port, key, rng, thinking_budget
        self.conn = http.client.HTTPConnection(HOST[0], port, timeout=600)
        self.messages: list[dict] = []
        self.turns, self.max_turns = 0, MAX_TURNS

    def reset(self) -> None:
        """A new connection for the next request (after a stream, or one that failed)."""
        self.conn.close()
        self.conn = http.client.HTTPConnection(HOST[0], self.port, timeout=600)

    def body(self, messages: list[dict], answer_tokens: int, thinking_budget: int | None = None) -> bytes:
        body = {"messages": messages, "max_tokens": answer_tokens, "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True}, "cache_prompt": True, "temperature": 0}
        budget = self.thinking_budget if thinking_budget is None else thinking_budget
        if budget is not None:  # the thought ends after this many tokens, then the answer
            body["thinking_budget_tokens"] = budget
        return json.dumps(body).encode()

    def chat(self, messages: list[dict], answer_tokens: int, thinking_budget: int | None = None,
             headers: dict | None = None) -> dict:
        """One streamed chat completion of `messages` (the server renders them with the model's
        template, thinking on): its first and last token's time, the answer's content, the tokens
        streamed as thought and as answer, usage and the server's timings (cache_n: prompt tokens
        found cached, prompt_n: those processed). `answer_tokens` is max_tokens (thought included);
        `thinking_budget` overrides the client's. Raises on an HTTP error or an empty stream."""
        h = {"Content-Type": "application/json", **(headers or {})}
        if self.key:
            h["Authorization"] = f"Bearer {self.key}"
        t0 = time.monotonic()
        self.conn.request("POST", "/v1/chat/completions", self.body(messages, answer_tokens, thinking_budget), h)
        r = self.conn.getresponse()
        if r.status != 200:
            body = r.read()[:200]
            self.reset()
            raise RuntimeError(f"HTTP {r.status} {body!r}")
        first = last = None
        n = n_reasoning = n_content = 0
        answer, usage, timings = [], {}, {}
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            chunk = json.loads(line[5:])
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                piece, thought = delta.get("content"), delta.get("reasoning_content")
                if piece or thought:
                    now = time.monotonic()
                    first = first if first is not None else now
                    last, n = now, n + 1
                n_reasoning += bool(thought)
                n_content += bool(piece)
                if piece:
                    answer.append(piece)
            usage, timings = chunk.get("usage") or usage, chunk.get("timings") or timings
        r.read()
        # llama-server closes its side after a streamed answer without saying so: a new
        # connection for the next request rather than a request lost on a closed one
        self.reset()
        if first is None:
            raise RuntimeError("no token streamed")
        return {"start": t0, "first": first, "end": last, "chunks": n, "reasoning_chunks": n_reasoning,
                "content_chunks": n_content, "content": "".join(answer), "usage": usage, "timings": timings}

    def one(self, prompt_tokens: int, answer_tokens: int, followup: bool) -> dict:
        followup = followup and bool(self.messages) and self.turns < self.max_turns  # what is sent, not what was drawn
        if followup:
            messages = self.messages + [{"role": "user", "content": "And then? "
                                         + prompt(max(8, prompt_tokens // 8), self.rng)}]
        else:
            messages = [{"role": "user", "content": prompt(prompt_tokens, self.rng)}]
        got = self.chat(messages, answer_tokens)
        self.messages = history(messages, got["content"])
        self.turns = self.turns + 1 if followup else 1
        first, last, n = got["first"], got["end"], got["chunks"]
        tokens = int(got["usage"].get("completion_tokens") or n)
        return {"ttft_ms": (first - got["start"]) * 1000, "tokens": tokens, "start": got["start"], "end": last,
                "decode_tps": (n - 1) / (last - first) if last > first else None, "followup": followup,
                "cached_share": cached_share(got["timings"])}


def history(messages: list[dict], content: str) -> list[dict]:
    """The conversation a chat client sends back next turn: what it sent and the answer's content
    alone. A client never sends the thinking back (and the Qwen3.6 template drops it), so a follow-up
    leaves the server's cached sequence where the last answer began."""
    return messages + [{"role": "assistant", "content": content}]


def cached_share(timings: dict) -> float | None:
    """The share of a request's prompt the server found cached (llama-server's timings: cache_n
    tokens reused, prompt_n processed); None when the server did not say."""
    cached, fresh = timings.get("cache_n"), timings.get("prompt_n")
    if cached is None or not fresh:
        return None
    return cached / (cached + fresh)


def status_mib(pid: str | int, key: str = "VmRSS") -> float | None:
    """One memory line of the process's /proc status, MiB (VmRSS: resident now, VmHWM: its peak);
    None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class Peak:
    """The memory peaks while a repetition runs: the GPU's memory.used (MiB) or, on the CPU
    backend, the server process's peak resident set (VmHWM, MiB); and the server's host memory
    (its VmRSS sampled every 0.5 s, MiB) where its process is known (`pid`, or the unit's)."""

    def __init__(self, gpu: int | None, unit: str | None, pid: int | None = None):
        self.gpu, self.unit, self.pid = gpu, unit, pid
        self.peak = self.host_peak = None
        self.stop = threading.Event()

    def main_pid(self) -> str | None:
        if self.pid:
            return str(self.pid)
        if not self.unit:
            return None
        try:
            return subprocess.run(["systemctl", "show", "-P", "MainPID", self.unit], capture_output=True,
                                  text=True, timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            return None

    def read(self) -> float | None:
        try:
            if self.gpu is not None:
                out = subprocess.run(["nvidia-smi", "-i", str(self.gpu), "--query-gpu=memory.used",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
                return float(out.stdout.strip().splitlines()[0])
            pid = self.main_pid()
            if pid:
                return status_mib(pid, "VmHWM")
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            return None
        return None

    def read_host(self) -> float | None:
        pid = self.main_pid()
        return status_mib(pid) if pid else None

    def run(self) -> None:
        while not self.stop.is_set():
            for name, v in (("peak", self.read()), ("host_peak", self.read_host())):
                if v is not None:
                    old = getattr(self, name)
                    setattr(self, name, v if old is None else max(old, v))
            self.stop.wait(0.5)


def opened(a, key: str | None) -> list[Client]:
    """The clients, each with a conversation opened (one turn each, at once, not measured)."""
    rng = random.Random(1000)
    clients = [Client(a.port, key, random.Random(rng.random()), a.thinking_budget) for _ in range(a.clients)]

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

    peak = Peak(a.gpu, a.unit, a.pid)
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
    mem, host = (highest(old, now) for old, now in ((peak.peak, peak.read()), (peak.host_peak, peak.read_host())))
    ttft = [r["ttft_ms"] for r in results]
    follow = [r for r in results if r["followup"]]
    decode = [r["decode_tps"] for r in results if r["decode_tps"]]
    return {"requests": len(results), "errors": errors, "seconds": round(wall, 3),
            "throughput_tps": round(sum(r["tokens"] for r in results) / wall, 2) if results else None,
            "ttft_p50_ms": percentile(ttft, 50), "ttft_p99_ms": percentile(ttft, 99),
            "followup_ttft_p50_ms": percentile([r["ttft_ms"] for r in follow], 50),
            "followup_cached_p50": percentile([r["cached_share"] for r in follow if r["cached_share"] is not None], 50),
            "followup_cached_max": max((r["cached_share"] for r in follow if r["cached_share"] is not None), default=None),
            "decode_tps": percentile(decode, 50), "peak_mib": mem, "host_peak_mib": host,
            "followups": len(follow)}


def highest(*values: float | None) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="voltafleet's tune workload")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1", help="the address the server binds (default 127.0.0.1)")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--answer-tokens", type=int, default=64)
    p.add_argument("--followup-share", type=float, default=0.5)
    p.add_argument("--api-key-file")
    p.add_argument("--gpu", type=int, help="the instance's GPU (nvidia-smi index) for the memory peak")
    p.add_argument("--unit", help="the instance's systemd unit (its process: host memory; CPU backend: its peak RSS)")
    p.add_argument("--pid", type=int, help="the server's process, where no unit names it (host memory)")
    p.add_argument("--thinking-budget", type=int, help="thinking tokens before the answer (the server forces the "
                   "end of the thought); none: the model ends it itself")
    a = p.parse_args(argv)
    HOST[0] = a.host
    key = open(a.api_key_file).read().strip() if a.api_key_file else None
    probe = Peak(a.gpu, a.unit, a.pid)
    after_load = probe.read() if a.gpu is not None else None
    host_before = probe.read_host()
    clients = opened(a, key)
    reps = [repetition(a, clients, seed) for seed in range(a.reps)]
    print(json.dumps({"port": a.port, "after_load_mib": after_load, "host_before_mib": host_before, "reps": reps}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
