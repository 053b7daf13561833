"""What a thinking budget costs or saves (issue 32), on the Volta-rule build: streamed chat
completions (the chat template, --jinja) over kept-alive connections, every reasoning and content
chunk's arrival kept.

    think32:BUILD   plan["think32"] (when its build is BUILD): thinking off, budgets 0/256/1024 and
                    unbounded, at 1 and 16 clients, 3 repetitions
"""
from __future__ import annotations

import http.client
import json
import select
import socket
import time

from bench.gpu.proof.runner import ProofRun, concurrent
from bench.gpu.qwen35_bench import gpu_mem, say


class KeepAlive(http.client.HTTPConnection):
    """One client's connection, kept open from one request to the next (a pooled keep-alive
    client); counts its TCP connects. Like curl's and httpx's pools it checks a kept connection
    before reuse and opens a new one when the server has closed it (llama-server at the pin closes
    the connection after every streamed response, though its headers say Keep-Alive), and sends
    once more on a fresh connection when a kept one turns out closed before any answer."""
    connects = 0

    def connect(self):
        self.connects += 1
        super().connect()

    def alive(self) -> bool:
        if self.sock is None:
            return False
        if not select.select([self.sock], [], [], 0)[0]:
            return True
        try:
            return self.sock.recv(1, socket.MSG_PEEK) != b""
        except OSError:
            return False

    def post(self, path: str, body: str) -> http.client.HTTPResponse:
        for attempt in (0, 1):
            if not self.alive():
                self.close()
            try:
                self.request("POST", path, body, {"Content-Type": "application/json"})
                return self.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")


def chat(conn: KeepAlive, body: dict) -> dict:
    """One streamed /v1/chat/completions over `conn`: the arrival (ms after the request was sent)
    of every reasoning_content and every content chunk (one token each: the zero-weight model
    emits one-token pieces), the finish reason, the final chunk's timings and usage."""
    before, t0 = conn.connects, time.time()
    try:
        r = conn.post("/v1/chat/completions", json.dumps(body))
        if r.status != 200:
            return {"error": f"HTTP {r.status}: {r.read()[:300]!r}", "t_start": t0}
        rt, ct, rtext, ctext, finish, timings, usage = [], [], [], [], None, {}, {}
        while True:
            line = r.readline()  # to the end of the chunked body, so the connection is reused
            if not line:
                break
            if not line.startswith(b"data: ") or line[6:].strip() == b"[DONE]":
                continue
            d = json.loads(line[6:])
            now = round((time.time() - t0) * 1000, 1)
            for ch in d.get("choices") or []:
                delta = ch.get("delta") or {}
                if delta.get("reasoning_content"):
                    rt.append(now)
                    rtext.append(delta["reasoning_content"])
                if delta.get("content"):
                    ct.append(now)
                    ctext.append(delta["content"])
                finish = ch.get("finish_reason") or finish
            timings, usage = d.get("timings") or timings, d.get("usage") or usage
    except (OSError, http.client.HTTPException, ValueError) as e:
        conn.close()
        return {"error": repr(e), "t_start": t0}
    rec = {"t_start": t0, "reasoning_ms": rt, "content_ms": ct, "finish": finish,
           "reasoning_head": "".join(rtext)[:8], "reasoning_tail": "".join(rtext)[-8:],
           "content_head": "".join(ctext)[:8], "connects": conn.connects - before,
           "predicted_n": timings.get("predicted_n"), "decode_tps": timings.get("predicted_per_second"),
           "prompt_n": timings.get("prompt_n"), "prompt_ms": timings.get("prompt_ms"),
           "cache_n": timings.get("cache_n"), "completion_tokens": usage.get("completion_tokens")}
    return rec | think_figures(rec)


def rate(times_ms: list) -> float | None:
    """Tokens a second between a phase's first and last chunk (None under 3 chunks)."""
    if len(times_ms) < 3 or times_ms[-1] <= times_ms[0]:
        return None
    return (len(times_ms) - 1) / ((times_ms[-1] - times_ms[0]) / 1000)


def think_figures(rec: dict) -> dict:
    """A request's figures from its chunk arrivals: time to the first reasoning token, to the
    answer's first token, tokens of each phase and the decode rate while thinking and after."""
    rt, ct = rec.get("reasoning_ms") or [], rec.get("content_ms") or []
    return {"ttfr_ms": rt[0] if rt else None, "answer_ms": ct[0] if ct else None, "n_reasoning": len(rt),
            "n_content": len(ct), "think_tps": rate(rt), "answer_tps": rate(ct)}


def median(values: list):
    """The median of the values that are not None (None when none is)."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def think_body(t: dict, mode: dict, tag: int, max_tokens: int) -> dict:
    """A chat request of `mode` (its fields over the plain request), its own prompt (tag)."""
    return {"model": t["model"], "stream": True, "stream_options": {"include_usage": True},
            "temperature": 0, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": f"Request {tag}: {t['question']}"}], **mode["extra"]}


def budget_rounds(run: ProofRun, t: dict, r: dict, pool: list) -> None:
    """A warm-up of every mode, then `runs` repetitions of each mode at each client count (modes
    interleaved within a repetition) into r["rounds"], saved after each round."""
    for i, mode in enumerate(t["modes"]):
        r["warmup"].append(chat(pool[0], think_body(t, mode, 32900 + i, 16)))
    for rep in range(t["runs"]):
        for k in t["streams"]:
            for j, mode in enumerate(t["modes"]):
                tag = 32000 + 1000 * rep + 100 * j + (50 if k > 1 else 0)
                t0 = time.time()
                recs = concurrent(run.port, [(lambda i=i: chat(pool[i], think_body(
                    t, mode, tag + i, t["max_tokens"]))) for i in range(k)])
                r["rounds"].append({"rep": rep, "streams": k, "mode": mode["mode"],
                                    "seconds": round(time.time() - t0, 2), "recs": recs})
                run.save()
                med = {f: median([q.get(f) for q in recs]) for f in ("answer_ms", "think_tps", "answer_tps")}
                say("think32", rep, k, mode["mode"], med, sum(bool(q.get("error")) for q in recs))


def thinking_budget(run: ProofRun, build: str) -> None:
    """`think32:BUILD`: plan["think32"], the shipped argv (MODEL: the zero-weight 27B, which never ends
    a thought by itself, so the budget alone decides when the answer starts), budget_rounds over the
    clients' connections kept alive throughout; the log's counts of the budget sampler's lines.
    Nothing when the plan names another build."""
    out = run.results.setdefault("think32", [])
    t = run.plan["think32"]
    if t["build"] != build:
        return
    s = run.server(build, t["name"], t["args"])
    r = {k: t[k] for k in ("name", "group", "model", "question", "max_tokens", "streams", "runs", "modes")}
    r.update(build=build, args=s.args, healthy=s.ok, load_s=s.load_s, warmup=[], rounds=[])
    pool = [KeepAlive("127.0.0.1", run.port, timeout=900) for _ in range(max(t["streams"]))]
    try:
        if s.ok:
            budget_rounds(run, t, r, pool)
            r["mem_after"] = gpu_mem(s.p.pid).get("proc_mib")
    finally:
        for c in pool:
            c.close()
        run.close(s, r, out)
    log = s.log()
    r["log_counts"] = {k: log.count(v) for k, v in (
        ("backend_sampling_off", "backend sampling is not compatible with reasoning budget"),
        ("budget_activated", "activated, budget="), ("budget_forced", "budget exhausted, forcing end"))}
    run.save()
    say("think32", build, s.ok, r["log_counts"])
