"""What one context checkpoint of Qwen3.6-27B costs the host, and what the allocator changes about it
(issue 51): llama-server of the pinned build on this machine's CPU, a qwen35 file whose Gated-DeltaNet
state is the 27B's (48 recurrent blocks of 48 value heads x 128 x 128: a 149.6 MiB checkpoint a slot) on
small weights, so a prompt takes milliseconds and the checkpoint's own work shows.

    .venv/bin/python -m bench.traffic.ckpt_copy --rounds 8 --out bench/records/ckpt-copy/run1.json

Each round sends `slots` new prompts at once: llama-server fills one batch slot by slot and creates each
slot's checkpoint (a new host vector: allocated, zeroed, copied from the state) before the batch is
decoded, so the time between two slots' "created context checkpoint" lines is one checkpoint
(bench.traffic.analyze.checkpoint_copy_ms). Variants run the same server under another environment:
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 has glibc's malloc ask for transparent huge pages on its mmap'd chunks
(a 149.6 MiB vector is one: 75 faults of 2 MiB instead of ~38,000 of 4 KiB). `heap` (gpu_proof.HEAP51) has
it keep every chunk in its heap (glibc.malloc.mmap_max=0) and never give the top back (a 64 GiB
trim_threshold): a freed checkpoint's pages stay resident and the next one reuses them, no faults (`--variants
default,heap`; the record keeps each server's resident peak, VmHWM). On a GPU host the copy is a
device-to-host cudaMemcpy into the same kind of new vector; this measures the allocation and page-fault
part that both share, not the PCIe copy.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from bench.gpu import gpu_proof
from bench.gpu.proof.runner import concurrent, proc_mem
from bench.gpu.qwen35_bench import Server, complete
from bench.traffic import analyze

VARIANTS = {"default": {}, "thp": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
            # no mmap'd chunks and no trimming: a freed checkpoint's pages stay in the heap, resident, for the next
            "heap": gpu_proof.HEAP51}
WORDS = ("fleet canary host driver build model slot cache server volta token prompt answer window memory "
         "kernel batch queue route gateway").split()


def shape():
    """The 27B's shape with small weights: every Gated-DeltaNet field (and so the state) is the 27B's."""
    from lab import qwen35gen as gen
    return replace(gen.SHAPES["27b"], n_embd=256, n_ff=512, n_head=4, n_head_kv=4, head_dim=64, n_vocab=248320)


def prompts(round_: int, slots: int, words: int = 48) -> list[str]:
    return [" ".join(WORDS[(round_ * 7 + s * 3 + i * (s + 1)) % len(WORDS)] for i in range(words)) + f" {round_}-{s}"
            for s in range(slots)]


def one_round(port: int, texts: list[str]) -> None:
    """The texts at once, each a new prompt of its own slot (2 tokens each); a failed request ends the run."""
    got = concurrent(port, [lambda t=t: complete(port, t, 2, stream=False, cache_prompt=True) for t in texts])
    bad = [r["error"] for r in got if r.get("error")]
    if bad:
        raise RuntimeError(f"{len(bad)} of {len(texts)} requests failed: {bad[0]}")


def run_variant(binary: str, model: str, env: dict, rounds: int, slots: int, port: int, logf: str) -> dict:
    args = ["-m", "MODEL", "-c", str(2048 * slots), "-np", str(slots), "-t", "2", "--host", "127.0.0.1",
            "--port", str(port), "--ctx-checkpoints", "4", "--cache-ram", "0", "--log-verbosity", "4", "--metrics"]
    s = Server(binary, args, model, port, logf, env=env)
    try:
        if not s.ok:
            raise RuntimeError(f"llama-server did not come up: {s.log()[-2000:]}")
        one_round(port, prompts(999, slots))  # warm-up
        start = os.path.getsize(logf)
        for r in range(rounds):
            one_round(port, prompts(r, slots))
        lines = Path(logf).read_bytes()[start:].decode(errors="replace").splitlines()
        hwm = proc_mem(s.p.pid).get("VmHWM")
    finally:
        s.stop()
    gaps = analyze.checkpoint_copy_ms(lines)
    sizes = sorted({f"{m[3]} MiB" for line in lines if (m := analyze.CREATED.search(line))})
    return {"env": env, "argv": args, "copies_alone": len(gaps), "copy_ms": gaps,
            "median_ms": statistics.median(gaps) if gaps else None, "checkpoint_sizes": sizes,
            "counts": analyze.server_counts(lines), "rss_peak_mib": round(hwm, 1) if hwm is not None else None}


def main(argv=None) -> dict:
    from lab import qwen35gen as gen
    from lab.fleet import sdist_vocab
    from tests.gateway_local import harness

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3, help="each variant's server started this many times, alternating")
    ap.add_argument("--port", type=int, default=harness.BASE_PORT + 45)
    ap.add_argument("--variants", default="default,thp", help=f"which of {', '.join(VARIANTS)}, comma-separated")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    chosen = a.variants.split(",")
    if not set(chosen) <= set(VARIANTS):
        raise SystemExit(f"--variants: {a.variants}: choose from {', '.join(VARIANTS)}")
    binary = harness.pinned_server()
    if not binary:
        raise SystemExit("needs the lab's llama-server of the pinned commit (make demo / lab up)")
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "state27b.gguf")
        gen.write_sparse(str(sdist_vocab()), model, shape(), "q4_k_s")
        runs = []
        for rep in range(a.reps):
            for name in chosen:
                env = VARIANTS[name]
                r = run_variant(binary, model, env, a.rounds, a.slots, a.port, os.path.join(tmp, f"{name}-{rep}.log"))
                runs.append({"variant": name, "rep": rep, **r})
                print(f"{name:8} rep {rep}: {r['copies_alone']} copies alone, median {r['median_ms']} ms, "
                      f"sizes {r['checkpoint_sizes']}, RSS peak {r['rss_peak_mib']} MiB", flush=True)
    out = {"argv": ["bench/traffic/ckpt_copy.py", *(sys.argv[1:] if argv is None else argv)], "machine": {"cpus": os.cpu_count(),
           "kernel": platform.release(), "thp": Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()},
           "runs": runs,
           "median_of_reps_ms": {n: statistics.median(r["median_ms"] for r in runs if r["variant"] == n)
                                 for n in chosen}}
    print(json.dumps(out["median_of_reps_ms"]))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
