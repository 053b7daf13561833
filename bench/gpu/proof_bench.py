"""The GPU proof's measurements (issue 19), run on the GPU machine by gpu_proof.sh; stdlib only.

Phases (each appends raw records to RES/results.json, saved after every step):
  vram:LABEL   the v100_16gb argv at 2/3/4 slots: process memory after load, its peak while one
               1,536-token prompt per slot runs at once (sampled every 0.1 s), and after
  pp:LABEL     llama-bench prompt processing (every repetition's tok/s)
  tg           llama-bench tg128 (the single-stream ceiling)
  batched      llama-batched-bench, 1-32 parallel sequences, 3 runs (+ 1 with a unified KV cache)
  serve        each server config: after a warm-up, 3 rounds of 1 and N concurrent streams
               (TTFT and every token's arrival time kept), then multi-turn conversations
  think32:LABEL  issue 32: streamed chat completions (the chat template, --jinja) with thinking off,
               budgets 0/256/1024 and unbounded, at 1 and 16 clients over kept-alive connections:
               every reasoning and content chunk's arrival kept

    PYTHONPATH=PACK python3 -m bench.gpu.proof_bench --plan plan.json --bin BIN [--cublas-bin BIN] --models DIR \
        --res DIR --phases ...

PACK: bench/gpu/gpu_proof.py's pack, which holds this module, qwen35_bench and voltafleet's smoke client and
workload at their repository paths (gpu_proof.MACHINE_SOURCES).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time

from bench.gpu.qwen35_bench import KEEP, Run, Server, complete, gpu_mem, prompt_ids, say


class Sampler:
    """The process's GPU memory every 0.1 s while a workload runs: the peak."""

    def __init__(self, pid: int):
        self.pid, self.peak, self.stop_ = pid, 0, False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop_:
            m = gpu_mem(self.pid).get("proc_mib") or 0
            self.peak = max(self.peak, m)
            time.sleep(0.1)

    def stop(self) -> int:
        self.stop_ = True
        self.t.join()
        return self.peak


def concurrent(port: int, jobs: list) -> list:
    """Run each job (a function of no arguments) in its own thread, all released at once."""
    out = [None] * len(jobs)
    barrier = threading.Barrier(len(jobs))

    def go(i):
        barrier.wait()
        try:
            out[i] = jobs[i]()
        except Exception as e:  # noqa: BLE001
            out[i] = {"error": repr(e)}
    th = [threading.Thread(target=go, args=(i,)) for i in range(len(jobs))]
    [t.start() for t in th]
    [t.join() for t in th]
    return out


def wall_rate(recs: list) -> float | None:
    """Tokens of a round over its wall time, first request to last token (for the progress log)."""
    good = [q for q in recs if q.get("times_ms")]
    if not good:
        return None
    end = max(q["t_start"] + q["times_ms"][-1] / 1000 for q in good)
    return round(sum(len(q["times_ms"]) for q in good) / (end - min(q["t_start"] for q in good)), 1)


