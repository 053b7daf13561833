"""Loads, VRAM, throughput, prompt reuse and MTP for the Qwen3.6-27B shape (a script, not a test).

Runs where llama-server runs (the H200 box via bench/gpu/qwen35_gpu.sh, or any host with a
llama-server for a dry run on a small model). Python stdlib only. Every llama-server
argv comes from plan.json (rendered by voltafleet.planning.flags.server_args in bench/gpu/qwen35_prep.py);
MODEL in an argv is replaced by the model file. Results go to RES/results.json after
every step, so a run cut short still leaves what it measured.

    python3 qwen35_bench.py --plan plan.json --bin BINDIR --models DIR --res DIR [--phases ladder,bench,...]

(in the folder bench/gpu/qwen35_prep.py packs, a copy beside qwen35_gpu.sh: it imports nothing of the project)
"""
from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request

BUF = re.compile(r"(\S+)\s+(model|KV|RS|compute|output)\s+buffer size\s*=\s*([\d.]+)\s*MiB")
KEEP = re.compile(r"buffer size|offloaded|n_ctx|n_seq_max|n_ubatch|graph|fit|layers to GPU|checkpoint|mtp|draft|"
                  r"slots|n_parallel|kv_unified|error|failed", re.I)
T0 = time.time()


def say(*a):
    print(f"[bench {time.time() - T0:6.0f}s]", *a, flush=True)


def gpu_mem(pid: int | None = None) -> dict:
    try:
        used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20).stdout.split("\n")[0].split(",")
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    proc = {int(p): int(m) for p, m in (l.split(",") for l in apps.strip().splitlines() if "," in l)}
    return {"gpu_used_mib": int(used[0]), "gpu_total_mib": int(used[1]), "proc_mib": proc.get(pid) if pid else None,
            "apps": proc}


class Server:
    def __init__(self, binary: str, args: list[str], model: str, port: int, logf: str, timeout: float = 300,
                 cgroup: str | None = None, env: dict | None = None):
        self.args = [a.replace("MODEL", model) for a in args]
        self.port, self.logf = port, logf
        # cgroup: a cgroup v2 folder the server runs in from its first instruction (it joins before exec), so its
        # model's page cache and every allocation are charged there, as a systemd unit's would be
        join = (lambda: open(f"{cgroup}/cgroup.procs", "w").write(str(os.getpid()))) if cgroup else None
        # env: variables the server gets beside this process's own (bench/traffic/ckpt_copy.py's allocator variants)
        self.p = subprocess.Popen([binary] + self.args, stdout=open(logf, "w"), stderr=subprocess.STDOUT,
                                  start_new_session=True, preexec_fn=join, env={**os.environ, **env} if env else None)
        t = time.time()
        self.ok = False
        while time.time() - t < timeout:
            if self.p.poll() is not None:
                break
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                    self.ok = True
                    break
            except Exception:
                time.sleep(0.3)
        self.load_s = time.time() - t

    def log(self) -> str:
        return open(self.logf, errors="replace").read()

    def buffers(self) -> list:
        return [[d, k, float(m)] for d, k, m in BUF.findall(self.log())]

    def stop(self):
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()


def complete(port: int, prompt, n: int, stream: bool = True, cache_prompt: bool = False, slot: int | None = None,
             timeout: float = 600, sampling: dict | None = None) -> dict:
    body = {"prompt": prompt, "n_predict": n, "stream": stream, "ignore_eos": True, "temperature": 0,
            "cache_prompt": cache_prompt, **(sampling or {})}
    if slot is not None:
        body["id_slot"] = slot
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.time()
    c.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        return {"error": f"HTTP {r.status}: {r.read()[:300]!r}"}
    first, last, final, text, times = None, None, {}, [], []
    if not stream:
        final = json.loads(r.read())
        last = time.time()
        text.append(final.get("content", ""))
    else:
        while True:
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            d = json.loads(line[6:])
            now = time.time()
            if d.get("content") and first is None:
                first = now
            if d.get("content"):
                last = now
                text.append(d["content"])
                times.append(round((now - t0) * 1000, 2))
            if d.get("stop"):
                final = d
                break
    c.close()
    t = final.get("timings", {})
    return {"ttft_ms": ((first or last or time.time()) - t0) * 1000, "wall_s": (last or time.time()) - t0,
            "n": t.get("predicted_n"), "decode_tps": t.get("predicted_per_second"),
            "prompt_n": t.get("prompt_n"), "prompt_ms": t.get("prompt_ms"), "cache_n": t.get("cache_n"),
            "draft_n": t.get("draft_n"), "draft_accepted": t.get("draft_n_accepted"),
            "text_tail": "".join(text)[-16:], "text_sha": hashlib.sha256("".join(text).encode()).hexdigest()[:16],
            "t_start": t0, "t_end": last or time.time(), "times_ms": times}


