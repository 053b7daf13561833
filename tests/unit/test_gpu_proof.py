"""The GPU proof packs at HEAD (issue 19): a tiny llama.cpp checkout stands in for the sdist's, so
CI packs without downloading it; the pack holds what the GPU machine runs, rendered by voltafleet."""
import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from bench.gpu import gpu_proof, v100_measure
from voltafleet.planning import hostplan

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
    # the vocabulary travels once, inside llama.cpp.git: its name and blob, which give back the pin's bytes
    assert not (dest / "ggml-vocab-qwen35.gguf").exists()
    name, blob = (dest / "vocab-blobs.txt").read_text().split()
    assert name == "ggml-vocab-qwen35.gguf"
    assert subprocess.run(["git", "--git-dir", str(bare), "cat-file", "blob", blob], capture_output=True,
                          check=True).stdout == (src / "models" / name).read_bytes()
    for f in ("vf-build-release.sh", "gpu_proof.sh", "qwen35gen.py", "vocab-blobs.txt", "Qwen3.5-4B.jinja",
              "gguf-py/gguf/__init__.py", "bench/gpu/proof_bench.py", "bench/gpu/qwen35_bench.py", "bench/gpu/voltarule.py",
              "voltafleet/hostside/smoke_client.py", "voltafleet/hostside/workload.py"):
        assert (dest / f).is_file(), f
    # every module of the phases' package, byte for byte
    proof = sorted(p.name for p in (REPO / "bench/gpu/proof").glob("*.py"))
    assert {"__init__.py", "runner.py", "loads.py", "thinking.py"} <= set(proof)
    assert sorted(p.name for p in (dest / "bench/gpu/proof").glob("*.py")) == proof
    for f in proof:
        assert (dest / "bench/gpu/proof" / f).read_bytes() == (REPO / "bench/gpu/proof" / f).read_bytes(), f
    assert not (dest / "gguf-py/tests").exists()
    assert (dest / "vf-build-release.sh").read_bytes() == (REPO / "roles/llama_cpp/files/vf-build-release.sh").read_bytes()
    plan = json.loads((dest / "plan.json").read_text())
    argv = plan["build"]["argv"]
    spec = hostplan.build_spec(gpu_proof.group_cfg("v100_16gb").replace(**{"llama_cpp_cmake_extra": [],
                                "cuda_toolkit_version": gpu_proof.TOOLKIT, "llama_cpp_targets": gpu_proof.TARGETS,
                                "llama_cpp_repo": "file://@PACK@/llama.cpp.git"}), [gpu_proof.ARCH], gpu_proof.COMMIT)
    assert argv[0] == "@PACK@/vf-build-release.sh" and argv[argv.index("--") + 1:] == list(spec.flags)
    assert argv[2] == plan["build"]["fingerprint"] == spec.fingerprint("DEVICE_NVCC", "DEVICE_CXX")
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in argv and "llama-batched-bench" in argv[argv.index("--") - 1]
    serve = {s["name"]: s["args"] for s in plan["serve"]}
    assert serve["v32-ship"] == gpu_proof.render("v100_32gb")
    assert serve["v16-ship"] == gpu_proof.render("v100_16gb")
    # the device script runs the pinned build script with this argv, shellcheck-clean
    r = subprocess.run([SHELLCHECK, "-x", str(dest / "gpu_proof.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_the_device_script_writes_the_vocabulary_out_of_the_packs_git(tmp_path, checkout):
    """gpu_proof.sh's own block (between its comment and its `fi`), run by bash on the pack: the file qwen35gen
    reads appears, byte for byte the pin's; a blob the repository lacks fails the run with a line saying so."""
    src, head = checkout
    dest = tmp_path / "pack"
    gpu_proof.pack(dest, checkout=src, commit=head)
    lines = (dest / "gpu_proof.sh").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if "a vocabulary the pack left" in ln)
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "fi")
    block = "\n".join(lines[start:end + 1])
    res = tmp_path / "res"
    res.mkdir()
    script = f'set -u\nW={dest}\nRES={res}\nlog() {{ echo "$*" >> "$RES/progress.txt"; }}\n{block}\necho ok\n'
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    assert (dest / "ggml-vocab-qwen35.gguf").read_bytes() == (src / "models/ggml-vocab-qwen35.gguf").read_bytes()
    (dest / "ggml-vocab-qwen35.gguf").unlink()
    (dest / "vocab-blobs.txt").write_text("ggml-vocab-qwen35.gguf " + "0" * 40 + "\n")
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert r.returncode == 1 and (res / "DONE").read_text().strip() == "failed"
    assert "is not in llama.cpp.git" in (res / "progress.txt").read_text()


def test_a_pack_and_the_checkout_over_a_device_call_are_refused(tmp_path, monkeypatch):
    """The limit counts what a call carries: the pack and the checkout's tracked files together."""
    (tmp_path / "f").write_bytes(b"x" * 1024)
    monkeypatch.setattr(gpu_proof, "tracked_bytes", lambda: gpu_proof.LIMIT - 1000)
    with pytest.raises(SystemExit, match="tracked files"):
        gpu_proof.carried(tmp_path, ["f"])
    monkeypatch.setattr(gpu_proof, "tracked_bytes", lambda: gpu_proof.LIMIT - 1024)
    assert gpu_proof.carried(tmp_path, ["f"]) == 1024
    assert 0 < gpu_proof.tracked_bytes() < gpu_proof.LIMIT


def test_the_issue49_validation_pack_replaces_host49_and_tier41_alone(tmp_path, checkout):
    """`pack49v`: plan.json as `pack`'s, its host49 and tier41 entries plan49v's; the device script takes its phases."""
    from bench.gpu.proof_bench import refused

    src, head = checkout
    plain = json.loads(Path(gpu_proof.pack(tmp_path / "a", checkout=src, commit=head)["dest"], "plan.json").read_text())
    m = gpu_proof.pack(tmp_path / "b", checkout=src, commit=head, overlay=gpu_proof.plan49v())
    plan = json.loads(Path(m["dest"], "plan.json").read_text())
    want = json.loads(json.dumps(gpu_proof.plan49v()))
    assert plan["host49"] == want["host49"] and plan["tier41"] == want["tier41"]
    assert {k: v for k, v in plan.items() if k not in want} == {k: v for k, v in plain.items() if k not in want}
    assert plan.keys() == plain.keys() and refused(gpu_proof.PHASES49V.split(",")) is None


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


# ---------------------------------------------------------------- what runs on the GPU machine

def unresolved_imports(root: Path, files) -> list[str]:
    """Every import of the files (module level or in a function) that is neither the standard library's
    nor held under root: what a python3 with nothing installed, root on its path, could not import."""
    def held(name: str) -> bool:
        path = root.joinpath(*name.split("."))
        return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()

    def package(name: str) -> bool:
        return (root.joinpath(*name.split(".")) / "__init__.py").is_file()

    out = []
    for f in files:
        for node in ast.walk(ast.parse((root / f).read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:  # of a package: its modules (the
                names = [f"{node.module}.{a.name}" if package(node.module) else node.module for a in node.names]
            else:                                                    # __init__ files define nothing)
                continue
            out += [f"{f}: {n}" for n in names if n.split(".")[0] not in sys.stdlib_module_names and not held(n)]
    return out


def plain_python3(root: Path, *args: str) -> subprocess.CompletedProcess:
    """python3 as a GPU machine or a V100 host has it: no site-packages (-S: no venv, no yaml, no httpx),
    the folder on PYTHONPATH, run from elsewhere."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-S", *args], cwd=root.parent, env=env, capture_output=True, text=True,
                          timeout=60)


def test_the_pack_runs_where_only_python3_is(tmp_path, checkout):
    """gpu_proof.sh runs `python3 -m bench.gpu.proof_bench` with the pack on PYTHONPATH: the modules sit
    at their repository paths and import each other by their package names, stdlib only."""
    src, head = checkout
    dest = tmp_path / "pack"
    gpu_proof.pack(dest, checkout=src, commit=head)
    assert unresolved_imports(dest, gpu_proof.MACHINE_SOURCES) == []
    r = plain_python3(dest, "-m", "bench.gpu.proof_bench", "--help")
    assert r.returncode == 0 and "--phases" in r.stdout, r.stderr
    r = plain_python3(dest, "-c", "import bench.gpu.proof_bench, bench.gpu.qwen35_bench, voltafleet.hostside.smoke_client, "
                                  "voltafleet.hostside.workload")
    assert r.returncode == 0, r.stderr
    # a phase list it cannot run is refused there before anything starts (no plan read, no results written)
    r = plain_python3(dest, "-m", "bench.gpu.proof_bench", "--plan", str(tmp_path / "no-plan.json"), "--bin", "/nowhere",
                      "--models", "/nowhere", "--res", str(tmp_path), "--phases", "tg,think33:volta")
    assert r.returncode == 2 and "unknown phase 'think33'" in r.stderr and "think32:BUILD" in r.stderr, r.stderr
    assert not (tmp_path / "results.json").exists()
    r = plain_python3(dest, str(dest / "voltafleet/hostside/workload.py"), "--help")  # the tune29 phase runs it by its path
    assert r.returncode == 0, r.stderr
    r = plain_python3(dest, str(dest / "bench/gpu/voltarule.py"), str(tmp_path / "no-source"))
    assert r.returncode == 1 and r.stderr.startswith("voltarule: "), r.stderr  # ran: no tree to patch here
    assert "bench.gpu.proof_bench" in (dest / "gpu_proof.sh").read_text()


def test_the_first_v100_host_measurement_runs_from_what_is_shipped(tmp_path):
    """bench/gpu/v100_measure.py's SHIPPED (the operator's tar line) holds every module it imports."""
    host = tmp_path / "vf-measure"
    for f in v100_measure.SHIPPED:
        (host / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / f, host / f)
    # the GPU proof's runner (Sampler, concurrent), not its phases, which import voltafleet's clients
    assert unresolved_imports(host, v100_measure.SHIPPED) == []
    r = plain_python3(host, "-m", "bench.gpu.v100_measure", "--help")
    assert r.returncode == 0 and "--instance" in r.stdout, r.stderr
    r = plain_python3(host, "-c", "from bench.gpu.proof.runner import Sampler, concurrent")
    assert r.returncode == 0, r.stderr