class Proof(Run):
    """qwen35_bench's run (plan, results.json saved after every step) with issue 19's phases."""

    def __init__(self, a):
        super().__init__(a)
        self.model_path = os.path.join(a.models, "q4ks.gguf")

    def bindir(self, label: str) -> str:
        bins = dict(kv.split("=", 1) for kv in (self.a.bins or "").split(",") if kv)
        if label in bins:
            return bins[label]
        return self.a.cublas_bin if label == "cublas" else self.a.bin

    def server(self, label: str, name: str, args: list, model: str | None = None) -> Server:
        return Server(f"{self.bindir(label)}/llama-server", args, model or self.model_path, self.port,
                      f"/tmp/load-{label}-{name}.log")

    @staticmethod
    def loglines(s: Server) -> list:
        return [line for line in s.log().splitlines() if KEEP.search(line) or "system_info" in line
                or "FORCE" in line][:120]

    # ------------------------------------------------------------ VRAM
    def vram(self, label: str):
        out = self.results.setdefault("vram", [])
        label, once = label.split(":")[0], label.endswith(":once")
        runs = 3 if label == "cublas" and not once else 1
        for item in self.plan["vram"]:
            if label != "cublas" and not once and item["name"] not in ("v16-np2", "v16-np4"):
                continue
            for run in range(1 if "ub" in item["name"] else runs):
                s = self.server(label, item["name"], item["args"])
                r = {"build": label, "name": item["name"], "run": run, "args": s.args, "healthy": s.ok}
                try:
                    r.update(self.peak_of(s, [(lambda i=i: complete(self.port, prompt_ids(500 + 10 * run + i,
                                                                                          item["prompt"]), 8))
                                              for i in range(item["parallel"])],
                                          ("prompt_n", "prompt_ms", "ttft_ms", "error")))
                finally:
                    s.stop()
                r["buffers"], r["log"] = s.buffers(), self.loglines(s)
                out.append(r)
                self.save()
                say("vram", label, item["name"], run, r.get("mem_load"), r.get("mem_peak"), r.get("mem_after"))

    def peak_of(self, s: Server, jobs: list, keys: tuple) -> dict:
        """A loaded server's memory after load, its peak while `jobs` run at once (sampled every
        0.1 s) and after; each request's `keys`. Only mem_load when the server is not healthy."""
        time.sleep(1)
        r = {"mem_load": gpu_mem(s.p.pid).get("proc_mib")}
        if s.ok:
            sampler = Sampler(s.p.pid)
            reqs = concurrent(self.port, jobs)
            time.sleep(0.5)
            r.update(mem_peak=sampler.stop(), mem_after=gpu_mem(s.p.pid).get("proc_mib"),
                     requests=[{k: q.get(k) for k in keys} for q in reqs])
        return r

    def vram_named(self, arg: str):
        """`vram_named:LABEL=name1+name2`: one run each of the named entries of plan["vram"]."""
        label, _, names = arg.partition("=")
        keep = self.plan["vram"]
        self.plan = {**self.plan, "vram": [v for v in keep if v["name"] in names.split("+")]}
        try:
            self.vram(label + ":once")
        finally:
            self.plan = {**self.plan, "vram": keep}

    # ------------------------------------------------------------ llama-bench, batched-bench
    def llama_bench(self, label: str, key: str, args: list):
        cmd = [f"{self.bindir(label)}/llama-bench", "-m", self.model_path, "-o", "json"] + args
        t = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        try:
            rows = json.loads(p.stdout)
        except json.JSONDecodeError:
            rows = {"error": (p.stderr or p.stdout)[-2000:]}
        self.results.setdefault("llama_bench", []).append(
            {"build": label, "what": key, "argv": cmd[1:], "seconds": time.time() - t, "rows": rows})
        self.save()
        say("llama-bench", label, key, [(r.get("n_prompt"), r.get("n_gen"), r.get("samples_ts"))
                                         for r in rows] if isinstance(rows, list) else rows)

    def pp(self, label: str):
        self.llama_bench(label, "pp", self.plan["llama_bench"]["args"])

    def tg(self):
        self.llama_bench("default", "tg", self.plan["tg"]["args"])

    def batched(self):
        out = self.results.setdefault("batched", [])
        b = self.plan["batched"]
        for run, extra in enumerate([[], [], [], b["kvu"]]):
            cmd = [f"{self.a.bin}/llama-batched-bench", "-m", self.model_path] + b["args"] + extra
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
            out.append({"run": run, "kvu": bool(extra), "argv": cmd[1:], "rows": rows,
                        "log": [line for line in p.stderr.splitlines() if "graph" in line or "error" in line.lower()][:20]})
            self.save()
            say("batched", run, extra, [(r.get("pl"), round(r.get("speed_tg", 0))) for r in rows])

    # ------------------------------------------------------------ serving
    def close(self, s: Server, r: dict, out: list) -> None:
        """Stop the server; its record goes to the results with its log lines, saved."""
        s.stop()
        r["log"] = self.loglines(s)
        out.append(r)
        self.save()

    def round_(self, k: int, tokens: int, plen: int, tag: int) -> list:
        recs = concurrent(self.port, [(lambda i=i: complete(self.port, prompt_ids(tag * 100 + i, plen), tokens))
                                      for i in range(k)])
        return [{key: r.get(key) for key in ("ttft_ms", "t_start", "times_ms", "n", "decode_tps", "prompt_n",
                                              "prompt_ms", "cache_n", "error")} for r in recs]

    def conversation(self, conv: int, m: dict, rep: int) -> list:
        prompt = prompt_ids(5000 + 100 * rep + conv, m["first"])
        turns = []
        for t in range(m["turns"]):
            r = complete(self.port, prompt, m["reply"], cache_prompt=True)
            turns.append({k: r.get(k) for k in ("ttft_ms", "prompt_n", "prompt_ms", "cache_n", "n", "decode_tps",
                                                 "error")} | {"turn": t, "prompt_len": len(prompt)})
            prompt = prompt + prompt_ids(7000 + conv, m["reply"]) + prompt_ids(9000 + 1000 * t + conv, m["turn"])
        return turns

    def rounds(self, r: dict, item: dict, runs: int, tag) -> None:
        """A warm-up, then `runs` rounds at each of item's client counts into r["rounds"] (saved
        after each); tag(rep, k) seeds the round's distinct prompts."""
        self.round_(1, 8, 32, 9900)
        for rep in range(runs):
            for k in item["streams"]:
                recs = self.round_(k, item["tokens"], item["prompt"], tag(rep, k))
                r["rounds"].append({"rep": rep, "streams": k, "recs": recs})
                self.save()

    def serve(self, names=None):
        out = self.results.setdefault("serve", [])
        for item in self.plan["serve"]:
            if names and item["name"] not in names:
                continue
            s = self.server(item.get("build", "default"), item["name"], item["args"])
            r = {"name": item["name"], "build": item.get("build", "default"), "args": s.args, "healthy": s.ok, "load_s": s.load_s, "rounds": [], "multi": []}
            try:
                if s.ok:
                    self.rounds(r, item, self.plan["runs"], lambda rep, k: 1000 * (rep + 1) + k)
                    m = item.get("multi")
                    for rep in range(self.plan["runs"] if m else 0):
                        convs = concurrent(self.port, [(lambda c=c: self.conversation(c, m, rep))
                                                       for c in range(m["conversations"])])
                        r["multi"].append({"rep": rep, **m, "convs": convs})
                    r["mem_after"] = gpu_mem(s.p.pid).get("proc_mib")
            finally:
                self.close(s, r, out)
            say("serve", item["name"], s.ok, [(x["streams"], wall_rate(x["recs"])) for x in r["rounds"]])

    # ------------------------------------------------------------ n-gram speculation
    @staticmethod
    def spec_prompt(kind: str, i: int) -> list:
        """`plain`: 128 distinct tokens; `repeat`: one 32-token run 8 times (n-grams to draft from)."""
        return prompt_ids(i, 128) if kind.split("-")[0] == "plain" else prompt_ids(i, 32) * 8

    @staticmethod
    def spec_sampling(kind: str, i: int) -> dict | None:
        """`-kN`: sampled from the top N tokens at temperature 1 (seeded); else greedy."""
        k = kind.partition("-k")[2]
        return {"temperature": 1.0, "top_k": int(k), "top_p": 1.0, "min_p": 0.0, "seed": i} if k else None

    def spec(self, names=None):
        """Each plan["spec"] server: a warm-up, then plan["runs"] rounds of each prompt kind at each
        stream count (greedy, prompt cache off), every request's TTFT, token times, drafts drafted
        and accepted, and its text's hash (speculation must not change greedy output)."""
        out = self.results.setdefault("spec", [])
        for item in self.plan["spec"]:
            if names and item["name"] not in names:
                continue
            s = self.server(item["build"], item["name"], item["args"])
            r = {"name": item["name"], "build": item["build"], "args": s.args, "healthy": s.ok, "load_s": s.load_s,
                 "rounds": []}
            try:
                if s.ok:
                    complete(self.port, prompt_ids(9900, 32), 8)  # warm-up
                    for rep in range(self.plan["runs"]):
                        for kind in item.get("kinds", ["plain", "repeat"]):
                            for k in item["streams"]:
                                tag = 1000 * (rep + 1) + k
                                recs = concurrent(self.port, [
                                    (lambda i=i: complete(self.port, self.spec_prompt(kind, tag * 100 + i),
                                                          item["tokens"],
                                                          sampling=self.spec_sampling(kind, tag * 100 + i)))
                                    for i in range(k)])
                                keep = ("ttft_ms", "t_start", "times_ms", "n", "decode_tps", "draft_n",
                                        "draft_accepted", "text_sha", "error")
                                r["rounds"].append({"rep": rep, "kind": kind, "streams": k,
                                                    "recs": [{x: q.get(x) for x in keep} for q in recs]})
                                self.save()
                    r["mem_after"] = gpu_mem(s.p.pid).get("proc_mib")
            finally:
                self.close(s, r, out)
            say("spec", item["name"], s.ok, [(x["kind"], x["streams"], wall_rate(x["recs"]),
                                              sum(q.get("draft_accepted") or 0 for q in x["recs"]))
                                             for x in r["rounds"]])


