"""Issue 41's H200 record (bench/records/tier41): recomputed from the raw records, never restated.
The latency tier against the throughput tier, its depth, and its plans against what was measured."""
import json
from pathlib import Path

import pytest
import yaml

from bench.gpu.gpu_proof import latency41, plan41, tier41_cfg
from bench.gpu.groups import group_cfg
from bench.gpu.tier41 import ACCEPTANCES, best_depth, report, table
from voltafleet.planning import hostmem, vram
from voltafleet.planning.flags import server_args
from voltafleet.models.gguf_header import from_json

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "bench/records/tier41"
MIB = 2**20
LATENCY = yaml.safe_load((REPO / "group_vars/latency.yml").read_text())


@pytest.fixture(scope="module")
def results():
    return json.loads((RUN / "results.json").read_text())


@pytest.fixture(scope="module")
def t(results):
    return table(results)


def runs(results) -> dict:
    return {r["name"]: r for r in results["tier41"]}


def test_the_run_is_plan41_as_rendered_today_three_repetitions_each_without_an_error(results):
    configs = {c["name"]: c for c in plan41()["tier41"]["configs"]}
    assert list(runs(results)) == list(configs) and not results.get("errors")
    for name, r in runs(results).items():
        assert r["healthy"] and r["args"][2:] == configs[name]["args"][2:], name  # [0:2]: -m and the file
        assert r["args"][1] == "MODELS/" + configs[name]["model"]
        for k in configs[name]["streams"]:
            rounds = [x for x in r["rounds"] if x["streams"] == k]
            assert len(rounds) == 3 and all(len(x["recs"]) == k for x in rounds), (name, k)
            assert all(q.get("error") is None and q["n"] == 128 for x in rounds for q in x["recs"]), (name, k)


def test_the_acc_file_accepts_every_draft_and_the_rej_file_none(results):
    for name, r in runs(results).items():
        recs = [q for x in r["rounds"] for q in x["recs"]]
        if "-d0" in name or name == "thr-ship":
            assert all(q["draft_n"] is None for q in recs), name
        elif name.endswith("-rej"):
            assert all(q["draft_n"] > 0 and q["draft_accepted"] == 0 for q in recs), name
        else:
            assert all(q["draft_n"] > 0 and q["draft_accepted"] == q["draft_n"] for q in recs), name


def test_speculation_does_not_change_the_greedy_output(results):
    """The same prompts in every config: one text per prompt, with or without drafting, accepted or not."""
    texts = {}
    for r in results["tier41"]:
        for x in r["rounds"]:
            for i, q in enumerate(x["recs"]):
                texts.setdefault((x["rep"], x["streams"], i), set()).add(q["text_sha"])
    assert all(len(v) == 1 for v in texts.values()), texts


def test_the_latency_tier_doubles_a_single_stream_at_best_and_pays_above_a_break_even(t):
    base = t["rows"]["lat-d0"]["decode_tps"]
    assert t["rows"]["thr-ship"]["decode_tps"] == pytest.approx(base, rel=0.05)  # 2 slots alone do not speed a stream
    gains = [t["depths"][d]["gain_all"] for d in (1, 2, 3)]
    assert gains == sorted(gains) and gains[0] > 1.4  # every draft accepted: deeper is faster
    assert all(t["depths"][d]["gain_none"] < 1 for d in (1, 2, 3))  # every draft rejected: slower than none
    be = [t["depths"][d]["break_even"] for d in (1, 2, 3)]
    assert be == sorted(be) and 0 < be[0] and be[2] < 1
    for d in (1, 2, 3):  # the model meets its measured ends and the base at its break-even
        x, acc, rej = t["depths"][d], t["rows"][f"lat-d{d}"], t["rows"][f"lat-d{d}-rej"]
        assert x["gain_all"] * base == pytest.approx(acc["decode_tps"]) and x["gain_none"] * base == pytest.approx(rej["decode_tps"])


def test_the_shipped_depth_is_the_fastest_at_the_acceptance_real_chats_see(t):
    """group_vars/latency.yml's depth: the fastest at 0.6-0.8 acceptance (depth 3 only wins where nearly all are
    accepted), with a lower break-even than depth 3."""
    depth = LATENCY["server_spec_draft_max"]
    assert all(best_depth(t, a) == depth for a in (0.6, 0.7)) and t["depths"][depth]["break_even"] < t["depths"][3]["break_even"]
    assert t["depths"][3]["at"][0.9] > t["depths"][depth]["at"][0.9]  # the best case alone would have picked 3
    assert set(t["depths"][depth]["at"]) == set(ACCEPTANCES)


def test_the_latency_group_renders_the_measured_argv_at_its_depth(results):
    cfg = group_cfg("v100_32gb").replace(**{**LATENCY})
    assert server_args(cfg, "MODEL", port=18080, api_key_file=None)[2:] == runs(results)["lat-d2"]["args"][2:]
    assert latency41(LATENCY["server_spec_draft_max"]).server.ctx == LATENCY["server_ctx"]


@pytest.mark.parametrize("depth", [0, 1, 2, 3])
def test_the_latency_groups_plans_never_fall_under_a_measured_peak(results, depth):
    """VRAM (the V100-32GB plan at the latency group's values, Volta's archs) within 0.2 % above every depth's peak;
    host memory above the peak RSS."""
    header = from_json(json.loads((REPO / "tests/fixtures/gguf/qwen35-27b-q4ks-mtp.json").read_text()))
    cfg = tier41_cfg(depth)  # the latency group as tier41 ran it at this depth
    decision = vram.decide(cfg, 32768, header, archs=[70])
    r = runs(results)[f"lat-d{depth}"]
    planned = decision.plan.needed / MIB
    assert decision.error is None and 0 <= planned - r["gpu_peak_mib"] <= 0.002 * r["gpu_peak_mib"], (planned, r["gpu_peak_mib"])
    host = hostmem.plan(cfg, vram.ModelShape.from_header(header), 1).instance.total / MIB
    assert host >= r["host_peak"]["VmRSS"], (host, r["host_peak"])


def test_the_results_md_table_is_the_records(results):
    assert report(results) in (REPO / "bench/RESULTS.md").read_text()
