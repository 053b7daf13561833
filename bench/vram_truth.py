"""Planner vs. measured VRAM on the H200 (the table in bench/VRAM_TRUTH.md).

Measured: llama-server's own process memory (nvidia-smi --query-compute-apps) after load,
from bench/gpu-loads-run*.json (bench/gpu_run.sh). Predicted: voltafleet.vram from the
same model's GGUF header (tests/fixtures/gguf/). Overhead: 600 MiB (CUDA context).

    .venv/bin/python bench/vram_truth.py
"""
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from voltafleet.gguf_header import from_json  # noqa: E402
from voltafleet.vram import MIB, ModelShape, plan  # noqa: E402

RUNS = [("gpu-loads-run1.json", {"q4ks": "qwen2-1p5b-q4ks", "q8": "qwen2-1p5b-q8"}),
        ("gpu-loads-run2.json", {"q4ks": "qwen2-4b-q4ks"})]


def rows():
    for run, models in RUNS:
        for r in json.loads((REPO / "bench" / run).read_text()):
            fixture = models[r["model"]]
            shape = ModelShape.from_header(from_json(json.loads(
                (REPO / "tests/fixtures/gguf" / f"{fixture}.json").read_text())))
            p = plan(shape, r["ctx"], r["parallel"], r["k"], r["v"], gpu_mib=143771)
            measured = int(r["apps"].split(",")[1])
            predicted = p.needed / MIB
            yield fixture, r, measured, predicted, (predicted - measured) / measured * 100


def main():
    print("| model | -c | -np | K/V | measured MiB | predicted MiB | error |")
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    for fixture, r, meas, pred, err in rows():
        worst = max(worst, abs(err))
        print(f"| {fixture} | {r['ctx']} | {r['parallel']} | {r['k']}/{r['v']} | {meas} | {pred:.0f} | {err:+.1f} % |")
    print(f"\nworst error {worst:.1f} %")


if __name__ == "__main__":
    main()