class Proof27(Proof):
    """Issue 27's phases: the Volta-rule build (`volta`) against FORCE_MMQ (`mmq`)."""

    def peak(self, label: str):
        """plan["peaks"] of this build: load, then one prompt per slot at once (each its own
        tokens), the peak of the process's GPU memory sampled every 0.1 s, and after; the load
        log's buffer lines (compute buffer re-reservations included)."""
        out = self.results.setdefault("peaks", [])
        for item in self.plan["peaks"]:
            if item["build"] != label:
                continue
            s = self.server(label, item["name"], item["args"])
            r = {k: item[k] for k in ("build", "name", "group", "ctx", "parallel", "prompt", "tokens", "kind")}
            r.update(args=s.args, healthy=s.ok, spec=item.get("spec"))
            plen = item["prompt"]
            ids = (lambda i: prompt_ids(700 + i, 32) * (plen // 32)) if item["kind"] == "repeat" else \
                (lambda i: prompt_ids(700 + i, plen))
            try:
                r.update(self.peak_of(s, [(lambda i=i: complete(self.port, ids(i), item["tokens"]))
                                          for i in range(item["parallel"])],
                                      ("prompt_n", "prompt_ms", "ttft_ms", "n", "draft_n", "draft_accepted", "error")))
            finally:
                s.stop()
            r["buffers"], r["log"] = s.buffers(), self.loglines(s)
            out.append(r)
            self.save()
            say("peak", label, item["name"], r.get("mem_load"), r.get("mem_peak"), r.get("mem_after"))

    def bench27(self, label: str):
        for what in ("pp", "tg"):
            self.llama_bench(label, f"{what}27", self.plan["bench"][what])

    def serve27(self, label: str):
        """The shipped argv: a warm-up, then runs27 rounds at each client count (distinct 512-token
        prompts, 128 tokens): TTFT and every token's arrival kept."""
        out = self.results.setdefault("serve27", [])
        for item in self.plan["serve27"]:
            if item["build"] != label:
                continue
            s = self.server(label, item["name"], item["args"])
            r = {"name": item["name"], "build": label, "group": item["group"], "args": s.args, "healthy": s.ok,
                 "load_s": s.load_s, "rounds": []}
            try:
                if s.ok:
                    self.rounds(r, item, self.plan["runs27"], lambda rep, k: 2000 + 100 * rep + k)
                    r["mem_after"] = gpu_mem(s.p.pid).get("proc_mib")
            finally:
                self.close(s, r, out)
            say("serve27", label, item["name"], [(x["streams"], wall_rate(x["recs"])) for x in r["rounds"]])

    def probe27(self):
        """The smoke client's probes (voltafleet/hostside/smoke_client.py, as shipped to hosts), greedy, 3 times
        each, on both builds: the 27B shape at the v100_16gb argv, and a random-weight qwen35
        (lab/qwen35gen.py --dense, quantized to Q8_0: MMQ-capable, so the 64+ rule applies)."""
        from voltafleet.hostside import smoke_client as smoke  # the host-side client, as shipped
        pr = self.plan["probe"]
        out = self.results.setdefault("probe", [])
        tiny = os.path.join(self.a.models, "tiny-q8_0.gguf")
        for model, args in ((self.model_path, pr["args"]), (tiny, pr["tiny_args"])):
            if not os.path.exists(model):
                continue
            for label in ("volta", "mmq"):
                s = self.server(label, "probe-" + os.path.basename(model), args, model=model)
                r = {"build": label, "model": os.path.basename(model), "args": s.args, "healthy": s.ok, "runs": []}
                try:
                    for _ in range(3 if s.ok else 0):
                        r["runs"].append({w: smoke.probe(self.port, None, pr[w], pr["tokens"]) for w in ("short", "long")})
                finally:
                    s.stop()
                r["log"] = self.loglines(s)
                out.append(r)
                self.save()
                say("probe", label, os.path.basename(model), [(w, x[w].get("prompt_n"), x[w]["tokens"][:4])
                                                              for x in r["runs"][:1] for w in ("short", "long")])


class Proof29(Proof27):
    """Issue 29: the v100_32gb group's tune settings (planned by tune29.py), each with the group's workload."""

    def tune29(self, key: str = "tune29"):
        """Each fitting setting's server, its GPU's memory once loaded (/health answered, before any
        request: `loaded_mib`, the CUDA context the calibration reads), the golden probe, then the
        workload (plan[key]: voltafleet/hostside/workload.py, as shipped to hosts); records appended to results[key]."""
        from voltafleet.hostside import workload  # run as a script, as shipped to hosts

        workload_py = os.path.abspath(workload.__file__)
        plan = self.plan[key]
        out = self.results.setdefault(key, [])
        for item in plan["settings"]:
            r = {k: item[k] for k in ("name", "values", "build", "fits", "refusal", "planned_mib", "planned_static_mib")}
            if not item["fits"]:
                r.update(status="refused", reps=[])
                out.append(r)
                self.save()
                continue
            t0 = time.time()
            s = self.server(item["build"], "tune-" + item["name"].replace(" ", "_"), item["args"])
            r.update(args=s.args, healthy=s.ok, load_s=s.load_s)
            try:
                if s.ok:
                    time.sleep(1)  # as the VRAM proof reads after-load (peak_of); memory.used as the peaks
                    r["loaded_mib"] = gpu_mem().get("gpu_used_mib")
                    from voltafleet.hostside import smoke_client as smoke  # the host-side client, as shipped: its greedy probe against the shipped setting's

                    pr = self.plan["probe"]
                    r["probe_tokens"] = smoke.probe(self.port, None, pr["short"], pr["tokens"])["tokens"]
                    cmd = [sys.executable, workload_py, "--port", str(self.port), "--gpu", "0", *plan["workload"]]
                    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
                    got = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
                    r.update(status="measured" if got else "failed", reps=got["reps"] if got else [],
                             after_load_mib=got["after_load_mib"] if got else None,
                             reason="" if got else (done.stderr.strip().splitlines() or ["no output"])[-1][:300])
                else:
                    r.update(status="failed", reps=[], reason="the server did not start")
            finally:
                s.stop()
            r["seconds"] = round(time.time() - t0, 1)
            r["log"] = self.loglines(s)
            out.append(r)
            self.save()
            say(key, item["name"], r["status"], [(x.get("throughput_tps"), x.get("followups")) for x in r.get("reps", [])])


# ------------------------------------------------------------ issue 32: the thinking budget
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


class Proof32(Proof29):
    """Issue 32: what a thinking budget costs or saves, on the Volta-rule build."""

    @staticmethod
    def think_body(t: dict, mode: dict, tag: int, max_tokens: int) -> dict:
        """A chat request of `mode` (its fields over the plain request), its own prompt (tag)."""
        return {"model": t["model"], "stream": True, "stream_options": {"include_usage": True},
                "temperature": 0, "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": f"Request {tag}: {t['question']}"}], **mode["extra"]}

    def think32(self, label: str):
        """plan["think32"]: the shipped argv (MODEL: the zero-weight 27B, which never ends a thought
        by itself, so the budget alone decides when the answer starts); a warm-up of every mode,
        then `runs` repetitions of each mode at each client count (modes interleaved within a
        repetition), the clients' connections kept alive throughout."""
        out = self.results.setdefault("think32", [])
        t = self.plan["think32"]
        if t["build"] != label:
            return
        s = self.server(label, t["name"], t["args"])
        r = {k: t[k] for k in ("name", "group", "model", "question", "max_tokens", "streams", "runs", "modes")}
        r.update(build=label, args=s.args, healthy=s.ok, load_s=s.load_s, warmup=[], rounds=[])
        pool = [KeepAlive("127.0.0.1", self.port, timeout=900) for _ in range(max(t["streams"]))]
        try:
            if s.ok:
                for i, mode in enumerate(t["modes"]):
                    r["warmup"].append(chat(pool[0], self.think_body(t, mode, 32900 + i, 16)))
                for rep in range(t["runs"]):
                    for k in t["streams"]:
                        for j, mode in enumerate(t["modes"]):
                            tag = 32000 + 1000 * rep + 100 * j + (50 if k > 1 else 0)
                            t0 = time.time()
                            recs = concurrent(self.port, [(lambda i=i: chat(pool[i], self.think_body(
                                t, mode, tag + i, t["max_tokens"]))) for i in range(k)])
                            r["rounds"].append({"rep": rep, "streams": k, "mode": mode["mode"],
                                                "seconds": round(time.time() - t0, 2), "recs": recs})
                            self.save()
                            med = {f: median([q.get(f) for q in recs]) for f in ("answer_ms", "think_tps", "answer_tps")}
                            say("think32", rep, k, mode["mode"], med, sum(bool(q.get("error")) for q in recs))
                r["mem_after"] = gpu_mem(s.p.pid).get("proc_mib")
        finally:
            for c in pool:
                c.close()
            self.close(s, r, out)
        log = s.log()
        r["log_counts"] = {k: log.count(v) for k, v in (
            ("backend_sampling_off", "backend sampling is not compatible with reasoning budget"),
            ("budget_activated", "activated, budget="), ("budget_forced", "budget exhausted, forcing end"))}
        self.save()
        say("think32", label, s.ok, r["log_counts"])


