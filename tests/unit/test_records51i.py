"""Issue 51's ninth session (bench/records/proof51/session9, an H200, b11434 with Volta's kernel choice, FORCE_MMQ): the
second run of the heap's two shares (1x with 8 checkpoints, 4x with the 16 GiB cache) and 1x without checkpoints whole.
Every figure bench/RESULTS.md, docs/host.md and group_vars quote from it is recomputed by bench.traffic.analyze from the
raw results.json and the servers' whole logs (logs.tgz)."""
from pathlib import Path

from bench.traffic import analyze
from tests.unit.records51 import (assert_built, assert_rows_quoted, assert_same_schedules, assert_under_plan,
                                  call_fixtures, config_named, earlier_calls, figures, heap51_configs, matrix_left,
                                  plan_at_share, plan_fixture, plan_then, share_needed, spared, todo, unreclaimable,
                                  v100_s)
from voltafleet.planning import flags

REPO = Path(__file__).resolve().parents[2]
SESSION = REPO / "bench/records/proof51/session9"
CALL = SESSION / "call3"  # the last call's results.json holds sessions 1-9
ONE8, C16, ONE0 = "1x-ck8-cr0-heap", "4x-ck4-cr16-noidle-heap", "1x-ck0-cr0-heap"  # this session's
ONE4, SHIP, C8 = "1x-ck4-cr0-heap", "4x-ck4-cr0-heap", "4x-ck4-cr8-noidle-heap"  # sessions 5, 6 and 7's (H100s)
SHARES = (0.02, 0.16)  # hostmem_heap_share, hostmem_cache_heap_share (group_vars/all.yml)


results, logs, rounds = call_fixtures(CALL)


plan_now = plan_fixture()


def test_the_session_built_b11434_with_volta_s_choice_on_an_h200(results, logs):
    assert_built(SESSION, "NVIDIA H200", 231, 54, 11)
    for c in results["traffic51"][-3:]:
        assert "FORCE_MMQ = 1" in logs[f"load-mmq-{c['name']}.log"] and c["build"] == "mmq"
        assert c["env"] == flags.MALLOC_HEAP
    assert results["baseline"]["gpu_total_mib"] == 143771
    # the device's time ran out in 4x with the 4 GiB cache's first schedule: its server's log, no record of it
    assert "load-mmq-4x-ck4-cr4-noidle-heap.log" in logs
    assert "4x-ck4-cr4-noidle-heap" not in [c["name"] for c in results["traffic51"]]


def test_the_session_goes_on_from_session_8_whose_records_it_holds_unchanged(results):
    """Session 8's results.json is rebuilt from this session's (its results.json.held) byte for byte: the sha256 its
    held file keeps, and analyze.load checks, is the one of the results.json.gz session 8 committed (9d32f73). So this
    session's first call started from exactly that file, its configs first and unchanged."""
    import json

    eight = analyze.load(str(REPO / "bench/records/proof51/session8/call3/results.json"))
    held = json.loads((REPO / "bench/records/proof51/session8/call3/results.json.held").read_text())
    assert held["held_by"] == "../../session9/call3" and "baseline" not in held  # both H200s
    assert held["sha256"] == "694354ba60b5372000270e87ccdc17e56b4ed1267ea56d38a743eb7fcb1d15bc" and held["traffic51"] == 29
    assert results["traffic51"][:len(eight["traffic51"])] == eight["traffic51"]
    new = results["traffic51"][len(eight["traffic51"]):]
    assert [(c["name"], c.get("complete"), len(c["reps"])) for c in new] == [(ONE8, True, 3), (C16, True, 3),
                                                                           (ONE0, True, 3)]
    # the complete run of 1x without checkpoints is the one that stands for it (session 8's ran 2 of 3)
    assert config_named(results, ONE0) is new[-1]


def test_calls_1_and_2_are_kept_as_their_sha256_and_call3_goes_on_from_them():
    one8 = [(ONE8, str(i)) for i in range(3)]
    assert earlier_calls(SESSION) == {"call1": one8, "call2": one8 + [(C16, "0"), (C16, "1")]}
    assert "[bench   1225s] traffic51 1x-ck0-cr0-heap 2 48.28" in (CALL / "progress.txt").read_text()


