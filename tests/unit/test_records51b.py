"""Issue 51's second session (bench/records/proof51/session2, an H100, b11434 with Volta's kernel choice): item 3
(v100_32gb as shipped, the seed's stage-3 flags and v100_32gb without checkpoints, 16 clients) and 2x without
checkpoints whole; every figure bench/RESULTS.md quotes from it, recomputed by bench.traffic.analyze from the
raw results.json and the servers' whole logs (logs.tgz)."""
import statistics
from pathlib import Path

from bench.traffic import analyze
from tests.unit.records51 import call_fixtures

REPO = Path(__file__).resolve().parents[2]
CALL = REPO / "bench/records/proof51/session2/call2"


results, logs, rounds = call_fixtures(CALL)


def by_name(results, name):
    return next(c for c in analyze.rounds_configs(results) + analyze.configs(results) if c["name"] == name)


def test_the_session_built_b11434_with_volta_s_choice_on_an_h100(results, logs):
    facts = (CALL / "facts.txt").read_text()
    assert "NVIDIA H100 80GB HBM3" in facts and "580.159.04" in facts
    assert "volta rc=0" in (CALL / "build-volta.txt").read_text() and "mmq rc=0" in (CALL / "build-mmq.txt").read_text()
    for name in ("thr-ship", "thr-ship-ck0", "2x-ck0-cr0"):
        assert "FORCE_MMQ = 1" in logs[by_name(results, name)["log_file"]]  # each server's whole log
    # the seed's argv logs no system_info line; it ran the same binary (the phase's one build)
    assert {by_name(results, n)["build"] for n in ("thr-ship", "thr-seed", "thr-ship-ck0", "2x-ck0-cr0")} == {"mmq"}


def test_item_3_wall_tok_s_and_the_ratio_to_the_seed(rounds):
    got = {n: {s: (f["median"], f["x_seed"]) for s, f in shapes.items()} for n, shapes in rounds.items()}
    assert got == {"thr-ship": {"128/128": (293.8, 2.39), "160/256": (352.0, 2.51)},
                   "thr-seed": {"128/128": (123.1, 1.0), "160/256": (140.3, 1.0)},
                   "thr-ship-ck0": {"128/128": (376.6, 3.06), "160/256": (402.8, 2.87)}}
    assert all(len(f["tps"]) == 3 for shapes in rounds.values() for f in shapes.values())  # median of 3


def test_item_3_stops_short_at_the_decode_steps(results, rounds):
    """16 streams step in ~35 ms, the seed's 4 in ~22: as answers grow the ratio tends to 16/35 over 4/22."""
    steps = {n: {s: round(f["step_median"], 1) for s, f in shapes.items()} for n, shapes in rounds.items()}
    assert steps == {"thr-ship": {"128/128": 34.8, "160/256": 35.3}, "thr-seed": {"128/128": 22.2, "160/256": 22.6},
                     "thr-ship-ck0": {"128/128": 34.8, "160/256": 35.1}}
    assert analyze.decode_ceiling(results, "thr-ship-ck0") == {"128/128": 2.55, "160/256": 2.57}


def test_item_3_s_checkpoints_cost_one_copy_a_request(results, logs, rounds):
    """thr-ship makes one 149.6 MiB checkpoint a request (16-17 a round); ck0 and the seed none. The copies
    alone in the whole log take 82.2 ms (median of 100): ~1.4 s a round, most of the 1.5 s ck0 gains."""
    ship = analyze.work(by_name(results, "thr-ship"), logs)
    assert [r["created"] for r in ship["per_rep"]] == [16, 17, 16, 17, 16, 17]
    assert ship["copies_alone"] == 100 and round(ship["copy_ms_median"], 1) == 82.2
    for name in ("thr-seed", "thr-ship-ck0"):
        assert analyze.work(by_name(results, name), logs)["created"] == 0
    per_round_s = statistics.median(r["created"] for r in ship["per_rep"]) * ship["copy_ms_median"] / 1e3
    gained_s = 16 * 128 / rounds["thr-ship"]["128/128"]["median"] - 16 * 128 / rounds["thr-ship-ck0"]["128/128"]["median"]
    assert round(per_round_s, 2) == 1.36 and round(gained_s, 2) == 1.53
    ttft = {n: statistics.median(statistics.median(r["ttft_ms"] for r in rep["recs"])
                                 for rep in by_name(results, n)["reps"] if rep["tokens"] == 128)
            for n in ("thr-ship", "thr-ship-ck0", "thr-seed")}
    assert {n: round(v / 1e3, 2) for n, v in ttft.items()} == {"thr-ship": 2.55, "thr-ship-ck0": 1.02, "thr-seed": 7.5}