# ------------------------------------------------------------ issue 38: host memory, checkpoints on real chats
CKPT = re.compile(r"id\s+(\d+) \| task -?\d+ \| created context checkpoint (\d+) of (\d+) .*?size = ([\d.]+) MiB")
STATUS_KEYS = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM")


def proc_mem(pid: int) -> dict:
    """The process's resident memory now, MiB: VmRSS and its parts (anonymous, file pages, shared)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in STATUS_KEYS:
                    out[k] = int(v.split()[0]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


class HostSampler:
    """The process's host memory every 0.2 s while a workload runs: the peak of VmRSS, with its
    parts at that moment."""

    def __init__(self, pid: int):
        self.pid, self.peak, self.samples, self.stop_ = pid, {}, 0, False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop_:
            m = proc_mem(self.pid)
            if m.get("VmRSS", 0) > self.peak.get("VmRSS", -1):
                self.peak = m
            self.samples += 1
            time.sleep(0.2)

    def stop(self) -> dict:
        self.stop_ = True
        self.t.join()
        return {**self.peak, "samples": self.samples}


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


class Proof38(Proof32):
    """Issue 38: llama-server's host memory under real multi-turn chats, and what context checkpoints
    cost and save, on the shipped build (FORCE_MMQ)."""

    def host38(self, label: str):
        """plan["host38"]: each config's server (the v100_32gb argv at its slots and checkpoints), its
        host memory after load, a warm-up turn, then `runs` repetitions of `slots` concurrent chats of
        `turns` turns each (fresh conversations a repetition, on the same server): every turn's
        requests, the memory after it, the repetition's peak and the checkpoints the log shows."""
        import random

        from voltafleet.hostside import workload

        out = self.results.setdefault("host38", [])
        t = self.plan["host38"]
        if t["build"] != label:
            return
        for item in t["configs"]:
            s = self.server(label, item["name"], item["args"])
            r = {k: item[k] for k in ("name", "kind", "slots", "ckpt", "cms", "turns", "prompt_tokens",
                                      "answer_tokens", "thinking_budget")}
            r.update(build=label, args=s.args, healthy=s.ok, load_s=s.load_s, reps=[])
            out.append(r)  # in the results from the start: every repetition is saved as it ends
            try:
                if s.ok:
                    time.sleep(2)
                    r["mem_load"], r["gpu_load_mib"] = proc_mem(s.p.pid), gpu_mem(s.p.pid).get("proc_mib")
                    warm = workload.Client(self.port, None, random.Random(38), item["thinking_budget"])
                    r["warmup"] = chat_turn(warm, {**item, "prompt_tokens": 16, "answer_tokens": 8}, False)
                    r["mem_warm"] = proc_mem(s.p.pid)
                    for rep in range(t["runs"]):
                        r["reps"].append(self.chat_rep(s, item, rep, workload, random.Random(3800 + rep)))
                        self.save()
                    r["mem_after"] = proc_mem(s.p.pid)
            finally:
                s.stop()
                r["log"], r["buffers"] = self.loglines(s), s.buffers()
                self.save()

    def chat_rep(self, s: Server, item: dict, rep: int, workload, rng) -> dict:
        clients = [workload.Client(self.port, None, rng.__class__(rng.random()), item["thinking_budget"])
                   for _ in range(item["slots"])]
        for c in clients:
            c.max_turns = item["turns"]
        offset = len(s.log())
        sampler = HostSampler(s.p.pid)
        t0, turns = time.time(), []
        for turn in range(item["turns"]):
            t1 = time.time()
            recs = concurrent(self.port, [(lambda c=c: chat_turn(c, item, turn > 0)) for c in clients])
            turns.append({"turn": turn, "seconds": round(time.time() - t1, 2), "mem": proc_mem(s.p.pid),
                          "recs": recs})
            say("host38", item["name"], rep, turn, turns[-1]["seconds"], round(turns[-1]["mem"].get("VmRSS", 0)),
                sum("error" in q for q in recs))
        rec = {"rep": rep, "seconds": round(time.time() - t0, 2), "peak": sampler.stop(), "turns": turns,
               "ckpt": ckpt_log(s.log()[offset:])}
        say("host38", item["name"], rep, "peak", rec["peak"].get("VmRSS"), "held", rec["ckpt"]["held"],
            rec["ckpt"]["size_mib"])
        return rec


