"""Issue 51's eleventh session (bench/records/proof51/session11, an H100, b11434 with Volta's kernel choice, FORCE_MMQ):
the shipped config and the 16 GiB host cache at 2x, paired in one run. Every figure bench/RESULTS.md, docs/host.md and
group_vars quote from it is recomputed by bench.traffic.analyze from the raw results.json and the servers' whole logs
(logs.tgz)."""
import json
from pathlib import Path

from bench.traffic import analyze
from tests.unit.records51 import (assert_built, assert_figures, assert_one_phase, assert_quoted, assert_rows_quoted, assert_under_plan, assert_var_comment, call_fixtures, config_named, doc_text,
                                  earlier_calls, figures, heap51_configs, matrix_left, plan_fixture,
                                  pre_phase_s, share_needed, spared, todo, unreclaimable, v100_s)
from voltafleet.planning import flags

REPO = Path(__file__).resolve().parents[2]
RECORDS = REPO / "bench/records/proof51"
SESSION = RECORDS / "session11"
CALL = SESSION / "call3"  # the last of three calls on one machine: its results.json (held by session 12's) holds 1-11
SHIP, CACHE = "2x-ck4-cr0-heap-pair", "2x-ck4-cr16-noidle-heap-pair"  # this session's pair
SHIP4, CACHE8 = "2x-ck4-cr0-heap", "2x-ck4-cr16-noidle-heap"  # the same configs in sessions 4 and 8 (H200s)
SHARES = (0.02, 0.16)  # hostmem_heap_share, hostmem_cache_heap_share (group_vars/all.yml)


results, logs, rounds = call_fixtures(CALL)


plan_now = plan_fixture()


def test_the_session_built_b11434_with_volta_s_choice_on_an_h100(results, logs):
    assert_built(SESSION, "NVIDIA H100 80GB HBM3", 328, 61, 13)
    for name in (SHIP, CACHE):
        assert "FORCE_MMQ = 1" in logs[f"load-mmq-{name}.log"] and config_named(results, name)["build"] == "mmq"
        assert config_named(results, name)["env"] == flags.MALLOC_HEAP
    assert results["baseline"]["gpu_total_mib"] == 81559 and results["phase_seconds"] == {"traffic51:mmq": 693.2}
    assert sorted(logs) == sorted([f"load-mmq-{SHIP}.log", f"load-mmq-{CACHE}.log"])  # the two servers this session started


def test_the_session_goes_on_from_session_10_whose_records_it_holds_unchanged(results):
    """Session 10's results.json is rebuilt from this session's (its results.json.held) byte for byte: the sha256 its
    held file keeps, and analyze.load checks, is the one of the results.json (gunzipped) session 10 committed
    (dc1918e2), and its own phase_seconds (143 s; this session's phase wrote 693.2 over it) is kept beside it. So this
    session's calls started from exactly that file, its configs first and unchanged."""
    ten = analyze.load(str(RECORDS / "session10/call1/results.json"))
    held = json.loads((RECORDS / "session10/call1/results.json.held").read_text())
    assert held["held_by"] == "../../session11/call3" and held["phase_seconds"] == {"traffic51:mmq": 143.0}
    assert held["sha256"] == "3022d276f71382ff4a5e5c54dad09715e2d9912e61d30329c54bd96b4fc156cd" and held["traffic51"] == 33
    assert results["traffic51"][:len(ten["traffic51"])] == ten["traffic51"]
    new = results["traffic51"][len(ten["traffic51"]):]
    assert [(c["name"], c.get("complete"), len(c["reps"])) for c in new] == [(SHIP, True, 3), (CACHE, True, 3)]


def test_three_calls_ran_one_phase_of_the_pair_alone():
    """TRAFFIC51_ONLY named the pair: the phase skipped 1x again before it (done in session 10) and 4x's cells after
    it, each said so; call1 ended in shipped's second schedule, call2 in the cache's third, and call3 saw it done."""
    reps = earlier_calls(SESSION)
    assert reps == {"call1": [(SHIP, "0")], "call2": [(SHIP, "0"), (SHIP, "1"), (SHIP, "2"), (CACHE, "0"), (CACHE, "1")]}
    assert_one_phase(11, ["4x-ck4-cr4-noidle-heap", "4x-ck0-cr0-heap", "4x-ck8-cr0-heap"], "1x-ck4-cr0-heap-again",
                     [(n, str(i)) for n in (SHIP, CACHE) for i in range(3)], 420)  # the phase began 420 s in


