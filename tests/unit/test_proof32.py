"""Issue 32's H200 record (bench/records/proof32/run1: the thinking budget on the Volta-rule build, raw): every
figure bench/RESULTS.md quotes, recomputed from each request's chunk arrivals."""
import statistics
from pathlib import Path

import pytest

from bench.gpu import gpu_proof
from bench.gpu.proof import thinking
from bench.traffic import analyze

ROOT = Path(__file__).resolve().parents[2]
RUN1 = ROOT / "bench/records/proof32/run1"
RESULTS = analyze.load(str(RUN1 / "results.json.gz"))  # gzip'd: the checkout and the GPU pack fit one call
(T,) = RESULTS["think32"]
MODES = ("off", "b0", "b256", "b1024", "unbounded")
BUDGET = {"b0": 0, "b256": 256, "b1024": 1024}
SECTION = (ROOT / "bench/RESULTS.md").read_text().split("## Issue 32: the thinking budget")[1]


def rounds(mode, k):
    return [r for r in T["rounds"] if r["mode"] == mode and r["streams"] == k]


def med3(mode, k, fig):
    """The median over the 3 repetitions of each repetition's median request: computed here from
    the chunk arrivals, not from the figures the device stored."""
    def per_request(q):
        rt, ct = q["reasoning_ms"], q["content_ms"]
        return {"answer_ms": ct[0] if ct else None, "ttfr_ms": rt[0] if rt else None,
                "think_tps": (len(rt) - 1) / (rt[-1] - rt[0]) * 1000 if len(rt) > 2 else None,
                "answer_tps": (len(ct) - 1) / (ct[-1] - ct[0]) * 1000 if len(ct) > 2 else None,
                "decode_tps": q["decode_tps"]}[fig]
    reps = [statistics.median(per_request(q) for q in r["recs"]) for r in rounds(mode, k)]
    assert len(reps) == 3
    return statistics.median(reps)


def agg3(mode, k):
    reps = []
    for r in rounds(mode, k):
        end = max(q["t_start"] + max(q["reasoning_ms"] + q["content_ms"]) / 1000 for q in r["recs"])
        n = sum(len(q["reasoning_ms"]) + len(q["content_ms"]) for q in r["recs"])
        reps.append(n / (end - min(q["t_start"] for q in r["recs"])))
    return statistics.median(reps)


def test_the_record_is_the_shipped_v100_32gb_argv_every_kind_both_client_counts_3_times():
    args = T["args"]
    assert T["healthy"] and T["build"] == "volta" and T["group"] == "v100_32gb"
    assert args[args.index("-np") + 1] == "16" and args[args.index("-c") + 1] == "131072"
    assert "--backend-sampling" in args and "--reasoning-budget" not in args and "--no-jinja" not in args
    assert T["max_tokens"] == 1088 and T["model"] == "qwen3.6-27b"
    assert [m["mode"] for m in T["modes"]] == list(MODES)
    assert sorted((r["mode"], r["streams"], r["rep"]) for r in T["rounds"]) == sorted(
        (m, k, rep) for m in MODES for k in (1, 16) for rep in range(3))
    for r in T["rounds"]:
        assert len(r["recs"]) == r["streams"]
        for q in r["recs"]:
            assert not q.get("error") and q["finish"] == "length" and q["predicted_n"] == 1088
            assert q["completion_tokens"] == 1088 and q["connects"] == 1  # a new connection a stream: see RESULTS
    assert (RUN1 / "argv.txt").exists() and "volta rc=0" in (RUN1 / "build-volta.txt").read_text()


@pytest.mark.parametrize("mode", MODES)
def test_the_budget_alone_decides_where_the_answer_starts(mode):
    for r in T["rounds"]:
        if r["mode"] != mode:
            continue
        for q in r["recs"]:
            if mode == "off":
                assert q["n_reasoning"] == 0 and q["n_content"] == 1088
            elif mode == "unbounded":
                assert q["n_reasoning"] == 1088 and q["n_content"] == 0
            else:  # N thought tokens (the last a forced "\n"), </think> (not streamed), then the answer
                n = BUDGET[mode]
                assert q["n_reasoning"] == n and q["n_content"] == 1088 - n - 1
                assert all(a < b for a, b in zip(q["reasoning_ms"][-1:], q["content_ms"][:1]))


def test_the_stored_figures_are_the_chunk_arrivals():
    for r in T["rounds"]:
        for q in r["recs"]:
            assert thinking.think_figures(q) == {k: q[k] for k in thinking.think_figures(q)}


def test_the_quoted_table_is_the_medians_of_the_record():
    assert gpu_proof.think_report(RESULTS) in SECTION
    tab = gpu_proof.think_table(RESULTS)
    for mode in MODES:
        for k in (1, 16):
            for fig in ("answer_ms", "ttfr_ms", "think_tps", "answer_tps", "decode_tps"):
                if tab[(mode, k)][fig][0] is None:
                    continue
                assert tab[(mode, k)][fig][0] == pytest.approx(med3(mode, k, fig), rel=1e-6), (mode, k, fig)
            assert tab[(mode, k)]["agg_tps"][0] == pytest.approx(agg3(mode, k), rel=1e-9)