class Proof41(Proof38):
    """Issue 41: the latency tier (2 slots, MTP speculation) against the throughput tier."""

    KEEP41 = ("ttft_ms", "t_start", "times_ms", "n", "decode_tps", "prompt_n", "prompt_ms", "draft_n",
              "draft_accepted", "text_sha", "error")

    def tier41(self, label: str):
        """plan["tier41"]: each config's server on its model file; its GPU and host memory after
        load, a warm-up, then `runs` rounds at each stream count (the same prompts in every config,
        so greedy texts compare), the peaks of both memories over the rounds."""
        out = self.results.setdefault("tier41", [])
        t = self.plan["tier41"]
        if t["build"] != label:
            return
        for item in t["configs"]:
            model = os.path.join(self.a.models, item["model"])
            s = self.server(label, item["name"], item["args"], model=model)
            r = {"name": item["name"], "model": item["model"], "build": label, "args": s.args, "healthy": s.ok,
                 "load_s": s.load_s, "rounds": []}
            out.append(r)  # in the results from the start
            try:
                if s.ok:
                    time.sleep(2)
                    r["gpu_load_mib"], r["mem_load"] = gpu_mem(s.p.pid).get("proc_mib"), proc_mem(s.p.pid)
                    complete(self.port, prompt_ids(9900, 32), 8)  # warm-up
                    gpu, host = Sampler(s.p.pid), HostSampler(s.p.pid)
                    for rep in range(t["runs"]):
                        for k in item["streams"]:
                            tag = 4100 + 10 * rep + k
                            recs = concurrent(self.port, [
                                (lambda i=i: complete(self.port, prompt_ids(tag * 100 + i, t["prompt"]), t["tokens"]))
                                for i in range(k)])
                            r["rounds"].append({"rep": rep, "streams": k,
                                                "recs": [{x: q.get(x) for x in self.KEEP41} for q in recs]})
                            self.save()
                    r["gpu_peak_mib"], r["host_peak"] = gpu.stop(), host.stop()
                    r["gpu_after_mib"] = gpu_mem(s.p.pid).get("proc_mib")
            finally:
                s.stop()
                r["log"], r["buffers"] = self.loglines(s), s.buffers()
                self.save()
            say("tier41", item["name"], s.ok, [(x["streams"], wall_rate(x["recs"]),
                                                sum(q.get("draft_accepted") or 0 for q in x["recs"]),
                                                sum(q.get("draft_n") or 0 for q in x["recs"])) for x in r["rounds"]])


def median(values: list):
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def main():
    ap = argparse.ArgumentParser()
    for k in ("plan", "bin", "models", "res"):
        ap.add_argument(f"--{k}", required=True)
    ap.add_argument("--cublas-bin")
    ap.add_argument("--bins", help="label=BINDIR,... (issue 27: volta, mmq)")
    ap.add_argument("--phases", required=True)
    a = ap.parse_args()
    run = Proof41(a)
    for ph in a.phases.split(","):
        name, _, arg = ph.partition(":")
        t = time.time()
        say("phase", ph)
        try:
            fn = getattr(run, name)
            if name in ("serve", "spec"):
                fn(arg.split("+") if arg else None)
            elif arg:
                fn(arg)
            else:
                fn()
        except Exception as e:  # noqa: BLE001
            run.results.setdefault("errors", []).append(f"{ph}: {e!r}")
            say("phase", ph, "error", repr(e))
        run.results.setdefault("phase_seconds", {})[ph] = round(time.time() - t, 1)
        run.save()


if __name__ == "__main__":
    main()