def prompt_ids(i: int, n: int) -> list[int]:
    return [(1000 + 7919 * i + 31 * k) % 140000 + 200 for k in range(n)]


def streams(port: int, k: int, tokens: int, plen: int = 128, tag: int = 0) -> dict:
    res = [None] * k
    barrier = threading.Barrier(k)

    def go(i):
        barrier.wait()
        try:
            res[i] = complete(port, prompt_ids(tag * 100 + i, plen), tokens)
        except Exception as e:  # noqa: BLE001
            res[i] = {"error": repr(e)}
    th = [threading.Thread(target=go, args=(i,)) for i in range(k)]
    [t.start() for t in th]
    [t.join() for t in th]
    good = [r for r in res if r and "error" not in r]
    if not good:
        return {"streams": k, "error": [r.get("error") for r in res if r][:2]}
    wall = max(r["t_end"] for r in good) - min(r["t_start"] for r in good)
    total = sum(r["n"] or 0 for r in good)
    tps = sorted(r["decode_tps"] or 0 for r in good)
    return {"streams": k, "ok": len(good), "ttft_ms_median": sorted(r["ttft_ms"] for r in good)[len(good) // 2],
            "per_stream_tps_median": tps[len(tps) // 2], "per_stream_tps_min": tps[0],
            "aggregate_tps": total / wall if wall > 0 else None, "tokens": total, "wall_s": wall,
            "text_tail": good[0]["text_tail"], "draft": [(r["draft_n"], r["draft_accepted"]) for r in good][:4]}


def llama_bench(bindir: str, model: str, args: list[str], tg: int, reps: int) -> dict:
    cmd = [f"{bindir}/llama-bench", "-m", model, "-p", "512", "-n", str(tg), "-r", str(reps), "-o", "json"] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    try:
        rows = json.loads(p.stdout)
    except json.JSONDecodeError:
        return {"cmd": cmd[1:], "error": (p.stderr or p.stdout)[-1500:]}
    out = {"cmd": cmd[1:]}
    for r in rows:
        key = "pp512" if r.get("n_prompt") else f"tg{r.get('n_gen')}"
        out[key] = r.get("avg_ts")
        out["n_gpu_layers"], out["flash_attn"] = r.get("n_gpu_layers"), r.get("flash_attn")
    return out


class Record:
    """A run's plan.json and its results.json (read back when RES already holds one, saved after
    every step), with the GPU's memory before any server (`baseline`). The GPU proof's runner
    (bench/gpu/proof/runner.py) builds on it too."""

    def __init__(self, a):
        self.a = a
        self.plan = json.load(open(a.plan))
        self.port = self.plan["port"]
        self.path = os.path.join(a.res, "results.json")
        self.results = json.load(open(self.path)) if os.path.exists(self.path) else {}
        self.base = gpu_mem()
        self.results["baseline"] = self.base

    def save(self):
        json.dump(self.results, open(self.path + ".tmp", "w"), indent=1)
        os.replace(self.path + ".tmp", self.path)


class Run(Record):
    """This pipeline's phases (ladder, bench, reuse, mtp), each a method that main() calls by name."""

    def model(self, name: str) -> str:
        return os.path.join(self.a.models, f"{name}.gguf")

    def serve(self, item: dict) -> Server:
        s = Server(f"{self.a.bin}/llama-server", item["args"], self.model(item["model"]), self.port,
                   f"/tmp/load-{item['name']}.log")
        return s

    def record_load(self, s: Server, item: dict) -> dict:
        time.sleep(1)
        r = {k: item.get(k) for k in ("name", "model", "ctx", "parallel", "kv")}
        r.update(args=s.args, healthy=s.ok, load_s=round(s.load_s, 1), mem_load=gpu_mem(s.p.pid),
                 buffers=s.buffers(), log=[l for l in s.log().splitlines() if KEEP.search(l)][:80])
        return r

    def ladder(self):
        out = self.results.setdefault("ladder", [])
        for item in self.plan["ladder"]:
            s = self.serve(item)
            try:
                r = self.record_load(s, item)
                if s.ok:
                    r["request"] = complete(self.port, prompt_ids(1, 600), 16)
                    r["mem_after"] = gpu_mem(s.p.pid)
            finally:
                s.stop()
            out.append(r)
            self.save()
            say(item["name"], "ok" if s.ok else "FAILED", r["mem_load"].get("proc_mib"),
                (r.get("mem_after") or {}).get("proc_mib"), r["buffers"])

    def bench(self, names=None):
        out = self.results.setdefault("bench", [])
        for item in self.plan["bench"]:
            if names and item["name"] not in names:
                continue
            s = self.serve(item)
            try:
                r = self.record_load(s, item)
                if s.ok:
                    streams(self.port, 1, 8, tag=99)  # warm-up
                    r["streams"] = []
                    for k in item["streams"]:
                        r["streams"].append(streams(self.port, k, item["tokens"], tag=k))
                        say(item["name"], k, r["streams"][-1].get("aggregate_tps"),
                            r["streams"][-1].get("per_stream_tps_median"))
                        self.save()
                    r["mem_after"] = gpu_mem(s.p.pid)
            finally:
                s.stop()
            if item.get("bench") is not None and s.ok:
                reps = 1 if item["tokens"] < 64 else 3
                r["llama_bench"] = llama_bench(self.a.bin, self.model(item["model"]), item["bench"], item["tg"], reps)
                say(item["name"], "llama-bench", r["llama_bench"])
            out.append(r)
            self.save()

    def reuse(self):
        out = self.results.setdefault("reuse", [])
        a = prompt_ids(7, 4096)
        for item in self.plan["reuse"]:
            s = self.serve(item)
            try:
                r = self.record_load(s, item)
                if s.ok:
                    steps = []
                    first = complete(self.port, a, 4, cache_prompt=True, slot=0)
                    steps.append(("4K prompt", first))
                    turn = a + [0] * 3 + prompt_ids(8, 64)           # + the reply + a short user turn
                    steps.append(("same prefix + reply + turn", complete(self.port, turn, 4, cache_prompt=True, slot=0)))
                    turn2 = turn + [0] * 3 + prompt_ids(9, 64)
                    steps.append(("+ another turn", complete(self.port, turn2, 4, cache_prompt=True, slot=0)))
                    steps.append(("4K prompt again", complete(self.port, a, 4, cache_prompt=True, slot=0)))
                    r["steps"] = [{"step": n, **{k: v.get(k) for k in ("prompt_n", "prompt_ms", "cache_n", "ttft_ms")}}
                                  for n, v in steps]
                    r["mem_after"] = gpu_mem(s.p.pid)
                    say(item["name"], r["steps"])
            finally:
                s.stop()
            r["log"] = [l for l in s.log().splitlines() if re.search(r"checkpoint|cache", l, re.I)][-40:]
            out.append(r)
            self.save()

    def mtp(self):
        out = self.results.setdefault("mtp", [])
        for item in self.plan["mtp"]:
            s = self.serve(item)
            try:
                r = self.record_load(s, item)
                if s.ok:
                    streams(self.port, 1, 8, tag=98)
                    r["streams"] = [streams(self.port, 1, 128, tag=1), streams(self.port, 1, 128, tag=2),
                                    streams(self.port, 4, 128, tag=4)]
                    r["mem_after"] = gpu_mem(s.p.pid)
                    say(item["name"], [(x.get("per_stream_tps_median"), x.get("aggregate_tps"), x.get("draft"))
                                       for x in r["streams"]])
            finally:
                s.stop()
            out.append(r)
            self.save()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--res", required=True)
    ap.add_argument("--phases", default="ladder,bench:c-seed-stage3+d-v100_16gb+d-v100_32gb,reuse,mtp,bench")
    a = ap.parse_args()
    run = Run(a)
    done = set()
    for ph in a.phases.split(","):
        name, _, sel = ph.partition(":")
        t = time.time()
        say("phase", ph)
        try:
            if name == "bench":
                names = [n for n in (sel.split("+") if sel else [b["name"] for b in run.plan["bench"]]) if n not in done]
                run.bench(names)
                done.update(names)
            else:
                getattr(run, name)()
        except Exception as e:  # noqa: BLE001
            run.results.setdefault("errors", []).append(f"{ph}: {e!r}")
            run.save()
            say("phase", ph, "error", repr(e))
        say("phase", ph, f"{time.time() - t:.0f}s")
    run.save()


if __name__ == "__main__":
    main()