def test_in_one_run_the_16_gib_cache_wins_every_follow_up_figure_and_costs_the_openings(results, logs):
    assert_figures(results, {SHIP: (True, 3, 0.3723, 1317, 5999, 1198, 39.8, 83662, 10666),
                             CACHE: (True, 3, 0.8356, 866, 3472, 1660, 41.4, 44660, 29039),
                             SHIP4: (True, 3, 0.3928, 1091, 3988, 1184, 41.8, 81873, 10816),
                             CACHE8: (True, 3, 0.8356, 1033, 3230, 1940, 40.8, 44658, 28894)}, (4712, 4563, 5108))
    assert spared(results, SHIP, CACHE) == [39002, 41935, 28285] and v100_s(spared(results, SHIP, CACHE)) == (74, 116)
    assert [analyze.reprocessed(config_named(results, n)) for n in (SHIP, CACHE)] == [
        [(66, 38), (57, 37), (67, 27)], [(66, 0), (57, 0), (67, 0)]]
    work = {n: [(r["cache_updates"], round(r["cache_update_ms"] / 1e3, 1)) for r in analyze.work(config_named(results, n),
                                                                                                  logs)["per_rep"]]
            for n in (SHIP, CACHE)}
    assert work == {SHIP: [(0, 0.0)] * 3, CACHE: [(71, 13.9), (67, 9.9), (60, 7.7)]}
    rss = {n: round(max(r["peak"]["VmRSS"] for r in config_named(results, n)["reps"])) for n in (SHIP, CACHE)}
    assert rss[CACHE] - rss[SHIP] == 18373
    # schedule by schedule (a median of 3 comes from one schedule, not always the same one)
    assert by_schedule(results, SHIP, CACHE, "followup_ttft_p50_ms") == [(1317, 1226, -7), (1954, 866, -56), (724, 668, -8)]
    assert by_schedule(results, SHIP, CACHE, "followup_ttft_p99_ms") == [(6620, 4851, -27), (5999, 2031, -66),
                                                                         (2825, 3472, 23)]
    assert [d for _, _, d in by_schedule(results, SHIP, CACHE, "opening_ttft_p50_ms")] == [52, 39, 37]


def test_the_token_counts_repeat_sessions_4_and_8_on_another_gpu(results):
    assert spared(results, SHIP, SHIP4) == [1789, 912, 1] and spared(results, CACHE, CACHE8) == [2, 0, 1]
    assert analyze.reprocessed(config_named(results, SHIP4)) == [(66, 37), (57, 37), (67, 27)]
    # sessions 4 and 8 (two runs): follow-up p50 paired the same way moved up on one schedule
    assert [d for _, _, d in by_schedule(results, SHIP4, CACHE8, "followup_ttft_p50_ms")] == [13, -46, -6]


def by_schedule(results: dict, a: str, b: str, field: str) -> list:
    """(a's figure, b's, b's change on a in %) for each schedule, in a's order, rounded as RESULTS quotes them."""
    return [(round(x), round(y), round(100 * (y / x - 1))) for _, x, y in analyze.paired(results, a, b, field)]


