"""The kernels' speed without a server: llama-bench's prompt processing and decode, and
llama-batched-bench's decode at 1-32 parallel sequences.

    pp:BUILD        llama-bench prompt processing at plan["llama_bench"] (every repetition's tok/s)
    tg              llama-bench tg128 on the default build (the single-stream ceiling)
    bench27:BUILD   issue 27: pp128/512/2048 and tg128 of plan["bench"], 3 repetitions
    batched         llama-batched-bench, 1-32 parallel sequences, 3 runs (+ 1 with a unified KV cache)
"""
from __future__ import annotations

import json
import subprocess
import time

from bench.gpu.proof.runner import ProofRun
from bench.gpu.qwen35_bench import say


def llama_bench(run: ProofRun, label: str, key: str, args: list) -> None:
    """One llama-bench run of build `label` (JSON rows, or the error's tail) into results["llama_bench"]."""
    cmd = [f"{run.bindir(label)}/llama-bench", "-m", run.model_path, "-o", "json"] + args
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    try:
        rows = json.loads(p.stdout)
    except json.JSONDecodeError:
        rows = {"error": (p.stderr or p.stdout)[-2000:]}
    run.results.setdefault("llama_bench", []).append(
        {"build": label, "what": key, "argv": cmd[1:], "seconds": time.time() - t, "rows": rows})
    run.save()
    say("llama-bench", label, key, [(r.get("n_prompt"), r.get("n_gen"), r.get("samples_ts"))
                                     for r in rows] if isinstance(rows, list) else rows)


def prompt_speed(run: ProofRun, build: str) -> None:
    """`pp:BUILD`: prompt processing at plan["llama_bench"]'s sizes."""
    llama_bench(run, build, "pp", run.plan["llama_bench"]["args"])


def decode_speed(run: ProofRun) -> None:
    """`tg`: single-stream decode (tg128) on the default build."""
    llama_bench(run, "default", "tg", run.plan["tg"]["args"])


def prompt_and_decode(run: ProofRun, build: str) -> None:
    """`bench27:BUILD`: issue 27's prompt processing, then its decode, on that build."""
    for what in ("pp", "tg"):
        llama_bench(run, build, f"{what}27", run.plan["bench"][what])


def batched_decode(run: ProofRun) -> None:
    """`batched`: llama-batched-bench at plan["batched"] 3 times, then once with a unified KV cache;
    every row (one per parallel count) and the log's graph and error lines."""
    out = run.results.setdefault("batched", [])
    b = run.plan["batched"]
    for rep, extra in enumerate([[], [], [], b["kvu"]]):
        cmd = [f"{run.a.bin}/llama-batched-bench", "-m", run.model_path] + b["args"] + extra
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        out.append({"run": rep, "kvu": bool(extra), "argv": cmd[1:], "rows": rows,
                    "log": [line for line in p.stderr.splitlines() if "graph" in line or "error" in line.lower()][:20]})
        run.save()
        say("batched", rep, extra, [(r.get("pl"), round(r.get("speed_tg", 0))) for r in rows])
