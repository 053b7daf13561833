"""The GPU proof packs at HEAD (issue 19): a tiny llama.cpp checkout stands in for the sdist's, so
CI packs without downloading it; the pack holds what the GPU machine runs, rendered by voltafleet."""
import hashlib
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from bench.gpu import gpu_proof
from voltafleet import hostplan

REPO = Path(__file__).resolve().parents[2]
SHELLCHECK = str(Path(sys.executable).with_name("shellcheck"))


@pytest.fixture
def checkout(tmp_path):
    src = tmp_path / "llama.cpp"
    (src / "gguf-py/gguf").mkdir(parents=True)
    (src / "gguf-py/tests").mkdir()
    (src / "models").mkdir()
    (src / "CMakeLists.txt").write_text("project(llama.cpp)\n")
    (src / "gguf-py/gguf/__init__.py").write_text("")
    (src / "gguf-py/tests/test_x.py").write_text("")
    (src / "models/ggml-vocab-qwen35.gguf").write_bytes(b"GGUF" + bytes(64))
    (src / "models/templates").mkdir()
    (src / "models/templates/Qwen3.5-4B.jinja").write_text("{{ messages }}")
    git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(src)], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "tiny"], check=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    return src, head


def test_pack_holds_the_commit_the_build_script_and_every_argv(tmp_path, checkout):
    src, head = checkout
    dest = tmp_path / "pack"
    m = gpu_proof.pack(dest, checkout=src, commit=head)
    assert m["bytes"] < gpu_proof.LIMIT
    bare = dest / "llama.cpp.git"
    assert subprocess.run(["git", "-C", str(bare), "cat-file", "-t", head], capture_output=True,
                          text=True).stdout.strip() == "commit"
    for f in ("vf-build-release.sh", "gpu_proof.sh", "qwen35gen.py", "ggml-vocab-qwen35.gguf", "Qwen3.5-4B.jinja",
              "gguf-py/gguf/__init__.py", "bench/gpu/proof_bench.py", "bench/gpu/qwen35_bench.py", "bench/gpu/voltarule.py",
              "voltafleet/smoke_client.py", "voltafleet/workload.py"):
        assert (dest / f).is_file(), f
    assert not (dest / "gguf-py/tests").exists()
    assert (dest / "vf-build-release.sh").read_bytes() == (REPO / "roles/llama_cpp/files/vf-build-release.sh").read_bytes()
    plan = json.loads((dest / "plan.json").read_text())
    argv = plan["build"]["argv"]
    spec = hostplan.build_spec({**gpu_proof.group_cfg("v100_16gb"), "llama_cpp_cmake_extra": [],
                                "cuda_toolkit_version": gpu_proof.TOOLKIT, "llama_cpp_targets": gpu_proof.TARGETS,
                                "llama_cpp_repo": "file://@PACK@/llama.cpp.git"}, [gpu_proof.ARCH], gpu_proof.COMMIT)
    assert argv[0] == "@PACK@/vf-build-release.sh" and argv[argv.index("--") + 1:] == list(spec.flags)
    assert argv[2] == plan["build"]["fingerprint"] == spec.fingerprint("DEVICE_NVCC", "DEVICE_CXX")
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in argv and "llama-batched-bench" in argv[argv.index("--") - 1]
    serve = {s["name"]: s["args"] for s in plan["serve"]}
    assert serve["v32-ship"] == gpu_proof.render("v100_32gb")
    assert serve["v16-ship"] == gpu_proof.render("v100_16gb")
    # the device script runs the pinned build script with this argv, shellcheck-clean
    r = subprocess.run([SHELLCHECK, "-x", str(dest / "gpu_proof.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_pack_refuses_another_commit(tmp_path, checkout):
    src, _ = checkout
    with pytest.raises(SystemExit, match="the pin is"):
        gpu_proof.pack(tmp_path / "pack", checkout=src, commit="0" * 40)


def test_sdist_checkout_checks_the_pinned_sha256(tmp_path):
    cache = tmp_path / "sdist"
    cache.mkdir()
    inner = tmp_path / f"llama_cpp_python-{gpu_proof.SDIST_VERSION}/vendor/llama.cpp"
    inner.mkdir(parents=True)
    (inner / "CMakeLists.txt").write_text("")
    tarball = cache / f"llama_cpp_python-{gpu_proof.SDIST_VERSION}.tar.gz"
    with tarfile.open(tarball, "w:gz") as tf:
        tf.add(inner.parents[1], arcname=inner.parents[1].name)
    with pytest.raises(SystemExit, match="!= pinned"):
        gpu_proof.sdist_checkout(cache)
    sha = hashlib.sha256(tarball.read_bytes()).hexdigest()
    assert gpu_proof.sdist_checkout(cache, sha) == cache / inner.parents[1].name / "vendor/llama.cpp"


def test_older_prep_scripts_import():
    """bench/gpu/gpu_prep.py and bench/gpu/qwen35_prep.py failed with ImportError once (issue 19)."""
    import bench.gpu.gpu_prep  # noqa: F401
    import bench.gpu.qwen35_prep  # noqa: F401