def test_the_plan_holds_both_and_the_cache_s_share_its_third_run(results, plan_now):
    """Today's plan (0.02 of the checkpoints, 0.16 of the cache) is above both of the pair's peaks, RSS under the
    plan's total and MemoryMax above it, no OOM kill; the cache kept 9.0 % of itself (session 9: 9.2 % at 4x, session
    8: 8.1 % at 2x), and the plan is above all 16 HEAP51 configs measured."""
    ship, cache = config_named(results, SHIP), config_named(results, CACHE)
    assert share_needed(cache, SHARES[0]) == ("cache", 0.09) and share_needed(cache, SHARES[0])[1] < SHARES[1]
    earlier = [share_needed(config_named(results, n), SHARES[0]) for n in ("4x-ck4-cr16-noidle-heap", CACHE8)]
    assert earlier == [("cache", 0.092), ("cache", 0.081)]
    assert [round(r["peak"]["cgroup"]["cg_unreclaimable"]) for r in cache["reps"]] == [25108, 28079, 28264]
    assert round(unreclaimable(config_named(results, CACHE8))) == 28108
    assert (round(unreclaimable(ship)), plan_now[SHIP]["planned_held_mib"]) == (9858, 10365.6)
    assert (round(unreclaimable(cache)), plan_now[CACHE]["planned_held_mib"]) == (28264, 29408.2)
    for c in (ship, cache):
        assert c["planned_held_mib"] == plan_now[c["name"]]["planned_held_mib"]  # the run's plan was today's
        assert c["alive_at_end"] is True and c["cgroup_end"]["cg_events"]["oom_kill"] == 0
    assert [(plan_now[n]["planned_mib"], plan_now[n]["memory_max_mib"]) for n in (SHIP, CACHE)] == [
        (11895.7, 13086), (30938.2, 34033)]
    heap = heap51_configs(results)
    over = {h["name"]: assert_under_plan(h, plan_now[h["name"]], SHARES) for h in heap}
    assert (over[SHIP], over[CACHE]) == (0.051, 0.04)
    assert len(heap) == 16 and (min(over.values()), max(over.values())) == (0.002, 0.452)


