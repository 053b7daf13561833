"""Print the Qwen3.6-27B-shape H200 tables from the recorded runs (bench/records/qwen35-h200-run*.json).

    .venv/bin/python -m bench.gpu.qwen35_report
"""
import json
from pathlib import Path

B = Path(__file__).resolve().parents[1] / "records"
runs = [json.loads((B / f"qwen35-h200-run{i}.json").read_text()) for i in (1, 2, 3)]
bw = json.loads((B / "qwen35-h200-bandwidth.json").read_text())["read_plus_write_GBps"]
weights_gb = 14171.76 * 2**20 / 1e9  # CUDA0 model buffer: what every decode step reads
roof = bw / weights_gb
print(f"bandwidth {bw:.0f} GB/s (4 GiB device copy, read+write); weights read per token {weights_gb:.2f} GB; "
      f"roofline {roof:.0f} tok/s\n")
rows = runs[0]["bench"] + runs[1]["bench"] + runs[2]["bench"]
print("| config | VRAM MiB | TTFT ms (1) | 1 stream tok/s | 4: agg / each | 8: agg / each | 16: agg / each "
      "| llama-bench tg / pp512 | server/bench | roofline |")
print("|---|---|---|---|---|---|---|---|---|---|")
bench_tg = {}
for r in rows:
    lb = r.get("llama_bench") or {}
    tg = lb.get("tg128") or lb.get("tg32")
    if tg:
        bench_tg[r["name"]] = tg
for r in rows:
    s = {x["streams"]: x for x in r.get("streams", [])}
    lb = r.get("llama_bench") or {}
    tg = lb.get("tg128") or lb.get("tg32")
    ref = tg or bench_tg.get("d-v100_16gb")
    one = s[1]["per_stream_tps_median"]
    cells = [f"{s[k]['aggregate_tps']:.0f} / {s[k]['per_stream_tps_median']:.0f}" for k in (4, 8, 16)]
    bench = f"{tg:.1f} / {lb['pp512']:.0f}" if tg else "(same as d-v100_16gb)"
    ratio = f"{one / ref:.2f}" if ref and not r["name"].startswith("a-") else (f"{one / tg:.2f}" if tg else "")
    vram = (r.get("mem_after") or r["mem_load"]).get("proc_mib")
    print(f"| {r['name']} | {vram} | {s[1]['ttft_ms_median']:.0f} | {one:.1f} | " + " | ".join(cells)
          + f" | {bench} | {ratio} | {one / roof:.0%} |")
stage3 = next(x for x in rows if x["name"] == "c-seed-stage3")
s16 = {x["streams"]: x for x in stage3["streams"]}[16]["aggregate_tps"]
print(f"\n16 clients vs seed stage-3 ({s16:.1f} tok/s):")
for r in rows:
    if r["name"].startswith(("d-v100_32gb", "x-v100_32gb", "e-c32768")):
        a = {x["streams"]: x for x in r["streams"]}[16]["aggregate_tps"]
        print(f"  {r['name']}: {a:.1f} tok/s = {a / s16:.2f}x")
print("\nprompt reuse (4096-token prompt, then + reply + 64-token turn; -c 16384 -np 2, q8_0):")
for r in runs[0]["reuse"]:
    print("  " + r["name"] + ": " + "; ".join(f"{x['step']}: {x['prompt_n']} tok in {x['prompt_ms']:.0f} ms"
                                             for x in r["steps"]))
print("\nMTP (Q4_K_S + MTP block, v100_16gb argv -c 8192 -np 4):")
base = None
for r in runs[0]["mtp"]:
    one = sum(x["per_stream_tps_median"] for x in r["streams"][:2]) / 2
    base = base or one
    d = r["streams"][0]["draft"][0]
    print(f"  {r['name']}: {r['mem_after']['proc_mib']} MiB, 1 stream {one:.1f} tok/s ({1000 / one:.2f} ms/token), "
          f"4 streams {r['streams'][2]['aggregate_tps']:.0f} tok/s, drafted/accepted {d}")
    if r["name"].startswith("mtp-spec"):
        n = int(r["name"][-1])
        step = 1000 / one  # acceptance 0: every step yields 1 token
        need = step / (1000 / base)
        lo, hi = 0.0, 1.0
        for _ in range(60):  # expected tokens per step with acceptance a: 1 + a + ... + a^n
            a = (lo + hi) / 2
            lo, hi = (a, hi) if sum(a ** i for i in range(n + 1)) < need else (lo, a)
        print(f"    step {step:.2f} ms vs {1000 / base:.2f} ms: break-even acceptance {a:.2f} "
              f"(needs {need:.2f} tokens a step)")
