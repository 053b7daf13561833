"""Pack everything the H200 run of the real Qwen3.6-27B shape needs into one folder.

The GPU box has no network: it gets llama.cpp at the pinned commit (bench/gpu/gpu_proof.py packs it from the
llama-cpp-python sdist), gguf-py and models/ggml-vocab-qwen35.gguf from the same tree, the model
generator (lab/qwen35gen.py), voltafleet's own build script, and every llama-server argv
to run, rendered by voltafleet.planning.flags.server_args from group_vars (all.yml + the V100
group files) with only ctx / slots / KV types changed along the ladder.

    .venv/bin/python -m bench.gpu.qwen35_prep [DEST]   # default /work/main/.gpuwork
    # then, on the device: bash .gpuwork/qwen35_gpu.sh   (carry [".gpuwork"])
"""
import json
import shutil
import sys
from pathlib import Path

from bench.gpu.gpu_proof import COMMIT, PORT, build_script_line, group_cfg, pack_sources, render

REPO = Path(__file__).resolve().parents[2]

# VRAM ladder: (ctx, slots, KV type); f16 and q8_0, 4K-128K pool, 1-16 slots
LADDER = [(4096, 1, "f16"), (8192, 1, "f16"), (8192, 4, "f16"), (16384, 2, "f16"), (32768, 1, "f16"),
          (32768, 8, "f16"),
          (4096, 1, "q8_0"), (4096, 4, "q8_0"), (8192, 1, "q8_0"), (8192, 2, "q8_0"), (8192, 4, "q8_0"),
          (16384, 4, "q8_0"), (32768, 8, "q8_0"), (65536, 16, "q8_0"), (131072, 16, "q8_0")]


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/work/main/.gpuwork")
    pack_sources(out)
    shutil.copy(REPO / "lab/qwen35gen.py", out)
    for f in ("qwen35_gpu.sh", "qwen35_bench.py"):
        shutil.copy(REPO / "bench" / "gpu" / f, out)
    line, fp = build_script_line("/DEVICE_REPO/.gpuwork", ["llama-server", "llama-bench"])
    (out / "build.sh").write_text(line + "\n")
    (out / "fingerprint").write_text(fp + "\n")

    plan = {"port": PORT, "commit": COMMIT, "ladder": [], "bench": [], "reuse": [], "mtp": []}
    for c, n, kv in LADDER:
        plan["ladder"].append({"name": f"c{c}-np{n}-{kv}", "model": "q4ks", "ctx": c, "parallel": n, "kv": kv,
                               "args": render("v100_16gb", c, n, kv)})
    seed = ["-m", "MODEL", "--host", "127.0.0.1", "--port", str(PORT)]
    plan["bench"] = [
        {"name": "a-seed-initial", "model": "q8_0", "args": seed[:2] + ["-ngl", "20", "-c", "32768"] + seed[2:],
         "bench": ["-ngl", "20"], "tokens": 32, "streams": [1, 4, 8, 16], "tg": 32},
        {"name": "b-llama-defaults", "model": "q4ks", "args": ["-m", "MODEL", "--port", str(PORT)],
         "bench": [], "tokens": 128, "streams": [1, 4, 8, 16], "tg": 128},
        {"name": "c-seed-stage3", "model": "q4ks",
         "args": seed[:2] + "-ngl 99 -c 8192 -ctk q8_0 -ctv q8_0 -np 4 -t 8".split() + seed[2:],
         "bench": "-ngl 99 -ctk q8_0 -ctv q8_0 -fa 1 -t 8".split(), "tokens": 128, "streams": [1, 4, 8, 16], "tg": 128},
    ]
    for group in ("v100_16gb", "v100_32gb"):
        g = group_cfg(group)
        plan["bench"].append({"name": f"d-{group}", "model": "q4ks", "args": render(group),
                              "bench": ["-ngl", "99", "-ctk", g.server.cache_type_k, "-ctv",
                                        g.server.cache_type_v, "-fa", "1", "-t", str(g.server.threads)],
                              "tokens": 128, "streams": [1, 4, 8, 16], "tg": 128})
    # alternatives for the V100 choices, served with the project's own argv
    for c, n, kv in ((8192, 2, "q8_0"), (32768, 8, "q8_0")):
        plan["bench"].append({"name": f"e-c{c}-np{n}-{kv}", "model": "q4ks", "args": render("v100_16gb", c, n, kv),
                              "bench": None, "tokens": 128, "streams": [1, 4, 8, 16], "tg": 128})
    # prompt reuse: 8K a slot so a 4K prompt plus a turn fits
    for label, extra in (("default", ()), ("no-checkpoints", ("--ctx-checkpoints 0",)),
                         ("cache-ram-0", ("--cache-ram 0",))):
        plan["reuse"].append({"name": f"reuse-{label}", "model": "q4ks",
                              "args": render("v100_16gb", 16384, 2, "q8_0", extra)})
    # MTP: the same file with and without the draft head served
    base = render("v100_16gb")
    plan["mtp"] = [
        {"name": "mtp-file-no-spec", "model": "q4ks-mtp", "args": base},
        {"name": "mtp-spec-n3", "model": "q4ks-mtp", "args": render("v100_16gb", extra=("--spec-type draft-mtp",))},
        {"name": "mtp-spec-n1", "model": "q4ks-mtp",
         "args": render("v100_16gb", extra=("--spec-type draft-mtp", "--spec-draft-n-max 1"))},
    ]
    (out / "plan.json").write_text(json.dumps(plan, indent=1))
    # run 2: what the first run left open (16-client aggregate without context checkpoints,
    # single stream with sampling on the GPU): PLAN=plan2.json MODELS=q4ks:--ftype\ q4_k_s
    stage3 = next(b for b in plan["bench"] if b["name"] == "c-seed-stage3")
    extra = [("x-v100_32gb-nockpt", render("v100_32gb", extra=("--ctx-checkpoints 0",))),
             ("x-seed-stage3-nockpt", stage3["args"] + ["--ctx-checkpoints", "0"]),
             ("x-v100_16gb-bs", render("v100_16gb", extra=("--backend-sampling",))),
             ("x-v100_32gb-bs-nockpt", render("v100_32gb", extra=("--backend-sampling", "--ctx-checkpoints 0")))]
    plan2 = {**plan, "bench": [{"name": n, "model": "q4ks", "args": a, "bench": None, "tokens": 128,
                                "streams": [1, 4, 8, 16], "tg": 128} for n, a in extra]}
    (out / "plan2.json").write_text(json.dumps(plan2, indent=1))
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"prepared {out}: fingerprint {fp}, {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
