"""What stays assumed until a real V100 answers (issue 27): run on the first V100 host of a group,
with one of its GPUs out of rotation; stdlib only, with the two modules it imports (SHIPPED, kept at
their repository paths so that they import there as here):

    tar cf - bench/__init__.py bench/gpu/__init__.py bench/gpu/v100_measure.py bench/gpu/qwen35_bench.py \
        bench/gpu/proof/__init__.py bench/gpu/proof/runner.py | ssh HOST 'mkdir -p /tmp/vf-measure && tar xf - -C /tmp/vf-measure'
    ssh HOST 'cd /tmp/vf-measure && sudo python3 -m bench.gpu.v100_measure [--instance 0]'

It starts the host's own release (ROOT/current/bin/llama-server) with instance INSTANCE's argv
(ENV_DIR/INSTANCE.env: the group's flags as voltafleet rendered them, on a spare port), on that
instance's GPU, and prints one JSON document:

  cuda_context_mib   process memory after load minus every CUDA0 buffer llama.cpp logs: the
                     planner's vram_cuda_overhead_mib (assumed 610, the H200's, for Volta + CUDA 12)
  pool_growth_mib    the peak after one 2,048-token prompt per slot at once (shorter if a slot is), over after-load: the
                     planner's CUDA pool term for this build (plan: FORCE_MMQ 32 MiB scratch)
  prompt_tps         prompt tok/s at 128, 512 and 2,048 tokens (median of 3): MMQ's dp4a speed on
                     Volta (the H200 runs int8 MMA kernels; field reports only, #25139)
  decode_tps         single-stream decode (median of 3, 128 tokens)
  load_mb_s, pcie    the model's host-to-GPU load rate and the link nvidia-smi reports

Stop the instance first (drained: the rollout's gateway runtime API, or `--limit` it out):
`systemctl stop llama-server@INSTANCE`; start it again after.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import time

from bench.gpu.qwen35_bench import Server, complete, gpu_mem, prompt_ids

# what goes to the host (the tar line above): this module, what it imports, and their packages' __init__
SHIPPED = ("bench/__init__.py", "bench/gpu/__init__.py", "bench/gpu/v100_measure.py", "bench/gpu/qwen35_bench.py",
           "bench/gpu/proof/__init__.py", "bench/gpu/proof/runner.py")


def env_of(path: str) -> dict:
    out = {}
    for line in open(path):
        k, _, v = line.strip().partition("=")
        if k and not k.startswith("#"):
            out[k] = v
    return out


def spare_port(args: list[str], port: int) -> list[str]:
    """Instance 0's argv on a spare port, listening on loopback only (the measurement's own copy)."""
    args = list(args)
    args[args.index("--port") + 1] = str(port)
    if "--host" in args:
        args[args.index("--host") + 1] = "127.0.0.1"
    return args


def pcie(gpu: str) -> str | None:
    try:
        return subprocess.run(["nvidia-smi", "-i", gpu or "0", "--query-gpu=name,pcie.link.gen.current,"
                               "pcie.link.width.current,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip() or None
    except OSError:
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default="/opt/voltafleet")
    ap.add_argument("--env-dir", default="/etc/voltafleet/llama-server")
    ap.add_argument("--instance", type=int, default=0)
    ap.add_argument("--port", type=int, default=18999)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    env = env_of(f"{a.env_dir}/{a.instance}.env")
    args = spare_port(shlex.split(env["LLAMA_SERVER_ARGS"]), a.port)
    model = args[args.index("-m") + 1]
    os.environ["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "")
    t0 = time.time()
    s = Server(f"{a.root}/current/bin/llama-server", args, model, a.port, "/tmp/v100-measure.log")
    out = {"args": args, "healthy": s.ok, "pcie": pcie(env.get("CUDA_VISIBLE_DEVICES", "")),
           "load_s": round(time.time() - t0, 2)}
    try:
        if not s.ok:
            out["error"] = s.log()[-2000:]
            return 1
        time.sleep(1)
        load = gpu_mem(s.p.pid).get("proc_mib")
        bufs = sum(m for dev, _, m in s.buffers() if dev.startswith("CUDA") and not dev.endswith("Host"))
        out.update(mem_load_mib=load, cuda_buffers_mib=round(bufs),
                   cuda_context_mib=round(load - bufs) if load else None,
                   load_mb_s=round(os.path.getsize(model) / 1e6 / max(s.load_s, 1e-3)))
        slots = int(args[args.index("-np") + 1]) if "-np" in args else 1
        per_slot = int(args[args.index("-c") + 1]) // slots if "-c" in args else 4096
        longest = min(2048, per_slot - 16)
        prompt = {}
        for n in (128, 512, longest):
            runs = [complete(a.port, prompt_ids(3000 + 10 * n + r, n), 1) for r in range(a.reps)]
            prompt[n] = round(statistics.median(r["prompt_n"] / r["prompt_ms"] * 1000 for r in runs), 1)
        out["prompt_tps"] = prompt
        out["decode_tps"] = round(statistics.median(
            complete(a.port, prompt_ids(4000 + r, 32), 128)["decode_tps"] for r in range(a.reps)), 1)
        from bench.gpu.proof.runner import Sampler, concurrent  # the GPU proof's sampler and release-all-at-once
        sampler = Sampler(s.p.pid)
        concurrent(a.port, [(lambda i=i: complete(a.port, prompt_ids(5000 + i, longest), 8)) for i in range(slots)])
        time.sleep(0.5)
        peak = sampler.stop()
        out.update(mem_peak_mib=peak, pool_growth_mib=peak - load if peak and load else None, slots=slots)
        out["build"] = [line for line in s.log().splitlines() if re.search(r"FORCE_MMQ|FORCE_CUBLAS|ARCHS", line)][:4]
    finally:
        s.stop()
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
