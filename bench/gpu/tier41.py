"""Issue 41's figures from the H200 record (bench/records/tier41/results.json): the throughput
tier as shipped against the latency tier (2 slots, the MTP-carrying file) without speculation and
at MTP draft depths 1-3, every figure the median of 3 repetitions. Pure: no pyinfra.

    .venv/bin/python -m bench.gpu.tier41 bench/records/tier41/results.json

Single stream: the server's decode rate (`predicted_per_second`), the client's rate (tokens over
the request's span less the server's prompt time, as the smoke test reads it) and TTFT (512-token
prompts, 128 tokens, greedy). 2 and 4 streams: tokens over the round's wall time.

Where a depth pays. `acc` accepts every draft (the best case), `rej` none (the worst). One
decoding step at depth d yields 1 + a + ... + a^d tokens for a per-draft acceptance a; its time is
taken as linear in the drafts accepted between the two measured ends (a step accepting all d
drafts, a step rejecting them, which also rolls the recurrent state back). A depth pays above the
acceptance where that rate meets the latency tier's rate without speculation.

In llama-server's own terms. llama-server reports accepted/drafted: a response's timings carry
draft_n_accepted / draft_n, the slot's counters that /metrics adds into
llamacpp:spec_decode_num_accepted_tokens_total / llamacpp:spec_decode_num_draft_tokens_total, and the log
says "draft acceptance = r (A accepted / D generated)". A step drafts d tokens and keeps a + ... + a^d of
them, so r = (a + ... + a^d) / d, and a step's time is linear in r itself: its break-even in r needs no
model of how acceptance falls along a draft (break_even_reported, closed form). The records hold r for
the two files (1.00 and 0.00) from each response's timings; they hold no /metrics scrape, so no count of
verification steps or acceptance per draft position (metrics_acceptance reads them from a run that has them).
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from voltafleet.hostside import smoke_client

ACCEPTANCES = (0.5, 0.6, 0.7, 0.8, 0.9)  # per-draft acceptance rates to read the model at


def _median(values):
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


def _ratio(recs: list) -> float | None:
    drafted = sum(q.get("draft_n") or 0 for q in recs)
    return sum(q.get("draft_accepted") or 0 for q in recs) / drafted if drafted else None


def client_rate(rec: dict) -> float | None:
    """Tokens over the request's span less the server's prompt time (the smoke test's own rate)."""
    times = rec.get("times_ms") or []
    if not times:
        return None
    return smoke_client.client_rate(0.0, times[0] / 1000, times[-1] / 1000, len(times), len(times), rec.get("prompt_ms"))


def wall_rate(recs: list) -> float | None:
    """A round's tokens over its wall time, first request to last token."""
    good = [q for q in recs if q.get("times_ms")]
    if not good:
        return None
    end = max(q["t_start"] + q["times_ms"][-1] / 1000 for q in good)
    return sum(len(q["times_ms"]) for q in good) / (end - min(q["t_start"] for q in good))


def summary(config: dict) -> dict:
    """One config's medians of 3: single stream (decode, client rate, TTFT, drafts), 2/4 streams, memory."""
    ones = [x["recs"][0] for x in config["rounds"] if x["streams"] == 1]
    out = {"name": config["name"], "model": config["model"], "reps": len(ones),
           "decode_tps": _median([q.get("decode_tps") for q in ones]),
           "client_tps": _median([client_rate(q) for q in ones]),
           "ttft_ms": _median([q.get("ttft_ms") for q in ones]),
           "tokens": _median([q.get("n") for q in ones]),
           "drafted": _median([q.get("draft_n") for q in ones]),
           "accepted": _median([q.get("draft_accepted") for q in ones]),
           # llama-server's accepted/drafted over every request of every round (its timings' counters)
           "acceptance": _ratio([q for x in config["rounds"] for q in x["recs"]]),
           "metrics": metrics_acceptance(config),
           "texts": sorted({q.get("text_sha") for q in ones}),
           "gpu_load_mib": config.get("gpu_load_mib"), "gpu_peak_mib": config.get("gpu_peak_mib"),
           "host_peak_mib": (config.get("host_peak") or {}).get("VmRSS")}
    for k in sorted({x["streams"] for x in config["rounds"]} - {1}):
        out[f"agg{k}_tps"] = _median([wall_rate(x["recs"]) for x in config["rounds"] if x["streams"] == k])
    return out


def depth_model(depth: int, acc: dict, rej: dict):
    """rate(a): single-stream decode tok/s at per-draft acceptance a, from the depth's two ends."""
    n, accepted = acc["tokens"], acc["accepted"]
    t_acc = n / acc["decode_tps"] / (n - accepted)   # a step that accepts every draft
    t_rej = 1 / rej["decode_tps"]                      # a step that rejects them all (one token)

    def rate(a: float) -> float:
        tokens = sum(a ** i for i in range(depth + 1))
        return tokens / (t_rej + (t_acc - t_rej) * (tokens - 1) / depth)
    return rate


def break_even(rate, base: float) -> float:
    """The acceptance where rate(a) meets `base` (rate rises with a): bisection to 1e-9."""
    lo, hi = 0.0, 1.0
    if rate(hi) <= base:
        return 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rate(mid) < base else (lo, mid)
    return (lo + hi) / 2


def reported(a: float, depth: int) -> float:
    """llama-server's accepted/drafted at per-draft acceptance a: d drafted a step, a + ... + a^d kept."""
    return sum(a ** i for i in range(1, depth + 1)) / depth


def break_even_reported(depth: int, acc: dict, rej: dict, base: float) -> float:
    """The accepted/drafted ratio above which a depth pays, in closed form: a step yields 1 + d*r tokens
    in t_rej + (t_acc - t_rej) * r, which meets `base` at r = (base * t_rej - 1) / (d - base * (t_acc - t_rej))."""
    n, accepted = acc["tokens"], acc["accepted"]
    t_acc, t_rej = n / acc["decode_tps"] / (n - accepted), 1 / rej["decode_tps"]
    return (base * t_rej - 1) / (depth - base * (t_acc - t_rej))


def crossover(deeper, shallower) -> float:
    """The per-draft acceptance above which `deeper` (a rate function) beats `shallower`: bisection to 1e-9."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if deeper(mid) < shallower(mid) else (lo, mid)
    return (lo + hi) / 2


SPEC_METRICS = ("spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total",
                "spec_decode_num_drafts_total")
PER_POS = "spec_decode_num_accepted_tokens_per_pos_total{position=\"%d\"}"


def metrics_acceptance(config: dict) -> dict | None:
    """What llama-server's /metrics counters grew by over a config's rounds (tiers.py scrapes them before
    and after): tokens drafted and accepted, verification steps, accepted/drafted, and each draft position's
    acceptance per step. None when the record has no scrape (tier41's run predates it)."""
    before, after = config.get("metrics_before"), config.get("metrics_after")
    if not before or not after:
        return None
    drafted, accepted, steps = (after.get(k, 0) - before.get(k, 0) for k in SPEC_METRICS)
    per_pos, i = [], 0
    while PER_POS % i in after:
        per_pos.append((after[PER_POS % i] - before.get(PER_POS % i, 0)) / steps if steps else None)
        i += 1
    return {"drafted": drafted, "accepted": accepted, "steps": steps,
            "acceptance": accepted / drafted if drafted else None, "per_position": per_pos}


def table(results: dict) -> dict:
    """Every config's summary, and for each depth its break-even acceptance and modelled rates."""
    rows = {c["name"]: summary(c) for c in results["tier41"]}
    base = rows["lat-d0"]["decode_tps"]
    depths, rates = {}, {}
    for name, row in rows.items():
        if name.startswith("lat-d") and not name.endswith(("-rej", "d0")):
            d = int(name[len("lat-d"):])
            rate = rates[d] = depth_model(d, row, rows[f"{name}-rej"])
            depths[d] = {"break_even": break_even(rate, base),
                         "break_even_reported": break_even_reported(d, row, rows[f"{name}-rej"], base),
                         "at": {a: rate(a) for a in ACCEPTANCES},
                         "gain_all": row["decode_tps"] / base, "gain_none": rows[f"{name}-rej"]["decode_tps"] / base}
    # the per-draft acceptance above which each depth beats the one below it
    crossovers = {d: crossover(rates[d], rates[d - 1]) for d in rates if d - 1 in rates}
    return {"rows": rows, "depths": depths, "base_tps": base, "crossovers": crossovers}


def best_depth(t: dict, acceptance: float) -> int:
    """The depth with the highest modelled rate at this acceptance."""
    return max(t["depths"], key=lambda d: t["depths"][d]["at"][acceptance])


def report(results: dict) -> str:
    t = table(results)

    def f(v, nd=0):
        return "-" if v is None else f"{v:,.{nd}f}"
    lines = ["| config | model | decode tok/s | client tok/s | TTFT ms | drafts accepted | 2 streams | "
             "4 streams | GPU MiB (load / peak) | host MiB peak |", "|" + "---|" * 10]
    for r in t["rows"].values():
        drafts = "-" if r["drafted"] is None else f"{r['accepted']:.0f} / {r['drafted']:.0f}"
        lines.append(f"| {r['name']} | {r['model']} | {f(r['decode_tps'], 1)} | {f(r['client_tps'], 1)} | "
                     f"{f(r['ttft_ms'])} | {drafts} | {f(r.get('agg2_tps'), 1)} | {f(r.get('agg4_tps'), 1)} | "
                     f"{f(r['gpu_load_mib'])} / {f(r['gpu_peak_mib'])} | {f(r['host_peak_mib'])} |")
    lines += ["", "| depth | all accepted | none accepted | pays above | pays above, accepted/drafted | " +
              " | ".join(f"a={a}" for a in ACCEPTANCES) + " |", "|" + "---|" * (5 + len(ACCEPTANCES))]
    for d, x in sorted(t["depths"].items()):
        lines.append(f"| {d} | {x['gain_all']:.2f}x | {x['gain_none']:.2f}x | {x['break_even']:.2f} | "
                     f"{x['break_even_reported']:.2f} | " +
                     " | ".join(f(x["at"][a], 1) for a in ACCEPTANCES) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(json.loads(Path(sys.argv[1]).read_text())))
