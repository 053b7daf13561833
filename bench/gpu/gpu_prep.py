"""Prepare .device/ for bench/gpu/gpu_run.sh (the qwen2 stand-ins of issue 3) on a GPU machine
without network. The current proof is bench/gpu/gpu_proof.py; this keeps the older run reproducible.

Carries: llama.cpp at the pin, gguf-py and the Qwen2 vocab from the same tree (bench/gpu/gpu_proof.py's
pack_sources), voltafleet's build script with its argv (build.sh), the fact commands of
roles/facts.py, the server flags of voltafleet.planning.flags, the smoke client and the model writer.

    .venv/bin/python -m bench.gpu.gpu_prep    # then: device run with carry [".device"]
"""
import json
import shutil
from pathlib import Path

from bench.gpu.gpu_proof import COMMIT, TOOLKIT, build_script_line, group_cfg, pack_sources
from roles import facts
from voltafleet.planning import fingerprint as fpmod
from voltafleet.planning.flags import server_args

REPO = Path(__file__).resolve().parents[2]

OUT = REPO / ".device"
# Planner truth-check configs: (name, ctx, parallel, K type, V type)
CONFIGS = [("c2k-f16-np1", 2048, 1, "f16", "f16"), ("c4k-f16", 4096, 1, "f16", "f16"), ("c8k-q8-np4", 8192, 4, "q8_0", "q8_0"),
           ("c16k-q8", 16384, 1, "q8_0", "q8_0"), ("c32k-f16-np4", 32768, 4, "f16", "f16"),
           ("c32k-q8-np8", 32768, 8, "q8_0", "q8_0")]


def main():
    pack_sources(OUT, vocabs=("qwen2",))
    shutil.copy(REPO / "lab/tinymodel.py", OUT)
    shutil.copy(REPO / "voltafleet/hostside/smoke_client.py", OUT / "voltafleet-smoke")
    line, fp = build_script_line("/DEVICE_REPO/.device", ["llama-server", "llama-quantize", "llama-bench"])
    (OUT / "build.sh").write_text(line + "\n")
    (OUT / "fingerprint").write_text(fp + "\n")
    sm70 = fpmod.cmake_flags("cuda", [70], [], ("q8_0", "q8_0"), nvcc=f"/usr/local/cuda-{TOOLKIT}/bin/nvcc")
    (OUT / "sm70-flags").write_text(" ".join(f"'{f}'" for f in sm70) + "\n")
    fact_cmds = {"Gpus": facts.Gpus().command(), "NvccVersion": facts.NvccVersion().command(),
                 "NvccVersionPinned": facts.NvccVersion().command(path=f"/usr/local/cuda-{TOOLKIT}/bin/nvcc"),
                 "HostBasics": facts.HostBasics().command(), "FreeDisk": facts.FreeDisk().command(path="/tmp/vf")}
    (OUT / "facts.json").write_text(json.dumps(fact_cmds, indent=1))
    cfg = group_cfg("v100_16gb").replace(**{"server_threads": 8, "llama_cpp_ref": COMMIT})
    configs = []
    for name, c, np_, k, v in CONFIGS:
        run_cfg = cfg.replace(server_ctx=c, server_parallel=np_, server_cache_type_k=k, server_cache_type_v=v)
        configs.append({"name": name, "ctx": c, "parallel": np_, "k": k, "v": v,
                        "args": server_args(run_cfg, "MODEL", port=18080, api_key_file=None)})
    (OUT / "configs.json").write_text(json.dumps(configs, indent=1))
    print(f"prepared {OUT}: fingerprint {fp}, {sum(f.stat().st_size for f in OUT.rglob('*') if f.is_file()) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