def test_a_budget_costs_the_gpu_sampling_and_only_that():
    dec = {(m, k): med3(m, k, "decode_tps") for m in MODES for k in (1, 16)}
    assert [round(dec[(m, 1)], 1) for m in MODES] == [85.9, 81.4, 80.8, 79.1, 86.1]
    assert [round(dec[(m, 16)], 1) for m in MODES] == [28.7, 19.7, 19.2, 19.5, 28.5]
    assert [round(agg3(m, 16)) for m in MODES] == [435, 302, 294, 296, 426]
    free, armed = ("off", "unbounded"), ("b0", "b256", "b1024")
    # 1 client: -5 to -8 %; 16 clients: -31 to -33 % a stream
    ratios1 = [dec[(b, 1)] / dec[(f, 1)] for b in armed for f in free]
    assert 0.91 < min(ratios1) and max(ratios1) < 0.95
    ratios16 = [dec[(b, 16)] / dec[(f, 16)] for b in armed for f in free]
    assert 0.66 < min(ratios16) and max(ratios16) < 0.70
    assert "19.5 against 28.5 tok/s a stream (-31 %), 296 against 426\n  aggregate (-30 %)" in SECTION
    assert round(1 - dec[("b1024", 16)] / dec[("unbounded", 16)], 2) == 0.31
    assert round(1 - agg3("b1024", 16) / agg3("unbounded", 16), 2) == 0.30
    # the CPU's sampling: 0.6-1.0 ms a token alone, 16 ms more a 35 ms step at 16 slots
    ms1 = [1000 / dec[(b, 1)] - 1000 / dec[(f, 1)] for b in armed for f in free]
    assert 0.6 < min(ms1) and max(ms1) < 1.05
    step = 1000 / dec[("unbounded", 16)]
    assert round(step) == 35 and round(1000 / dec[("b1024", 16)] - step) == 16
    # the budget's own work is not measurable: thinking and answering at one rate within a request
    for k in (1, 16):
        assert med3("b1024", k, "think_tps") == pytest.approx(med3("b256", k, "answer_tps"), rel=0.05)
    # the server log: the sampler armed (and the GPU sampling dropped) for exactly the budget requests
    n_armed = 3 + sum(len(r["recs"]) for r in T["rounds"] if r["mode"] in armed)
    assert n_armed == 156 and T["log_counts"] == {"backend_sampling_off": 156, "budget_activated": 156,
                                                   "budget_forced": 102}
    # and the tied logits of the zero model show which path sampled
    for r in T["rounds"]:
        heads = {q["content_head"] or q["reasoning_head"] for q in r["recs"]}
        assert heads == ({"GGGGGGGG"} if r["mode"] in armed else {"!!!!!!!!"})


def test_the_answer_starts_at_ttft_plus_budget_over_rate():
    for k in (1, 16):
        for mode in ("b256", "b1024"):
            predicted = med3(mode, k, "ttfr_ms") + BUDGET[mode] / med3(mode, k, "think_tps") * 1000
            assert predicted == pytest.approx(med3(mode, k, "answer_ms"), rel=0.01)
    assert [round(med3(m, 1, "answer_ms") / 1000, 2) for m in ("b256",)] == [3.33]
    assert round(med3("b1024", 1, "answer_ms") / 1000, 1) == 13.1
    assert [round(med3(m, 16, "answer_ms") / 1000, 1) for m in ("b256", "b1024")] == [15.3, 55.2]
    assert round(med3("off", 1, "answer_ms")) == 219 and round(med3("off", 16, "answer_ms") / 1000, 1) == 2.3


def test_the_v100_estimates_follow_from_the_medians():
    bw = 4294 / 900  # the H200's measured copy bandwidth over the V100's (RESULTS.md, issue 9)
    rep = 86.1 / 31  # the reported V100 single stream against the H200's (issue 27's table)
    s1 = 1000 / med3("unbounded", 1, "decode_tps")
    s16 = 1000 / med3("unbounded", 16, "decode_tps")
    d1 = 1000 / med3("b1024", 1, "decode_tps") - s1
    d16 = 1000 / med3("b1024", 16, "decode_tps") - s16
    est = {}
    for name, r in (("bw", bw), ("rep", rep)):
        est[name] = {"1": 1000 / (s1 * r), "1b": 1000 / (s1 * r + d1),
                     "16": 1000 / (s16 * r), "16b": 1000 / (s16 * r + d16)}
    assert round(bw, 2) == 4.77 and round(rep, 2) == 2.78
    assert [round(est["bw"][k], 2) for k in ("1", "1b", "16", "16b")] == [18.05, 17.71, 5.96, 5.44]
    assert [round(est["rep"][k], 1) for k in ("1", "1b", "16", "16b")] == [31.0, 30.0, 10.2, 8.8]
    assert round(1 - est["bw"]["16b"] / est["bw"]["16"], 3) == 0.088
    assert round(1 - est["rep"]["16b"] / est["rep"]["16"], 2) == 0.14
    assert [round(n / est["bw"]["16b"]) for n in (1024, 2048, 3000)] == [188, 376, 551]
    assert [round(n / est["rep"]["16b"]) for n in (1024, 2048, 3000)] == [116, 233, 341]
    assert [round(600 * est[w][k]) for w in ("bw", "rep") for k in ("16", "16b")] == [3578, 3265, 6147, 5277]
    for quoted in ("18.0 (31.0) | 17.7 (30.0): -1.8 % (-3.1 %)", "5.96 (10.2) | 5.44 (8.8): -8.8 % (-14 %)",
                   "188 / 376 / 551 s (116 / 233 / 341 s)", "3,578 (6,147) | 3,265 (5,277)"):
        assert quoted in SECTION, quoted
    assert "**Decision: `server_reasoning_budget: -1`, no fleet default.**" in SECTION
