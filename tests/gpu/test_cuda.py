"""On a GPU machine only (skipped elsewhere, as in CI): the CUDA build through voltafleet's
build script for the GPU's own arch, nvcc 13 refusing sm_70, a model served with all layers
offloaded at several ctx/KV settings, the VRAM planner against nvidia-smi, the smoke client.

Prepare with `.venv/bin/python bench/gpu_prep.py` (carries sources to the GPU box), run
`python3 -m pytest tests/gpu` there; the results are written to bench/ (recorded in the
repo and checked on every CI run by tests/ops/test_gpu_records.py).
"""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
has_gpu = shutil.which("nvidia-smi") is not None and subprocess.run(
    ["nvidia-smi", "-L"], capture_output=True).returncode == 0
pytestmark = [pytest.mark.skipif(not has_gpu, reason="no NVIDIA GPU on this machine"),
              pytest.mark.skipif(not (REPO / ".device" / "build.sh").exists(),
                                 reason=".device/ not prepared (bench/gpu_prep.py)")]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu")
    proc = subprocess.run(["bash", "bench/gpu_run.sh"], cwd=REPO, env={**os.environ, "OUT": str(out)},
                          capture_output=True, text=True, timeout=1800)
    record = Path(os.environ.get("VOLTAFLEET_GPU_RECORD", out))
    for name in ("build.txt", "loads.json"):
        if (out / name).exists() and record != out:
            shutil.copy(out / name, record / f"gpu-{name.split('.')[0]}-latest.{name.split('.')[1]}")
    return out, proc


def test_build_through_the_build_script(results):
    out, proc = results
    assert "build rc=0" in proc.stdout + (out / "build.txt").read_text()


def test_nvcc_13_refuses_sm_70(results):
    out, _ = results
    assert "Unsupported gpu architecture 'compute_70'" in (out / "build.txt").read_text()


def test_all_layers_offloaded_and_smoke_numbers(results):
    out, _ = results
    loads = json.loads((out / "loads.json").read_text())
    assert loads and all(r["healthy"] for r in loads)
    for r in loads:
        assert any("offloaded" in l and l.split("offloaded ")[1].split()[0].split("/")[0]
                   == l.split("offloaded ")[1].split()[0].split("/")[1] for l in r["log"])
    smoke = json.loads(next(r["smoke"] for r in loads if "smoke" in r))["instances"][0]
    assert smoke["aggregate_tps"] > smoke["single_tps"] > 0