def test_1x_with_8_checkpoints_and_without_checkpoints(results):
    """At 1x 8 checkpoints hold nothing 4 do not (the same prompt tokens on every schedule, for 4,959 MiB more held);
    without checkpoints every follow-up reprocesses its whole history."""
    got = figures(results, (ONE8, ONE0, ONE4))
    assert got == {ONE8: (True, 3, 0.8371, 645, 1772, 1290, 61.3, 23562, 16044),
                   ONE0: (True, 3, 0.0, 868, 2823, 702, 52.2, 63681, 1392),
                   ONE4: (True, 3, 0.8371, 507, 2199, 1164, 59.4, 23562, 11096)}
    assert [analyze.reprocessed(config_named(results, n)) for n in (ONE8, ONE4, ONE0)] == [
        [(43, 0), (29, 0), (33, 0)], [(43, 0), (29, 0), (33, 0)], [(43, 43), (29, 29), (33, 33)]]
    assert_same_schedules(results, ONE4, (ONE8, ONE0), (2837, 2399, 2518))
    assert spared(results, ONE4, ONE8) == [0, 0, 0]
    x8, x4 = config_named(results, ONE8), config_named(results, ONE4)
    more = round(unreclaimable(x8) - unreclaimable(x4))
    assert more == 4959 and round(more / 149.6) == 33
    base8 = plan_at_share(x8, 0, 0)["planned_held_mib"]
    each = (plan_at_share(x8, 1, 0)["planned_held_mib"] - base8) / (16 * 8)
    assert round((base8 - plan_at_share(x4, 0, 0)["planned_held_mib"]) / each) == 64
    assert analyze.V100_PP == (363, 384)  # llama.cpp #25139's V100 prefill, tok/s
    assert spared(results, ONE0, ONE4) == [48259, 28154, 39370] and v100_s(spared(results, ONE0, ONE4)) == (73, 133)


def test_the_16_gib_cache_at_4x(results, logs):
    """It kept many of the conversations that lost their slot, not all: fewer whole reprocesses than shipped and the
    8 GiB cache, 55-72K fewer prompt tokens than shipped a replay."""
    got = figures(results, (C16, SHIP, C8))
    assert got == {C16: (True, 3, 0.5724, 1677, 8153, 1582, 34.6, 144154, 29074),
                   SHIP: (True, 3, 0.1877, 2048, 10219, 1448, 33.6, 206491, 10965),
                   C8: (True, 3, 0.3162, 3104, 12973, 2109, 33.5, 184095, 20295)}
    assert [analyze.reprocessed(config_named(results, n)) for n in (C16, SHIP, C8)] == [
        [(130, 55), (116, 35), (123, 41)], [(130, 104), (116, 86), (123, 101)], [(130, 85), (116, 72), (123, 76)]]
    assert_same_schedules(results, SHIP, (C16, C8), (10095, 9425, 9797))
    assert spared(results, SHIP, C16) == [56448, 55297, 71648] and v100_s(spared(results, SHIP, C16)) == (144, 197)
    work = [(r["cache_updates"], round(r["cache_update_ms"] / 1e3, 1))
            for r in analyze.work(config_named(results, C16), logs)["per_rep"]]
    assert work == [(172, 25.0), (150, 17.1), (160, 17.3)]


def test_the_two_shares_hold_on_their_second_run(results, plan_now):
    """Today's plan is above every HEAP51 config, this session's three (none fitted on) included; the cache's share
    is validated at 4x with 16 GiB (9.2 % kept, 0.16 planned), while 1x with 8 checkpoints did not keep every one live,
    so the checkpoints' share has its second run on 1x with 4 again."""
    heap = heap51_configs(results)
    assert len(heap) == 13
    over = {x["name"]: assert_under_plan(x, plan_now[x["name"]], SHARES) for x in heap}
    assert {n: over[n] for n in (ONE8, C16, ONE0)} == {ONE8: 0.323, C16: 0.04, ONE0: 0.049}
    for n in (ONE8, C16, ONE0):
        x = config_named(results, n)
        assert x["planned_held_mib"] == plan_now[n]["planned_held_mib"]  # the plan it ran with is today's
        assert x["alive_at_end"] is True and x["cgroup_end"]["cg_events"]["oom_kill"] == 0
    c16 = config_named(results, C16)
    assert [round(r["peak"]["cgroup"]["cg_unreclaimable"]) for r in c16["reps"]] == [28195, 28196, 28288]

    def need(x):
        return share_needed(x, SHARES[0])[1]
    assert need(c16) == 0.092 < SHARES[1] and need(config_named(results, "2x-ck4-cr16-noidle-heap")) == 0.081
    assert need(config_named(results, ONE8)) < 0 < need(config_named(results, ONE4)) == 0.011  # not every ckpt live


