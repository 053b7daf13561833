"""Issue 51's fifteenth session (bench/records/proof51/session15, an H100, b11434 with Volta's kernel choice,
FORCE_MMQ): 4x with 8 checkpoints, cut short by the device time after two of its three schedules. Every figure
bench/RESULTS.md, docs/host.md and bench/traffic/README.md quote from it is recomputed by bench.traffic.analyze from the
raw results.json and the server's log (logs.tgz); shipped's figures are session 6's run, which these results hold."""
import json
import re

import pytest

from bench.traffic import analyze
from tests.unit.records51 import (CUT51, DEVICE_USED51, RECORDS51, assert_built, assert_quoted, assert_under_plan,
                                  beside, call_fixtures, config_named, device_time, earlier_calls, heap51_configs,
                                  last_call, matrix_left, plan_fixture, pre_phase_s, spared, todo, unreclaimable)

SESSION = RECORDS51 / "session15"
CALL = SESSION / "call2"  # the last of two calls on one machine: its results.json holds sessions 1-15
CELL, SHIP, NONE = "4x-ck8-cr0-heap", "4x-ck4-cr0-heap", "4x-ck0-cr0-heap"  # this session's; session 6's; session 14's
SHARES = (0.02, 0.16)  # hostmem_heap_share, hostmem_cache_heap_share (group_vars/all.yml)
CKPT_MIB = 149.6  # one checkpoint of Qwen3.6-27B's recurrent state (bench/RESULTS.md session 2)
# the device tool (no record holds these): left when the machine came (six asks without one cost 466 s), after giving
# it back, and the two calls' walls as the tool's replies gave them
LEFT_AT_START, LEFT_AT_END, CALL_WALLS = 1334, 86, (556.0, 585.7)


results, logs, rounds = call_fixtures(CALL)


plan_now = plan_fixture()


@pytest.fixture(scope="module")
def cell(results):
    return config_named(results, CELL)


def test_the_session_built_b11434_with_volta_s_choice_on_an_h100_and_started_one_server(results, logs, cell):
    from voltafleet.planning import flags

    assert_built(SESSION, "NVIDIA H100 80GB HBM3", 348, 75, 15, calls=("call1", "call2"))
    assert sorted(logs) == [f"load-mmq-{CELL}.log"] and "FORCE_MMQ = 1" in logs[f"load-mmq-{CELL}.log"]
    assert cell["build"] == "mmq" and cell["env"] == flags.MALLOC_HEAP
    assert results["baseline"]["gpu_total_mib"] == 81559  # an H100


def test_the_session_goes_on_from_session_14_whose_records_it_holds_unchanged(results):
    """Session 14's results.json is rebuilt from this session's (its results.json.held) byte for byte; this session's
    phase never ended, so phase_seconds is still session 14's and the held file keeps none of its own. The first call
    ended no config: its results.json is session 14's, the same sha256."""
    held = json.loads((RECORDS51 / "session14/call3/results.json.held").read_text())
    sha = "6d17c311c7e334775fde0dfd6959752f754e9c2d2510602ed5e6841037b01e84"
    assert held == {"held_by": "../../session15/call2", "traffic51": 38,
                    "keys": ["baseline", "traffic51", "phase_seconds"], "sha256": sha}
    assert (SESSION / "call1/results.json.sha256").read_text().split()[0] == sha
    earlier = analyze.load(str(RECORDS51 / "session14/call3/results.json"))
    assert results["traffic51"][:38] == earlier["traffic51"]
    assert [(c["name"], c["complete"], len(c["reps"])) for c in results["traffic51"][38:]] == [(CELL, False, 2)]
    assert results["phase_seconds"] == earlier["phase_seconds"] == {"traffic51:mmq": 923.0}


def test_the_device_time_ran_out_after_two_of_three_schedules(results, cell, plan_now):
    """call1 ended before the first schedule did; call2 saw two end and the third under way, and the phase never said
    done. The config is today's plan's argv, on shipped's schedules."""
    assert earlier_calls(SESSION, calls=("call1",), last="call2") == {"call1": []}
    progress = (CALL / "progress.txt").read_text()
    assert "not in TRAFFIC51_ONLY" not in progress and "traffic51 4x-ck0-cr0-heap done in an earlier call" in progress
    assert re.findall(r"\] traffic51 (\S+) (\d) ", progress) == [(CELL, "0"), (CELL, "1")]
    assert re.findall(rf"\[bench +(\d+)s\] traffic51 {CELL} 1 ", progress) == ["661"]
    assert not progress.rstrip().endswith("done")
    assert pre_phase_s(15) == 459
    assert cell["plan_args"] == plan_now[CELL]["args"] and cell["env"] == config_named(results, SHIP)["env"]
    assert cell["args"][cell["args"].index("--ctx-checkpoints") + 1] == "8" and plan_now[CELL]["estimate_s"] == 943
    ship = [r["fingerprint"] for r in config_named(results, SHIP)["reps"]]
    assert [r["fingerprint"] for r in cell["reps"]] == ship[:2]
    assert analyze.paired(results, SHIP, CELL, "generated") == [(fp, g, g) for fp, g in zip(ship, (10095, 9425))]