def test_three_cells_are_left_each_a_session_s_phase(results, plan_now):
    left = todo(results, plan_now, 11)
    assert left == ["4x-ck4-cr4-noidle-heap", "4x-ck0-cr0-heap", "4x-ck8-cr0-heap"]
    assert [plan_now[n]["estimate_s"] for n in left] == [998, 912, 943] and sum(
        plan_now[n]["estimate_s"] for n in left) == 2853
    assert matrix_left(plan_now, left) == (16, {(4, 4, 4), (4, 0, 0), (4, 8, 0)})  # 13 of 16 have run
    # the calls used 1,214 s of device time (the device tool's status): 420 s before the phase, 693 s of it, 101 s of
    # starts and transfers (session 10: 536 s used, 357 + 143 + 36)
    waits = {s: pre_phase_s(s) for s in range(1, 12)}
    assert waits[11] == 420 and waits[10] == 357 and (min(waits.values()), max(waits.values())) == (297, 452)
    assert 1214 - 420 - round(results["phase_seconds"]["traffic51:mmq"]) == 101 and 536 - 357 - 143 == 36
    margin = -(-(max(waits.values()) + 101) // 10) * 10  # the longest wait and the larger overhead, up to 10 s
    assert margin == 560 and [plan_now[n]["estimate_s"] + margin for n in left] == [1558, 1472, 1503]


def test_the_documented_cache_option_is_the_config_measured_and_the_pin_takes_it(results):
    """The 16 GiB cache the docs give a 256 GiB host is the pair's config: --cache-ram 16384 and --no-cache-idle-slots
    through server_extra_flags, which the controller's check of b11434's llama-server --help accepts (a flag it does not
    know is refused). Session 1's cache with the idle-slot saves put openings 36 s behind."""
    import yaml

    from bench.gpu import gpu_proof
    from voltafleet.planning import flags as vflags

    args = config_named(results, CACHE)["args"]
    assert args[args.index("--cache-ram") + 1] == "16384" and args[-1] == gpu_proof.NO_IDLE_SAVES == "--no-cache-idle-slots"
    ref = yaml.safe_load((REPO / "group_vars/all.yml").read_text())["llama_cpp_ref"]
    assert ref == "b11434" and vflags.extra_flag_errors([gpu_proof.NO_IDLE_SAVES], ref) == []
    assert vflags.extra_flag_errors(["--no-cache-idle-slot"], ref)  # a misspelt flag is refused
    assert round(figures(results, ("2x-ck4-cr8",))["2x-ck4-cr8"][5] / 1000) == 36  # session 1's openings, p50


def test_the_docs_quote_these_records(results, plan_now):
    section = doc_text("bench/RESULTS.md", "### Session 11")
    assert_rows_quoted(section, results, (SHIP, CACHE, SHIP4, CACHE8))
    assert_quoted("bench/RESULTS.md", ("553 s of the session's 1,800 went", "with 1,247 s left", "the build took 328 s, Volta's kernel "
                  "choice 61 s and FORCE_MMQ 13 s", "the phase began 420 s after the call", "whole in 693 s",
                  "took 1,214 s of device time", "(4,712, 4,563 and 5,108)", "39,002, 41,935 and 28,285 fewer prompt "
                  "tokens", "74-116 s of a V100's prefill", "(0, 0 and 0), against 38, 37 and 27 (of 66, 57 and 67)",
                  "71, 67 and 60 cache updates (13.9, 9.9 and 7.7 s a replay)", "1,789, 912 and 1 more prompt tokens",
                  "(38, 37 and 27 whole reprocesses against 37, 37 and 27)", "2, 0 and 1 more than session 8",
                  "(81,873 against 44,658)", "from 1,317 to 1,226 ms, from 1,954 to 866 and from 724 to 668 (7, 56 and 8 % "
                  "lower)", "(6,620 to 4,851 and 5,999 to 2,031) and rose on the third (2,825 to 3,472)",
                  "their p50 rose 52, 39 and 37 %", "moved 13 % up, 46 % down and 6 % down (session 8 against session "
                  "4); in one run it went down on all three", "#25139's 363-384 tok/s",
                  "8 V100-32GB then need 250 GiB with the reserve", "the planner refuses it there",
                  "`server_cache_ram: 16384` with `server_extra_flags: [\"--no-cache-idle-slots\"]` (the config "
                  "measured here; b11434's llama-server takes the flag)", "session 1's openings waited 36 s",
                  "5.1 % above shipped's peak held "
                  "(9,858 MiB against 10,366)", "4.0 % above the cache's (28,264 against 29,408)", "9.0 % of itself",
                  "(session 9: 9.2 % at 4x; session 8: 8.1 % at 2x)", "(25,108, 28,079 and 28,264 MiB; session 8: to "
                  "28,108)", "(11,896 and 30,938 MiB), MemoryMax (13,086 and 34,033)", "all 16 HEAP51 configs "
                  "measured (0.2-45.2 %)", "18,373 MiB more RSS an instance (29,039 against 10,666)",
                  "plans 30,938 MiB against 11,896", "13 of its 16 cells have run", "(about 998, 912 and 943 s; 2,853 s "
                  "estimated", "used 1,214 s of device time for a 693 s phase: 420 s before it, and 101 s of starts and "
                  "transfers", "(452 s, session 1)", "E + 560 s left: about 1,470-1,560 s for a 4x cell"),
                  after="### Session 11")
    assert round((8 * plan_now[CACHE]["planned_mib"] + 8192) / 1024) == 250  # 8 instances and the host's reserve
    assert_quoted("docs/host.md", (
        "The cache's third run (session 11, an H100, 2x with the 16 GiB cache): 9.0 % of it kept, the plan 4.0 % above",
        "5.1 % above shipped's peaks (9,858 MiB held at most against 10,366) and 4.0 % above the cache's",
        "(25,108, 28,079 and 28,264 MiB against 29,408)", "above all 16 HEAP51 configs measured (0.2-45.2 %)",
        "`tests/unit/test_records51k.py` for session 11"))
    assert_var_comment("group_vars/all.yml", r"^hostmem_cache_heap_share: 0\.16 .*15\.7 % at most, 2x without checkpoints "
                       r"with an 8 GiB cache, session8; .*fitted on sessions 5-8; its second run, session9 \(an H200\): "
                       r"9\.2 % kept at 4x with a 16 GiB cache, the plan 4\.0 % above; third, session11 \(an H100\): "
                       r"9\.0 % at 2x, the plan 4\.0 % above")
    assert_var_comment("group_vars/v100_32gb.yml", r"^server_cache_ram: 0 .*in one run beside shipped \(session 11, an "
                       r"H100\): follow-up TTFT p50 7-56 % lower on each of 3 schedules, openings 37-52 % higher: set it "
                       r"where the host has the memory \(8 GPUs: 250 GiB\), with server_extra_flags: \[--no-cache-idle-slots\] "
                       r"\(with the idle-slot saves, session 1: openings behind 36 s\)")
    assert_quoted("docs/vram.md", (
        "a 16 GiB cache without those saves (`server_cache_ram: 16384` with `server_extra_flags: "
        "[\"--no-cache-idle-slots\"]`) lowered follow-up TTFT p50 by 7-56 % on each schedule and cost openings 37-52 %",
        "8 V100-32GB then plan 250 GiB"))
    # bench/traffic/README.md's ranges and sizes, since session 12's records: the newest session's records test; its
    # device command: tests/unit/test_records51_next.py
