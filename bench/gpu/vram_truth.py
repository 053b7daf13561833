"""Planner vs. measured VRAM on the H200 (the table in bench/VRAM_TRUTH.md).

Measured: llama-server's own process memory (nvidia-smi --query-compute-apps) after load,
from bench/records/gpu-loads-run*.json (bench/gpu/gpu_run.sh). Predicted: voltafleet.planning.vram from the
same model's GGUF header (tests/fixtures/gguf/). Overhead: 610 MiB (CUDA context + cuBLAS).
Second table: the Qwen3.6-27B shape (hybrid qwen35, bench/records/qwen35-h200-run1.json), each
term against llama.cpp's own CUDA0 buffer and the total against nvidia-smi's process memory
after the first request.

    .venv/bin/python -m bench.gpu.vram_truth
"""
import json
from pathlib import Path

from voltafleet.models.gguf_header import from_json
from voltafleet.planning.vram import MIB, ModelShape, plan

REPO = Path(__file__).resolve().parents[2]

RUNS = [("gpu-loads-run1.json", {"q4ks": "qwen2-1p5b-q4ks", "q8": "qwen2-1p5b-q8"}),
        ("gpu-loads-run2.json", {"q4ks": "qwen2-4b-q4ks"})]


def shape_of(fixture: str) -> ModelShape:
    """The ModelShape of a GGUF header kept in tests/fixtures/gguf (`fixture`: its name without .json)."""
    return ModelShape.from_header(from_json(json.loads((REPO / "tests/fixtures/gguf" / f"{fixture}.json").read_text())))


def rows():
    for run, models in RUNS:
        for r in json.loads((REPO / "bench" / "records" / run).read_text()):
            fixture = models[r["model"]]
            shape = shape_of(fixture)
            p = plan(shape, r["ctx"], r["parallel"], r["k"], r["v"], gpu_mib=143771, overhead_mib=592)  # after load
            measured = int(r["apps"].split(",")[1])
            predicted = (p.needed - p.pool) / MIB  # after load: the pool is still empty (tests/unit/test_vram.py)
            yield fixture, r, measured, predicted, (predicted - measured) / measured * 100


def main():
    print("| model | -c | -np | K/V | measured MiB | predicted MiB | error |")
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    for fixture, r, meas, pred, err in rows():
        worst = max(worst, abs(err))
        print(f"| {fixture} | {r['ctx']} | {r['parallel']} | {r['k']}/{r['v']} | {meas} | {pred:.0f} | {err:+.1f} % |")
    print(f"\nworst error {worst:.1f} %")
    qwen35()


def qwen35():
    run = json.loads((REPO / "bench/records/qwen35-h200-run1.json").read_text())
    m, mm = shape_of("qwen35-27b-q4ks"), shape_of("qwen35-27b-q4ks-mtp")
    print("\n| Qwen3.6-27B Q4_K_S | -c | -np | K/V | weights | KV | recurrent | compute | MTP | CUDA | "
          "total planned | nvidia-smi | error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    loads = [(r, m, 0) for r in run["ladder"]]
    loads += [({**r, "ctx": 8192, "parallel": 4, "kv": "q8_0"}, mm, {"mtp-file-no-spec": 0, "mtp-spec-n1": 1,
              "mtp-spec-n3": 3}[r["name"]]) for r in run["mtp"]]
    for r, shape, draft in loads:
        p = plan(shape, r["ctx"], r["parallel"], r["kv"], r["kv"], 143771, spec_draft_max=draft)
        b = {}
        for d, k, v in r["buffers"]:
            if d == "CUDA0" and k not in b:
                b[k] = v
        meas = r["mem_after"]["proc_mib"]
        err = (p.needed / MIB - meas) / meas * 100
        worst = max(worst, abs(err))
        t = lambda x: f"{x / MIB:,.1f}"  # noqa: E731
        name = r["name"] if draft or r["name"].startswith("mtp") else ""
        print(f"| {name} | {r['ctx']} | {r['parallel']} | {r['kv']} | {t(p.weights)} ({b['model']:,.1f}) | "
              f"{t(p.kv)} ({b['KV']:,.1f}) | {t(p.recurrent)} ({b['RS']:,.1f}) | {t(p.compute)} ({b['compute']:,.1f}) | "
              f"{t(p.spec)} | {t(p.overhead)} | {p.needed / MIB:,.0f} | {meas:,} | {err:+.2f} % |")
    print(f"\nworst error {worst:.2f} % (in brackets: llama.cpp's own first CUDA0 buffer of that kind)")


if __name__ == "__main__":
    main()