def test_after_session_9_six_configs_are_left_the_2x_pair_first(results, plan_now):
    """Of the matrix's 16 cells 3 are left, with 1x shipped again (the checkpoints' share's second run) and the 2x pair:
    6 configs, 3,674 s, in today's plan's order (the pair, the cheapest, first). Session 9 planned -again then 4x with
    the 4 GiB cache (126 + 998 s); session 10 ran -again alone (TRAFFIC51_ONLY: its device came late)."""
    left = todo(results, plan_now, 9)
    assert left == ["2x-ck4-cr0-heap-pair", "2x-ck4-cr16-noidle-heap-pair", "1x-ck4-cr0-heap-again",
                    "4x-ck4-cr4-noidle-heap", "4x-ck0-cr0-heap", "4x-ck8-cr0-heap"]
    assert [plan_now[n]["estimate_s"] for n in left] == [335, 360, 126, 998, 912, 943]
    assert sum(plan_now[n]["estimate_s"] for n in left) == 3674
    assert matrix_left(plan_now, left) == (16, {(4, 4, 4), (4, 0, 0), (4, 8, 0)})


def test_the_docs_quote_these_records(results, plan_now):
    results_md = " ".join((REPO / "bench/RESULTS.md").read_text().split())
    section = results_md[results_md.index("### Session 9"):]
    assert_rows_quoted(section, results, (ONE8, ONE0, C16, ONE4, SHIP, C8))
    for words in ("the build took 231 s, Volta's kernel choice 54 s and FORCE_MMQ 11 s", "1,225 s in",
                  "(1x: 2,837, 2,399 and 2,518; 4x: 10,095, 9,425 and 9,797)", "8 checkpoints spare nothing 4 do not",
                  "23,562 in all, 0 spared on each", "did in session 5 (an H100, another run)", "#25139's 363-384 tok/s",
                  "4,959 MiB more", "about 33 more checkpoints of 149.6 MiB", "(all 43, 29 and 33)",
                  "48,259, 28,154 and 39,370 more prompt tokens", "73-133 s", "55, 35 and 41 follow-ups",
                  "(of 130, 116 and 123), against 104, 86 and 101", "85, 72 and 76 with 8 GiB",
                  "56,448, 55,297 and 71,648 fewer prompt tokens", "144-197 s", "150-172 cache updates taking 17.1-25.0 s",
                  "(1,677 / 8,153 ms) cannot be set against shipped's (2,048 / 10,219): session 6 ran on an H100",
                  "kept 9.2 % of its cache", "(2x: 8.1 %)", "28,195, 28,196 and 28,288 MiB",
                  "32.3 % above 1x with 8 checkpoints", "(1x without checkpoints has no heap term",
                  "beyond the planned checkpoints and cache", "`1x-ck4-cr0-heap-again`",
                  "plans 30,938 MiB an instance", "13 of its 16 cells have run", "(about 126 s)", "(about 998 s)",
                  "6 configs, 3,674 s estimated"):
        assert words in section.replace("**", ""), words
    heap_rows = section[section.index("| HEAP51 config |"):section.index("- **The cache's share")]
    for x in heap51_configs(results):
        u, now = unreclaimable(x), plan_then(x, plan_now[x["name"]], SHARES)["planned_held_mib"]
        row = f"| `{x['name']}` | {u:,.0f} | {now:,.0f} | {now / u - 1:.1%} |".replace("%", " %")
        assert row in heap_rows, row
    assert plan_now[C16]["planned_mib"] == 30938.2
    host = " ".join((REPO / "docs/host.md").read_text().split())
    for words in ("on their second run (session 9, an H200) the plan was 4.0 % above 4x with the 16 GiB cache (9.2 % of "
                  "it kept) and above 1x with 8 checkpoints, whose checkpoints were not all live",
                  "above all 13 HEAP51 configs measured now (0.2-45.2 %)",
                  "28,195, 28,196 and 28,288 MiB against 29,408 (4.0 % above). It kept 9.2 % of its cache",
                  "15,234 against 20,152 (32.3 % above)", "4,959 MiB above 1x with 4 in session 5, an H100: about 33",
                  "552 against 579 (4.9 % above)", "`tests/unit/test_records51i.py` for session 9"):
        assert words in host, words
    v32 = (REPO / "group_vars/v100_32gb.yml").read_text()
    assert ("at 4x (session 9) 0.57 vs 0.19 cached (session 6, an H100: another run and GPU): 55-72K fewer prompt "
            "tokens a replay, 144-197 s of V100 prefill") in v32
