"""Tables of the GPU proof (issue 19) from its raw record (bench/records/proof19/results.json).

    .venv/bin/python -m bench.gpu.proof_report [bench/records/proof19/results.json]

Every figure is the median of the 3 runs of one session with min-max; each ratio's two sides
come from the same session. TTFT percentiles: nearest rank over the streams of a round
(voltafleet.measure.smoke.percentile); a round of 16 streams has p99 = its slowest stream.
Aggregates of a round: `wall` = tokens / (first request sent .. last token), prompts included;
`decode` = tokens that arrived while every stream was decoding / that window (steady state,
the figure llama-batched-bench's S_TG measures).
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from voltafleet.measure.smoke import percentile

REPO = Path(__file__).resolve().parents[2]

RECORD = REPO / "bench" / "records" / "proof19" / "results.json"


def mmm(values: list) -> tuple:
    """(median, min, max) of the runs."""
    v = [x for x in values if x is not None]
    return (statistics.median(v), min(v), max(v)) if v else (None, None, None)


def fmt(t: tuple, digits: int = 0) -> str:
    if t[0] is None:
        return "n/a"
    return f"{t[0]:,.{digits}f} ({t[1]:,.{digits}f}-{t[2]:,.{digits}f})"


def round_figures(recs: list) -> dict:
    """One round of k concurrent streams: wall and steady-state aggregate, TTFT p50/p99, step ms."""
    good = [r for r in recs if r.get("times_ms")]
    starts = [r["t_start"] for r in good]
    ends = [r["t_start"] + r["times_ms"][-1] / 1000 for r in good]
    tokens = sum(len(r["times_ms"]) for r in good)
    wall = tokens / (max(ends) - min(starts))
    # steady state: from the last stream's first token to the first stream's last token
    lo = max(r["t_start"] + r["times_ms"][0] / 1000 for r in good)
    hi = min(ends)
    inside = sum(1 for r in good for t in r["times_ms"] if lo <= r["t_start"] + t / 1000 <= hi)
    decode = (inside - len(good)) / (hi - lo) if hi - lo > 0.2 and inside > len(good) else None
    gaps = [statistics.median(b - a for a, b in zip(r["times_ms"], r["times_ms"][1:])) for r in good
            if len(r["times_ms"]) > 2]
    ttfts = [r["ttft_ms"] for r in good]
    return {"streams": len(recs), "ok": len(good), "wall": wall, "decode": decode,
            "ttft_p50": percentile(ttfts, 50), "ttft_p99": percentile(ttfts, 99),
            "step_ms": statistics.median(gaps) if gaps else None,
            "single_tps": statistics.median(r["decode_tps"] for r in good if r.get("decode_tps"))}


def serve_table(serve: list) -> dict:
    """{config: {k: {figure: (median, min, max)}}} over the 3 rounds of each k."""
    out = {}
    for s in serve:
        by_k: dict = {}
        for rnd in s["rounds"]:
            by_k.setdefault(rnd["streams"], []).append(round_figures(rnd["recs"]))
        out[s["name"]] = {k: {f: mmm([x[f] for x in rows]) for f in rows[0] if f not in ("streams", "ok")}
                          for k, rows in by_k.items()}
    return out


def multi_table(serve: list) -> dict:
    """{config: {turn: {p50, p99 TTFT ms, prompt tokens processed}}}: median of the 3 reps."""
    out = {}
    for s in serve:
        if not s.get("multi"):
            continue
        turns: dict = {}
        for rep in s["multi"]:
            per_turn: dict = {}
            for conv in rep["convs"]:
                for t in conv:
                    per_turn.setdefault(t["turn"], []).append(t)
            for t, rows in per_turn.items():
                ttft = [x["ttft_ms"] for x in rows if x.get("ttft_ms")]
                turns.setdefault(t, []).append({"p50": percentile(ttft, 50), "p99": percentile(ttft, 99),
                                                "prompt_n": statistics.median(x["prompt_n"] for x in rows)})
        out[s["name"]] = {t: {f: mmm([x[f] for x in reps]) for f in ("p50", "p99", "prompt_n")}
                          for t, reps in turns.items()}
    return out


def batched_table(batched: list, kvu: bool = False) -> dict:
    """{parallel sequences: (median, min, max) S_TG} over the runs (kvu: the unified-KV run)."""
    by_pl: dict = {}
    for run in batched:
        if run["kvu"] != kvu:
            continue
        for row in run["rows"]:
            by_pl.setdefault(row["pl"], []).append(row["speed_tg"])
    return {pl: mmm(v) for pl, v in sorted(by_pl.items())}


def bench_samples(llama_bench: list, build: str, what: str) -> dict:
    """{test name: (median, min, max) tok/s} from llama-bench's per-repetition samples."""
    for entry in llama_bench:
        if entry["build"] == build and entry["what"] == what:
            return {(f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"): mmm(r["samples_ts"])
                    for r in entry["rows"]}
    return {}


def vram_table(vram: list) -> dict:
    """{(build, config): {load, peak: (median, min, max) MiB}}."""
    out: dict = {}
    for r in vram:
        out.setdefault((r["build"], r["name"]), []).append(r)
    return {k: {"load": mmm([r["mem_load"] for r in v]), "peak": mmm([r["mem_peak"] for r in v]), "runs": len(v)}
            for k, v in out.items()}


def splits(serve_or_vram: list) -> set:
    """Every `splits = S` figure the loads logged (sched_reserve at -lv 4)."""
    from voltafleet.hostside.smoke_client import graph_splits
    return {s for r in serve_or_vram for s in graph_splits("\n".join(r.get("log", [])))}


def spec_table(spec: list) -> dict:
    """{(config, kind, N): wall aggregate (median, min, max), drafted, accepted, TTFT p50, text hashes by round}."""
    out = {}
    for item in spec:
        for kind in sorted({x["kind"] for x in item["rounds"]}):
            for k in sorted({x["streams"] for x in item["rounds"]}):
                rounds = [x for x in item["rounds"] if x["kind"] == kind and x["streams"] == k]
                if not rounds:
                    continue
                recs = [q for x in rounds for q in x["recs"]]
                out[(item["name"], kind, k)] = {
                    "wall": mmm([round_figures(x["recs"])["wall"] for x in rounds]),
                    "drafted": sum(q.get("draft_n") or 0 for q in recs),
                    "accepted": sum(q.get("draft_accepted") or 0 for q in recs),
                    "tokens": sum(q.get("n") or 0 for q in recs),
                    "ttft_p50": percentile([q["ttft_ms"] for q in recs if q.get("ttft_ms")], 50),
                    "texts": [[q.get("text_sha") for q in x["recs"]] for x in rounds],
                    "mem_after": item.get("mem_after")}
    return out


def spec_report(res: dict) -> str:
    """The n-gram speculation table (phase `spec`): each config beside its no-speculation twin."""
    t = spec_table(res["spec"])
    lines = ["| config | prompt | N | wall agg tok/s | vs nospec | drafted / accepted | TTFT p50 ms | "
             "greedy text = nospec | MiB after |", "|---|---|---|---|---|---|---|---|---|"]
    for (name, kind, k), f in t.items():
        base = t.get((name.replace("ngram-mod", "nospec"), kind, k))
        ratio = f"{f['wall'][0] / base['wall'][0]:.2f}x" if base and "ngram" in name else "-"
        same = (f"{sum(a == b for x, y in zip(f['texts'], base['texts']) for a, b in zip(x, y))}"
                f"/{sum(len(x) for x in f['texts'])}") if base and "ngram" in name and "-k" not in kind else "-"
        lines.append(f"| {name} | {kind} | {k} | {fmt(f['wall'], 1)} | {ratio} | {f['drafted']} / {f['accepted']} | "
                     f"{f['ttft_p50']:,.0f} | {same} | {f['mem_after']} |")
    return "\n".join(lines)


def report(res: dict) -> str:
    if "vram" not in res and "spec" in res:
        return spec_report(res)
    lines = []
    v = vram_table(res["vram"])
    lines.append("VRAM (MiB, nvidia-smi process memory; peak sampled every 0.1 s while one 1,536-token prompt per "
                 "slot ran at once):\n")
    lines.append("| build | config | runs | after load | peak |")
    lines.append("|---|---|---|---|---|")
    for (build, name), x in v.items():
        lines.append(f"| {build} | {name} | {x['runs']} | {fmt(x['load'])} | {fmt(x['peak'])} |")
    lines.append("\nllama-bench (tok/s, 3 repetitions each):\n")
    for build in ("default", "cublas"):
        pp = bench_samples(res["llama_bench"], build, "pp")
        lines.append(f"- {build}: " + ", ".join(f"{k} {fmt(t)}" for k, t in pp.items()))
    tg = bench_samples(res["llama_bench"], "default", "tg")
    lines.append(f"- default: tg128 {fmt(tg['tg128'], 1)}")
    bt, kvu = batched_table(res["batched"]), batched_table(res["batched"], kvu=True)
    lines.append("\nllama-batched-bench S_TG (tok/s; 3 runs; unified KV: 1 run):\n")
    lines.append("| parallel | " + " | ".join(str(k) for k in bt) + " |")
    lines.append("|---" * (len(bt) + 1) + "|")
    lines.append("| S_TG | " + " | ".join(fmt(t) for t in bt.values()) + " |")
    lines.append("| S_TG -kvu | " + " | ".join(f"{t[0]:.0f}" for t in kvu.values()) + " |")
    st = serve_table(res["serve"])
    lines.append("\nServers (3 rounds each; 128-token prompts, 128 tokens a stream):\n")
    lines.append("| config | N | TTFT p50 ms | TTFT p99 ms | wall agg tok/s | decode agg tok/s | step ms | "
                 "per stream tok/s | decode / batched-bench |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for name, ks in st.items():
        for k, f in ks.items():
            ceiling = bt.get(k, (None,))[0]
            ratio = f"{f['decode'][0] / ceiling:.2f}" if ceiling and f["decode"][0] else ""
            if k == 1:
                ratio = f"{f['single_tps'][0] / bt[1][0]:.2f}"
            lines.append(f"| {name} | {k} | {fmt(f['ttft_p50'])} | {fmt(f['ttft_p99'])} | {fmt(f['wall'])} | "
                         f"{fmt(f['decode'])} | {fmt(f['step_ms'], 1)} | {fmt(f['single_tps'], 1)} | {ratio} |")
    mt = multi_table(res["serve"])
    lines.append("\nMulti-turn (conversations of 3 turns: 512-token first prompt, then + 32 + 64 tokens; "
                 "TTFT ms p50 / p99 over the conversations, median of 3 reps; prompt tokens processed):\n")
    lines.append("| config | turn 1 | turn 2 | turn 3 |")
    lines.append("|---|---|---|---|")
    for name, turns in mt.items():
        lines.append(f"| {name} | " + " | ".join(
            f"{t['p50'][0]:,.0f} / {t['p99'][0]:,.0f} ({t['prompt_n'][0]:.0f} tok)" for t in turns.values()) + " |")
    ship, seed = st.get("v32-ship", {}).get(16), st.get("seed-stage3", {}).get(16)
    if ship and seed:
        lines.append("\n16 clients vs the seed's stage-3 flags (wall aggregate, same session):")
        for name in ("v32-ship", "v32-nobs", "v32-cr0", "v32-nobs-cr0", "v32-cr0-kvu"):
            if name in st:
                lines.append(f"- {name}: {st[name][16]['wall'][0] / seed['wall'][0]:.2f}x")
    lines.append(f"\nsched_reserve splits seen in every load: {sorted(splits(res['serve']) | splits(res['vram']))}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(json.loads(Path(sys.argv[1] if len(sys.argv) > 1 else RECORD).read_text())))
