"""The results recorded from the H200 runs (bench/gpu_run.sh), checked on every CI run:
the CUDA build through voltafleet's build script, all layers offloaded, and nvcc 13's
refusal of sm_70."""
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_cuda_build_through_the_build_script_succeeded():
    text = (BENCH / "gpu-build-run1.txt").read_text()
    assert "build rc=0" in text and "commit 0c1e570" in text


def test_every_load_offloaded_all_layers_and_was_healthy():
    loads = json.loads((BENCH / "gpu-loads-run2.json").read_text())
    assert len(loads) == 6
    for r in loads:
        assert r["healthy"]
        assert any("offloaded 37/37 layers to GPU" in line for line in r["log"]), r["name"]


def test_nvcc_13_refuses_sm_70():
    text = (BENCH / "gpu-build-run2.txt").read_text()
    assert "nvcc fatal   : Unsupported gpu architecture 'compute_70'" in text
    assert "configure rc=1" in text


def test_smoke_numbers_on_the_h200():
    loads = json.loads((BENCH / "gpu-loads-run2.json").read_text())
    smoke = json.loads(next(r["smoke"] for r in loads if "smoke" in r))["instances"][0]
    assert smoke["errors"] == [] and smoke["aggregate_tps"] > smoke["single_tps"] > 0