def test_eight_checkpoints_spared_nothing_four_did_not_on_either_schedule(results, logs, cell):
    """Within one 4x config's run-to-run spread (sessions 12 and 13), 8 processed more prompt tokens than shipped's 4 on
    both schedules, and as many follow-ups or more reprocessed their whole history."""
    assert [(a, b) for _, a, b in analyze.paired(results, SHIP, CELL, "processed")] == [(206491, 210395),
                                                                                         (178178, 181102)]
    more = spared(results, CELL, SHIP)
    runs = spared(results, "4x-ck4-cr4-noidle-heap", "4x-ck4-cr4-noidle-heap-again")
    assert more == [3904, 2924] and all(0 < m < max(runs) for m in more) and (min(runs), max(runs)) == (243, 8059)
    assert analyze.reprocessed(cell) == [(130, 106), (116, 90)]
    assert analyze.reprocessed(config_named(results, SHIP))[:2] == [(130, 104), (116, 86)]
    work = analyze.work(cell, logs)
    assert [(r["created"], r["restored"]) for r in work["per_rep"]] == [(562, 24), (505, 26)]
    assert (work["copy_ms_median"], work["copies_alone"]) == (33.9, 1084)


def test_latency_and_rate_are_set_beside_shipped_s(results):
    def both(field, nd=0):
        return beside(results, CELL, SHIP, field, nd)
    assert both("followup_ttft_p50_ms") == [(4143, 2006), (2401, 2048)]
    assert both("followup_ttft_p99_ms") == [(9511, 7138), (10800, 10219)]
    assert both("aggregate_tps", 2) == [(35.58, 36.46), (25.69, 26.31)]
    assert both("wall_s") == [(284, 277), (367, 358)]


def test_the_plan_held_on_both_schedules(results, cell, plan_now):
    assert (cell["planned_held_mib"], cell["planned_mib"], cell["memory_max_mib"]) == (20152.4, 21682.4, 23851)
    assert cell["planned_held_mib"] == plan_now[CELL]["planned_held_mib"]
    assert [round(r["peak"]["cgroup"]["cg_unreclaimable"]) for r in cell["reps"]] == [11923, 11924]
    assert assert_under_plan(cell, plan_now[CELL], SHARES) == 0.690
    assert max(round(r["peak"]["VmRSS"]) for r in cell["reps"]) == 12741
    assert [(r["peak"]["cgroup"]["cg_events"]["max"], r["peak"]["cgroup"]["cg_events"]["oom_kill"])
            for r in cell["reps"]] == [(1011, 0), (1011, 0)]
    # the plan holds every slot's 8 checkpoints; the peak above 4x without checkpoints' is about 76 of them
    none = round(unreclaimable(config_named(results, NONE)))
    assert (16 * 8, none, round((round(unreclaimable(cell)) - none) / CKPT_MIB)) == (128, 559, 76)
    heap = heap51_configs(results)
    over = {h["name"]: assert_under_plan(h, plan_now[h["name"]], SHARES) for h in heap}
    assert len(heap) == 20 and (min(over.values()), max(over.values())) == (0.002, 0.690)


def test_the_cell_is_left_and_its_next_run_stands_for_it(results, cell, plan_now):
    """The partial record leaves the config to do; once a later session's complete record of it is in the results,
    analyze.configs keeps that one for the name."""
    left = todo(results, plan_now, 15)
    assert left == [CELL] and matrix_left(plan_now, left) == (16, {(4, 8, 0)})
    assert config_named(results, CELL) is cell and cell["complete"] is False
    later = {**results, "traffic51": results["traffic51"] + [{**cell, "complete": True, "reps": cell["reps"] * 2}]}
    assert config_named(later, CELL)["complete"] is True and todo(later, plan_now, 15) == []


