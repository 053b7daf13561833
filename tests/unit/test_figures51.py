"""Issue 51 item 4: every prefill figure and the latency tier's break-even, recomputed from the raw
records (bench/records/proof38/run2, proof27/run2, proof49/run3, tier41) and checked against the text
that quotes them (bench/RESULTS.md, docs/host.md, group_vars), rounded as quoted."""
import json
import re
import types
from pathlib import Path

import pytest
import yaml

from bench.gpu import prefill51 as pf
from bench.gpu import tier41

REPO = Path(__file__).resolve().parents[2]
RESULTS = (REPO / "bench/RESULTS.md").read_text()
HOST = (REPO / "docs/host.md").read_text()
V32 = (REPO / "group_vars/v100_32gb.yml").read_text()
LATENCY = (REPO / "group_vars/latency.yml").read_text()


@pytest.fixture(scope="module")
def f():
    return pf.figures(json.loads(pf.RUN38.read_text()), json.loads(pf.RUN27.read_text()))


@pytest.fixture(scope="module")
def t():
    return tier41.table(json.loads((REPO / "bench/records/tier41/results.json").read_text()))


def quoted(text: str, pattern: str) -> list[str]:
    """The numbers a text quotes where `pattern` (a regex whose groups are the numbers) matches, once."""
    found = re.findall(pattern, text)
    assert len(found) == 1, (pattern, found)
    return [found[0]] if isinstance(found[0], str) else list(found[0])


def num(s: str) -> float:
    return float(s.replace(",", ""))


def k1(x: float) -> str:
    """Thousands, one decimal, as quoted: 19,828 -> '19.8'."""
    return f"{x / 1000:.1f}"


# ------------------------------------------------------------------- the records themselves
def test_the_log_gives_every_prompt_of_the_first_two_turns_and_half_the_third(f):
    assert [len(t) for t in f["turns"]] == [16, 16, 8]
    assert all(835 <= n <= 860 for n in f["turns"][0].values())
    assert all(965 <= n <= 992 for n in f["turns"][1].values())
    for w in f["waves"]:  # 16 requests a turn, their spans from the records, no error
        assert 5.5 < w["span_s"] < 7.5 and w["rate"] * w["span_s"] == pytest.approx(w["tokens"])


def test_a_follow_up_returns_to_its_slot_and_grows_by_the_same_tokens_each_turn(f):
    """The turn-3 rule, checked where the records have the answer: the 8 turn-2 prompts this log keeps,
    and the whole turns 0-3 that proof49/run3 logged for 8 of the same conversations (same seeds)."""
    t0, t1, t2 = f["turns"]
    for s, n in t2.items():
        assert abs(n - (2 * t1[s] - t0[s])) <= 5, (s, n)
    ours = {(t0[s], t1[s]): s for s in t0}
    assert len(ours) == 16  # a conversation is known by its first two prompts
    logged = pf.logged_turns(json.loads(pf.RUN49.read_text()))
    assert len(logged) == 8 and set(logged) <= set(ours)
    predicted = {k: k[1] + 2 * (k[1] - k[0]) for k in logged}
    for k, turns in logged.items():
        assert abs(turns[3] - predicted[k]) <= 6, (k, turns)
    assert abs(sum(v[3] for v in logged.values()) - sum(predicted.values())) <= 0.001 * sum(predicted.values())


def test_the_field_rate_is_the_one_docs_domain_md_quotes():
    domain = (REPO / "docs/domain.md").read_text()
    assert f"prompt processing {pf.V100_PP[0]}-{pf.V100_PP[1]} tok/s with it" in domain


# ------------------------------------------------------------------- the figures and their quotes
def test_the_h200_wave_rate_is_quoted_as_recomputed(f):
    lo, hi = (k1(x) for x in f["wave_rate"])
    assert (lo, hi) == ("2.2", "2.3")
    for text, pattern in ((RESULTS, r"an H200 reprocesses (\d\.\d)-(\d\.\d)K prompt tokens a second \(16 prompts"),
                          (RESULTS, r"The wave prefills (\d\.\d)-(\d\.\d)K\n  prompt tokens a second"),
                          (HOST, r"cheap on an H200 \((\d\.\d)-(\d\.\d)K prompt tokens a second for 16 prompts"),
                          (V32, r"at the H200's (\d\.\d)-(\d\.\d)K prompt tok/s for 16 prompts")):
        assert quoted(text, pattern) == [lo, hi], pattern