def test_item_3_host_memory_under_its_plan(results):
    for name in ("thr-ship", "thr-ship-ck0"):
        c = by_name(results, name)
        rss = max(r["peak"]["VmRSS"] for r in c["reps"])
        assert rss < c["planned_mib"] < c["memory_max_mib"] and c["alive_at_end"] is True


def test_2x_without_checkpoints_whole(results):
    rows = {r["name"]: r for r in analyze.table(results)}
    ck0 = rows["2x-ck0-cr0"]
    assert ck0["complete"] and ck0["reps"] == 3
    assert (ck0["followup_cached_share"], round(ck0["followup_ttft_p50_ms"]), round(ck0["followup_ttft_p99_ms"]),
            round(ck0["opening_ttft_p50_ms"]), round(ck0["aggregate_tps"], 1), round(ck0["processed"])) == \
        (0.0, 1025, 3118, 712, 43.2, 116238)
    assert round(ck0["rss_peak_mib"]) == 1363 < round(ck0["planned_mib"]) == 2109
    for field in ("generated", "requests"):  # each schedule: the same tokens with and without checkpoints
        pairs = analyze.paired(results, "2x-ck4-cr0", "2x-ck0-cr0", field)
        assert len(pairs) == 3 and all(a == b for _, a, b in pairs)


def test_what_the_v100_would_save_on_each_schedule(results, logs):
    """Tokens 4 checkpoints spared on each schedule, in a V100's prefill seconds, against the copies they cost
    (requests x 2-3 copies at the whole log's 82.2 ms)."""
    spared = [b - a for _, a, b in analyze.paired(results, "2x-ck4-cr0", "2x-ck0-cr0", "processed")]
    assert spared == [29243, 5363, 36254]
    assert [[round(s) for s in analyze.v100_prefill_s(x)] for x in spared] == [[76, 81], [14, 15], [94, 100]]
    copy_s = analyze.work(by_name(results, "thr-ship"), logs)["copy_ms_median"] / 1e3
    req = [a for _, a, _ in analyze.paired(results, "2x-ck4-cr0", "2x-ck0-cr0", "requests")]
    assert [[round(n * k * copy_s) for k in (2, 3)] for n in req] == [[16, 24], [15, 22], [16, 24]]
    walls = [round(a - b, 1) for _, a, b in analyze.paired(results, "2x-ck4-cr0", "2x-ck0-cr0", "wall_s")]
    assert walls == [21.8, 11.7, 18.4]  # what checkpoints added to the H100's replays


def test_group_vars_and_docs_quote_these_ratios(rounds):
    ship, ck0 = rounds["thr-ship"], rounds["thr-ship-ck0"]
    line = next(x for x in (REPO / "group_vars/v100_32gb.yml").read_text().splitlines()
                if x.startswith("server_parallel:"))
    assert f"{ship['128/128']['x_seed']}x / {ship['160/256']['x_seed']}x the seed's stage-3 flags" in line
    assert "proof51/session2" in line
    doc = " ".join((REPO / "docs/vram.md").read_text().split())
    assert f"at 16 clients {ship['128/128']['x_seed']}x the seed's stage-3 throughput at 128/128 and " \
           f"{ship['160/256']['x_seed']}x at 160/256" in doc
    assert f"it would be {ck0['128/128']['x_seed']}x and {ck0['160/256']['x_seed']}x" in doc


def test_session_3_resumes_where_session_2_stopped(results):
    """The next session's plan skips what sessions 1 and 2 completed: the heap configs and their baselines first
    (heap51), then 51b's rest."""
    from bench.gpu import gpu_proof
    from bench.gpu.proof.traffic import done

    todo = [c["name"] for c in gpu_proof.plan51()["traffic51"]["configs"] if not done(results["traffic51"], c)]
    # (what follows them changed once HEAP51 shipped: test_records51d)
    assert todo[:7] == ["thr-ship-again", "thr-seed-again", "thr-ship-heap", "2x-ck4-cr0-again", "2x-ck4-cr0-heap",
                        "2x-ck4-cr0-base4", "2x-ck4-cr8-noidle"]
    heap = [c for c in gpu_proof.plan51()["traffic51"]["configs"] if c.get("env") and c["part"] == "51b"]
    assert [c["name"] for c in heap] == ["thr-ship-heap", "2x-ck4-cr0-heap"] and all(c["env"] == gpu_proof.HEAP51 for c in heap)
    # each heap config's argv is its baseline's, run beside it
    args = {c["name"]: c["args"] for c in gpu_proof.plan51()["traffic51"]["configs"]}
    assert args["thr-ship-heap"] == args["thr-ship-again"] == args["thr-ship"]
    assert args["2x-ck4-cr0-heap"] == args["2x-ck4-cr0-again"] == args["2x-ck4-cr0"]
    assert not {"2x-ck4-cr0", "2x-ck4-cr8", "2x-ck0-cr0", "thr-ship", "thr-seed", "thr-ship-ck0"} & set(todo)