def test_a_config_needs_its_estimate_and_570_s(results):
    """Sessions 1-15's waits before the phase; sessions 10-14's starts and transfers from their phases (session 14's
    as this session's results hold it) and this session's from its calls' walls: the margin a config needs beyond its
    estimate, rounded up to 10 s."""
    assert DEVICE_USED51[15] == LEFT_AT_START - LEFT_AT_END == 1248 and 1800 - LEFT_AT_START == 466
    assert CUT51[15] == CALL_WALLS and [round(w) for w in CALL_WALLS] == [556, 586]
    waits, phases, starts, margin = device_time(results, 15)
    assert len(waits) == 15 and waits[15] == pre_phase_s(15) == 459
    assert (min(waits.values()), max(waits.values())) == (297, 459)
    assert phases == {10: 143, 11: 693, 12: 982, 13: 951, 14: 923}  # none of this session's own
    assert starts == {10: 36, 11: 101, 12: 88, 13: 35, 14: 35, 15: 106}
    assert margin == 570 and 943 + margin == 1513
    assert LEFT_AT_START < 943 + waits[15] + starts[15]  # this session could not have ended the config


def test_the_builds_before_a_phase_in_sessions_1_to_15():
    """bench/traffic/README.md's ranges: the build 224-357 s, Volta's choice and FORCE_MMQ 61-93 s together."""
    builds, variants = [], []
    for n in range(1, 16):
        last = last_call(n)
        builds.append(int(re.search(r"build rc=0 seconds=(\d+)", (last / "build.txt").read_text())[1]))
        variants.append(sum(int(re.search(rf"{v} rc=0 seconds=(\d+)", (last / f"build-{v}.txt").read_text())[1])
                            for v in ("volta", "mmq")))
    assert (min(builds), max(builds), min(variants), max(variants)) == (224, 357, 61, 93)


def test_the_docs_quote_these_records():
    assert_quoted("bench/RESULTS.md", (
        "Six asks got no machine (466 s of the session's 1,800 gone); the seventh, with 1,334 s left",
        "the build took 348 s, Volta's kernel choice 75 s and FORCE_MMQ 15 s, and the phase began 459 s after "
        "the call",
        "its second schedule ended 661 s into the phase, and the device time ran out during the third",
        "The two calls (556 and 586 s) and their starts and transfers (106 s) took 1,248 s of device time",
        "the same tokens, 10,095 and 9,425",
        "They processed 3,904 and 2,924 more prompt tokens than shipped (210,395 and 181,102 against 206,491 "
        "and 178,178)",
        "(106 and 90, against shipped's 104 and 86)",
        "differed by 243-8,059 prompt tokens a schedule",
        "They created 562 and 505 checkpoints (restoring 24 and 26), about shipped's 559 and 509, at a median "
        "copy alone of 33.9 ms (1,084 copies in the log)",
        "Follow-up TTFT p50 4,143 and 2,401 ms against shipped's 2,006 and 2,048, p99 9,511 and 10,800 "
        "against 7,138 and 10,219; tok/s 35.58 and 25.69 against 36.46 and 26.31; walls 284 and 367 s against "
        "277 and 358",
        "It held 20,152 MiB against peaks of 11,923 and 11,924 MiB; the RSS peak (12,741 MiB) stayed under "
        "the planned total (21,682), MemoryMax (23,851)",
        "(`memory.events` `max` 1,011) with no OOM kill",
        "8 checkpoints of 149.6 MiB (128); the peak, less 4x without checkpoints' (559 MiB, session 14), is "
        "76 of them, so the plan stands 69 % above",
        "sessions 1-15 waited 297-459 s, and the calls of sessions 10-15 spent 35-106 s more",
        "E + 570 s left",
        "(about 1,513 s of device time)",
    ), after="### Session 15")
    assert_quoted("docs/host.md", (
        "its peaks held were 11,923 and 11,924 MiB against the 20,152 planned, 69.0 % above",
        "about 76 of them",
        "the RSS peak (12,741 MiB) stayed under the planned total (21,682) and MemoryMax (23,851)",
        "above all 20 HEAP51 configs measured (0.2-69.0 %; `tests/unit/test_records51o.py` for session 15)",
    ))
    assert_quoted("bench/traffic/README.md", (
        "a machine that starts with E + 570 s of device time left",
        "session 15's machine came with 1,334 s left for a 943 s config, and the time ran out in its third "
        "schedule, the second having ended 661 s into the phase",
        "its machine came after six asks without one, with 1,334 s left, and its two calls ran two of the "
        "config's three schedules",
        "session 16 starts from session 15's results with `TRAFFIC51_ONLY=4x-ck8-cr0-heap` on every call "
        "(about 943 s; about 1,513 s of device time)",
        "25.7 + 39.6 MB",
        "1.8 MB left (measured at session 15's commit",
    ))