def test_a_single_requests_rate_and_the_turns_growth_are_quoted_as_recomputed(f):
    assert round(f["request_rate"], -1) == num(quoted(RESULTS, r"that is ~(\d+) tokens a second")[0])
    assert round(f["growth"]) == 130 == num(quoted(RESULTS, r"Each turn adds ~(\d+) tokens to each of the 16 prompts")[0])
    wave_growth = f["waves"][1]["tokens"] - f["waves"][0]["tokens"]
    assert wave_growth == num(quoted(RESULTS, r"16 prompts, ([\d,]+) to the wave")[0])
    last, mid = quoted(RESULTS, r"its last first token comes ~(\d\.\d) s later each turn and its median ~(\d\.\d) s")
    assert (f"{f['ttft_growth_s'][0]:.1f}", f"{f['ttft_growth_s'][1]:.1f}") == (last, mid)


def test_the_ratio_to_a_v100_is_quoted_as_recomputed(f):
    assert round(f["pp512"]) == 2560 and "2,560,\n`bench/records/proof27/run2`" in RESULTS
    pp = {round(x) for x in f["ratio_pp512"]}
    wave = {round(x) for x in f["ratio_wave"]}
    assert pp == {7} and wave == {6}
    assert quoted(RESULTS, r"#25139\), about (\d+)x slower than the H200's llama-bench pp512") == ["7"]
    assert quoted(RESULTS, r"and (\d+)x slower than its chat wave") == ["6"]
    # the issue-19 caveat, against that section's own llama-bench (proof19, the stock build's MMQ)
    bench19 = json.loads((REPO / "bench/records/proof19/results.json").read_text())["llama_bench"]
    (row,) = [r for b in bench19 if b["build"] == "default" and b["what"] == "pp" for r in b["rows"] if r["n_prompt"] == 512]
    pp19 = sorted(row["samples_ts"])[1]
    ratio, quoted_pp = quoted(RESULTS, r"the H200 prefills ~(\d+)x faster than a V100 \(pp512 ([\d,]+) above")
    assert round(pp19) == num(quoted_pp) and {round(pp19 / x) for x in pf.V100_PP} == {int(ratio)}


def test_turn_3s_tokens_and_a_v100s_time_for_them_are_quoted_as_recomputed(f):
    tokens, (fast, slow) = f["turn3_tokens"], f["v100_turn3_s"]
    assert k1(tokens) == "19.8" and (round(fast), round(slow)) == (52, 55)
    for text, pattern in ((RESULTS, r"at turn 3 would reprocess ~(\d+\.\d)K\ntokens, (\d+)-(\d+) s on a V100"),
                          (HOST, r"reprocess ~(\d+\.\d)K tokens at their fourth turn, (\d+)-(\d+) s\."),
                          (V32, r"turn 3's ~(\d+\.\d)K tokens in (\d+)-(\d+) s")):
        assert quoted(text, pattern) == [k1(tokens), str(round(fast)), str(round(slow))], pattern


def test_no_wrong_prefill_figure_is_left():
    for name, text in (("RESULTS", RESULTS), ("host.md", HOST), ("v100_32gb", V32)):
        for wrong in ("28K", "75x", "75×", "43K", "two minutes a turn", "about two minutes", "4-5x faster"):
            assert wrong not in text, (name, wrong)


# ------------------------------------------------------------------- the latency tier's acceptance
def test_llama_server_reported_every_draft_accepted_on_acc_and_none_on_rej(t):
    """The acceptance as llama-server reports it: each response's timings (draft_n_accepted / draft_n)
    over every request, and the log's own "draft acceptance" lines, which agree."""
    results = json.loads((REPO / "bench/records/tier41/results.json").read_text())
    line = re.compile(r"draft acceptance = ([\d.]+) \(\s*(\d+) accepted /\s*(\d+) generated\)")
    for r in results["tier41"]:
        row, logged = t["rows"][r["name"]], [line.search(x) for x in r["log"] if line.search(x)]
        if r["name"] in ("thr-ship", "lat-d0", "lat-d0-rej"):
            assert row["acceptance"] is None and not logged
        else:
            want = 0.0 if r["name"].endswith("-rej") else 1.0
            assert row["acceptance"] == want and logged and all(float(m.group(1)) == want for m in logged), r["name"]
        assert row["metrics"] is None and "metrics_before" not in r  # this run scraped no /metrics


def test_the_break_even_in_llama_servers_terms_needs_no_per_draft_model(t):
    """The closed form in accepted/drafted equals the per-draft model's break-even carried into
    accepted/drafted: the step time is linear in that ratio, whatever the rejections' positions."""
    for d, x in t["depths"].items():
        assert x["break_even_reported"] == pytest.approx(tier41.reported(x["break_even"], d), abs=1e-6), d
    assert [f"{t['depths'][d]['break_even_reported']:.2f}" for d in (1, 2, 3)] == ["0.26", "0.27", "0.29"]
    assert [f"{t['depths'][d]['break_even']:.2f}" for d in (1, 2, 3)] == ["0.26", "0.39", "0.50"]


def test_the_tiers_break_even_and_ranges_are_quoted_as_recomputed(t):
    be = [f"{t['depths'][d]['break_even_reported']:.2f}" for d in (1, 2, 3)]
    assert quoted(RESULTS, r"depth 1 pays above (0\.\d+), depth 2 above (0\.\d+), depth 3 above\n  (0\.\d+)\.") == be
    per = [str(round(100 * t["depths"][d]["break_even"])) for d in (1, 2, 3)]
    assert quoted(RESULTS, r"In those terms depth 1 pays above (\d+) %, depth 2 above (\d+) %, depth 3 above (\d+) %") == per
    a2, a3 = t["crossovers"][2], t["crossovers"][3]
    at2 = [f"{tier41.reported(a, 2):.2f}" for a in (a2, a3)]
    assert quoted(RESULTS, r"fastest for a from (0\.\d+) to (0\.\d+), where a depth-2 server reports (0\.\d+)-(0\.\d+)") == \
        [f"{a2:.2f}", f"{a3:.2f}"] + at2
    assert quoted(RESULTS, r"Below (0\.\d+) depth 1 is\n  faster; above (0\.\d+), depth 3") == at2
    shipped = yaml.safe_load(LATENCY)["server_spec_draft_max"]
    assert shipped == 2 and tier41.best_depth(t, 0.7) == shipped
    assert quoted(LATENCY, r"depth 2: pays above (0\.\d+) accepted/drafted as llama-server reports it .*?; depth 1: (0\.\d+), 3: (0\.\d+)\)") \
        == [be[1], be[0], be[2]]
    assert quoted(LATENCY, r"fastest at (0\.\d+)-(0\.\d+) \((0\.\d+)-(0\.\d+) per draft\)") == at2 + [f"{a2:.2f}", f"{a3:.2f}"]


def test_metrics_acceptance_reads_the_counters_llama_server_exposes():
    """What a run of the new scrape will hold: the /metrics counters of the pinned llama-server
    (tools/server/server-task.cpp) before and after a config's rounds."""
    before = {"spec_decode_num_draft_tokens_total": 10, "spec_decode_num_accepted_tokens_total": 5,
              "spec_decode_num_drafts_total": 5, 'spec_decode_num_accepted_tokens_per_pos_total{position="0"}': 4,
              'spec_decode_num_accepted_tokens_per_pos_total{position="1"}': 1}
    after = {"spec_decode_num_draft_tokens_total": 210, "spec_decode_num_accepted_tokens_total": 85,
             "spec_decode_num_drafts_total": 105, 'spec_decode_num_accepted_tokens_per_pos_total{position="0"}': 64,
             'spec_decode_num_accepted_tokens_per_pos_total{position="1"}': 26}
    m = tier41.metrics_acceptance({"metrics_before": before, "metrics_after": after})
    assert m == {"drafted": 200, "accepted": 80, "steps": 100, "acceptance": 0.4, "per_position": [0.6, 0.25]}
    assert tier41.metrics_acceptance({"metrics_before": {}, "metrics_after": after}) is None


def test_the_tier_phase_scrapes_metrics_before_and_after_its_rounds(monkeypatch):
    """bench/gpu/proof/tiers.py, run against stand-ins: the record gets /metrics after the warm-up and
    after the rounds, around every request of them."""
    from bench.gpu.proof import tiers

    calls = []
    monkeypatch.setattr(tiers, "metrics", lambda port, key: calls.append("metrics") or {"n": len(calls)})
    monkeypatch.setattr(tiers, "complete", lambda *a, **k: calls.append("warm-up") or {})
    monkeypatch.setattr(tiers, "concurrent", lambda port, jobs: calls.append("round") or [{} for _ in jobs])
    monkeypatch.setattr(tiers, "gpu_mem", lambda pid: {"proc_mib": 1})
    monkeypatch.setattr(tiers, "proc_mem", lambda pid: {})
    monkeypatch.setattr(tiers.time, "sleep", lambda s: None)
    for name in ("Sampler", "HostSampler"):
        monkeypatch.setattr(tiers, name, lambda *a: types.SimpleNamespace(stop=lambda: 0))
    server = types.SimpleNamespace(ok=True, load_s=1.0, args=["-m", "x"], p=types.SimpleNamespace(pid=1),
                                   stop=lambda: None, buffers=lambda: [])
    run = types.SimpleNamespace(results={}, port=1, a=types.SimpleNamespace(models="/m"), save=lambda: None,
                                server=lambda *a, **k: server, loglines=lambda s: [],
                                plan={"tier41": {"build": "mmq", "runs": 1, "prompt": 8, "tokens": 4,
                                                 "configs": [{"name": "lat-d2", "model": "f.gguf", "args": [],
                                                              "streams": [1, 2]}]}})
    tiers.latency_tier(run, "mmq")
    (r,) = run.results["tier41"]
    assert calls == ["warm-up", "metrics", "round", "round", "metrics"]
    assert r["metrics_before"] == {"n": 2} and r["metrics_after"] == {"n": 5}
