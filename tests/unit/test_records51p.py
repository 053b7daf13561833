"""Issue 51's sixteenth session (bench/records/proof51/session16, an H100, b11434 with Volta's kernel choice,
FORCE_MMQ, the binary built off the GPU machine by bench/gpu/offbuild.py): 4x with 8 checkpoints whole, the matrix's
last cell, and the matrix complete. Every figure bench/RESULTS.md, docs/host.md and bench/traffic/README.md quote from
it is recomputed by bench.traffic.analyze from the raw results.json and the server's log (logs.tgz); shipped's and
4x without checkpoints' figures are sessions 6's and 14's runs, which these results hold."""
import json
import re

import pytest

from bench.traffic import analyze
from tests.unit.records51 import (CUT51, DEVICE_USED51, RECORDS51, REPO, assert_one_phase, assert_one_server,
                                  assert_quoted, assert_rows_quoted, assert_under_plan, assert_var_comment, beside,
                                  call_fixtures, config_named, device_time, doc_text, earlier_calls, heap51_configs,
                                  last_call, matrix_left, plan_fixture, pre_phase_s, spared, todo, unreclaimable,
                                  v100_s)

SESSION = RECORDS51 / "session16"
CALL = SESSION / "call2"  # the last of the phase's two calls on one machine: its results.json holds sessions 1-16
CELL, SHIP, NONE = "4x-ck8-cr0-heap", "4x-ck4-cr0-heap", "4x-ck0-cr0-heap"  # this session's; session 6's; session 14's
SHARES = (0.02, 0.16)  # hostmem_heap_share, hostmem_cache_heap_share (group_vars/all.yml)
CKPT_MIB = 149.6  # one checkpoint of Qwen3.6-27B's recurrent state (bench/RESULTS.md session 2)
# the device tool (no record holds these): left when the machine came (one ask without one cost 181 s), after giving
# it back, and the three calls' walls as its replies gave them (the first left the binary's second half there)
LEFT_AT_START, LEFT_AT_END, CALL_WALLS = 1619, 536, (0.3, 555.8, 425.6)
# the matrix's cells in the order bench/RESULTS.md's table gives them: the config that stands for each, and the session
# whose phase ran its three schedules
MATRIX = {"1x-ck0-cr0-heap": 9, "1x-ck4-cr0-heap": 5, "1x-ck8-cr0-heap": 9, "2x-ck0-cr0": 2,
          "2x-ck0-cr8-noidle-heap": 8, "2x-ck4-cr0-ship": 5, "2x-ck4-cr4-noidle-heap": 8, "2x-ck4-cr8-noidle-heap": 5,
          "2x-ck4-cr16-noidle-heap": 8, "2x-ck8-cr0-heap": 5, "4x-ck0-cr0-heap": 14, "4x-ck4-cr0-heap": 6,
          "4x-ck4-cr4-noidle-heap": 12, "4x-ck4-cr8-noidle-heap": 7, "4x-ck4-cr16-noidle-heap": 9,
          "4x-ck8-cr0-heap": 16}


results, logs, rounds = call_fixtures(CALL)


plan_now = plan_fixture()


@pytest.fixture(scope="module")
def cell(results):
    return config_named(results, CELL)


def test_the_session_ran_the_binary_built_off_the_gpu_machine_on_an_h100(results, logs):
    """Nothing was built on the machine: build.txt is gpu_proof.sh's prebuilt branch, the joined binary's sha256 is
    offbuild's record of it (bench/records/offbuild51) and its --version the pin's, as sessions 1-15 built it there."""
    offbuild = (REPO / "bench/records/offbuild51/SHA256SUMS").read_text().split()
    assert offbuild[1] == "llama-server" and json.loads(
        (REPO / "bench/records/offbuild51/binary.json").read_text())["sha256"] == offbuild[0]
    version = re.search(r"^version: .*$", (last_call(15) / "build.txt").read_text(), re.M).group(0)
    for call in ("call1", "call2"):
        facts, build = ((SESSION / call / f).read_text() for f in ("facts.txt", "build.txt"))
        assert "NVIDIA H100 80GB HBM3" in facts and "580.159.04" in facts, call
        assert build.splitlines() == [f"prebuilt {offbuild[0]}  llama-server", "llama-server: OK", version,
                                      "built with GNU 12.2.0 for Linux x86_64", "prebuilt rc=0"], call
        assert not list((SESSION / call).glob("build-*.txt")), call
    assert_one_server(results, logs, CELL, 952.9)
    assert "prebuilt ok: prebuilt " + offbuild[0] in (CALL / "progress.txt").read_text()


def test_the_session_goes_on_from_session_15_whose_records_it_holds_unchanged(results):
    """Session 15's results.json is rebuilt from this session's (its results.json.held) byte for byte, its own
    phase_seconds (session 14's 923 s: session 15's phase never ended) kept beside it; this session's results begin with
    its 39 configs, the partial record of the cell among them, and add the cell's complete record."""
    call = last_call(15)
    held = json.loads((call / "results.json.held").read_text())
    assert held == {"held_by": "../../session16/call2", "traffic51": 39,
                    "keys": ["baseline", "traffic51", "phase_seconds"], "phase_seconds": {"traffic51:mmq": 923.0},
                    "sha256": "667a43f4a96cd25375e329fb39a8d6d9ce45b1833017d623c14321d1c57ae1e5"}
    earlier = analyze.load(str(call / "results.json"))
    assert results["traffic51"][:39] == earlier["traffic51"]
    assert [(c["name"], c["complete"], len(c["reps"])) for c in results["traffic51"][38:]] == [(CELL, False, 2),
                                                                                               (CELL, True, 3)]


def test_two_calls_ran_the_cell_whole_from_its_start(results, cell, plan_now):
    """The partial record ran again from its start: call1 ended its first schedule, call2 the other two and the phase.
    The config is today's plan's argv, on shipped's schedules, and replaced the partial one for its name."""
    assert earlier_calls(SESSION, calls=("call1",), last="call2") == {"call1": [(CELL, "0")]}
    assert_one_phase(16, [], "4x-ck0-cr0-heap", [(CELL, str(i)) for i in range(3)], 33)
    assert "traffic51 4x-ck4-cr4-noidle-heap-again done in an earlier call" in (CALL / "progress.txt").read_text()
    assert cell["complete"] is True and cell is results["traffic51"][39]
    assert cell["plan_args"] == plan_now[CELL]["args"] and cell["env"] == config_named(results, SHIP)["env"]
    assert cell["args"][cell["args"].index("--ctx-checkpoints") + 1] == "8" and plan_now[CELL]["estimate_s"] == 943
    assert [r["fingerprint"] for r in cell["reps"]] == [r["fingerprint"] for r in config_named(results, SHIP)["reps"]]
    assert analyze.paired(results, SHIP, CELL, "generated") == [
        (r["fingerprint"], g, g) for r, g in zip(cell["reps"], (10095, 9425, 9797))]


def test_eight_checkpoints_spared_nothing_four_did_not_on_any_schedule(results, logs, cell):
    """8 processed more prompt tokens than shipped's 4 on every schedule, by less than one 4x config's two runs
    differed (sessions 12 and 13) and about what this config's own two runs of a schedule differed by (sessions 15
    and 16); as many follow-ups or more reprocessed their whole history, and the checkpoints created were shipped's."""
    assert [(a, b) for _, a, b in analyze.paired(results, SHIP, CELL, "processed")] == [
        (206491, 209154), (178178, 184719), (215802, 217536)]
    more = spared(results, CELL, SHIP)
    runs = spared(results, "4x-ck4-cr4-noidle-heap", "4x-ck4-cr4-noidle-heap-again")
    assert more == [2663, 6541, 1734] and all(0 < m < max(runs) for m in more) and (min(runs), max(runs)) == (243, 8059)
    partial = results["traffic51"][38]
    assert [analyze.tokens(r)["processed"] for r in partial["reps"]] == [210395, 181102]
    assert [analyze.tokens(b)["processed"] - analyze.tokens(a)["processed"]
            for a, b in zip(cell["reps"], partial["reps"])] == [1241, -3617]
    assert [r["fingerprint"] for r in partial["reps"]] == [r["fingerprint"] for r in cell["reps"][:2]]
    assert analyze.reprocessed(cell) == [(130, 105), (116, 93), (123, 102)]
    assert analyze.reprocessed(config_named(results, SHIP)) == [(130, 104), (116, 86), (123, 101)]
    work = analyze.work(cell, logs)
    assert [(r["created"], r["restored"]) for r in work["per_rep"]] == [(563, 25), (507, 23), (534, 21)]
    assert (work["copy_ms_median"], work["copies_alone"]) == (33.9, 1535)


def test_latency_and_rate_are_set_beside_shipped_s(results):
    def both(field, nd=0):
        return beside(results, CELL, SHIP, field, nd)
    assert both("followup_ttft_p50_ms") == [(3362, 2006), (3135, 2048), (3995, 2426)]
    assert both("followup_ttft_p99_ms") == [(8249, 7138), (10118, 10219), (15244, 11800)]
    assert both("aggregate_tps", 2) == [(36.95, 36.46), (25.42, 26.31), (33.23, 33.6)]
    assert both("wall_s") == [(273, 277), (371, 358), (295, 292)]
    ratios = [round(a / b, 2) for a, b in both("followup_ttft_p50_ms")]
    assert (min(ratios), max(ratios)) == (1.53, 1.68)
    twice = [round(max(a, b) / min(a, b), 2) for _, a, b in analyze.paired(
        results, "4x-ck4-cr4-noidle-heap", "4x-ck4-cr4-noidle-heap-again", "followup_ttft_p50_ms")]
    assert (min(twice), max(twice)) == (1.41, 3.12)
    partial = results["traffic51"][38]
    assert [round(r["summary"]["followup_ttft_p50_ms"]) for r in partial["reps"]] == [4143, 2401]


def test_the_plan_held_on_every_schedule(results, cell, plan_now):
    assert (cell["planned_held_mib"], cell["planned_mib"], cell["memory_max_mib"]) == (20152.4, 21682.4, 23851)
    assert cell["planned_held_mib"] == plan_now[CELL]["planned_held_mib"]
    assert [round(r["peak"]["cgroup"]["cg_unreclaimable"]) for r in cell["reps"]] == [12071, 12075, 13142]
    assert assert_under_plan(cell, plan_now[CELL], SHARES) == 0.533
    assert max(round(r["peak"]["VmRSS"]) for r in cell["reps"]) == 13956
    assert [(r["peak"]["cgroup"]["cg_events"]["max"], r["peak"]["cgroup"]["cg_events"]["oom_kill"])
            for r in cell["reps"]] == [(1085, 0), (1087, 0), (1621, 0)]
    none = round(unreclaimable(config_named(results, NONE)))
    assert (16 * 8, none, round((round(unreclaimable(cell)) - none) / CKPT_MIB)) == (128, 559, 84)
    assert round(plan_now[CELL]["planned_held_mib"] - plan_now[SHIP]["planned_held_mib"]) == 9787
    heap = heap51_configs(results)
    over = {h["name"]: assert_under_plan(h, plan_now[h["name"]], SHARES) for h in heap}
    assert len(heap) == 20 and (min(over.values()), max(over.values())) == (0.002, 0.533)


def test_the_matrix_is_complete(results, plan_now):
    """No config of the plan is left; each of the 16 cells has the config MATRIX names, whose three schedules ran in
    its session's phase (that session's last call's progress names the third) on the card that session's facts name."""
    assert todo(results, plan_now, 16) == [] and matrix_left(plan_now, []) == (16, set())

    def cell_of(n):
        c = plan_now[n]
        return c["per_slot"], c["ckpt"], c["cache_ram_mib"] // 1024
    assert sorted(cell_of(n) for n in MATRIX) == sorted({cell_of(n) for n, c in plan_now.items()
                                                           if c["kind"] == "traffic"})
    progress = {t: (last_call(t) / "progress.txt").read_text() for t in range(1, 17)}
    for n, s in MATRIX.items():
        c = config_named(results, n)
        assert c["complete"] and len(c["reps"]) == 3, n
        third = re.compile(rf"\] traffic51 {re.escape(n)} 2 ")
        assert [t for t in progress if third.search(progress[t])][:1] == [s], n


def card(session: int) -> str:
    facts = (last_call(session) / "facts.txt").read_text()
    return "H200" if "NVIDIA H200" in facts else "H100" if "NVIDIA H100 80GB HBM3" in facts else "?"


def test_the_matrix_table_is_the_records(results, plan_now):
    """bench/RESULTS.md's table of the whole matrix: each row its config's figures (assert_rows_quoted), its session and
    card, the follow-ups that reprocessed their whole history and the held peak against today's plan."""
    text = doc_text("bench/RESULTS.md", after="### Issue 51: the traffic matrix, complete")
    table = text[:text.index("**Decision, on the whole matrix")]
    assert_rows_quoted(table, results, MATRIX)
    rows = re.findall(r"\(`([^`]+)`[^)]*\) \|", table)
    assert rows == list(MATRIX)
    for n, s in MATRIX.items():
        c = config_named(results, n)
        row = table[table.index(f"(`{n}`"):].split(" | |")[0]
        whole = analyze.reprocessed(c)
        cells = (f"| {s}, {card(s)} |", f"| {sum(w for _, w in whole)} of {sum(f for f, _ in whole)} |",
                 f"| {round(unreclaimable(c)):,} / {round(plan_now[n]['planned_held_mib']):,} |")
        assert all(x in row for x in cells), (n, row)
    assert [card(s) for s in (9, 5, 2, 8, 14, 6, 12, 7, 16)] == ["H200", "H100", "H100", "H200", "H100", "H100", "H100",
                                                                  "H100", "H100"]


def test_the_decision_s_figures(results):
    """The prompt tokens 4 checkpoints spared against none at each load (the medians' difference) and a V100's prefill
    of them; 8 against 4."""
    rows = {r["name"]: r for r in analyze.table(results)}
    spared4 = [rows[a]["processed"] - rows[b]["processed"] for a, b in (
        ("1x-ck0-cr0-heap", "1x-ck4-cr0-heap"), ("2x-ck0-cr0", "2x-ck4-cr0-ship"), (NONE, SHIP))]
    assert spared4 == [40119, 36815, 33242]
    assert [v100_s([d]) for d in spared4] == [(104, 111), (96, 101), (87, 92)]
    assert rows["1x-ck8-cr0-heap"]["processed"] == rows["1x-ck4-cr0-heap"]["processed"] == 23562
    assert rows["2x-ck8-cr0-heap"]["processed"] == rows["2x-ck4-cr0-ship"]["processed"] == 79423


def test_the_device_time_of_a_prebuilt_session(results):
    """Sessions 1-16's waits before the phase (this one's 33 s: no build); its starts and transfers from its phase."""
    assert DEVICE_USED51[16] == LEFT_AT_START - LEFT_AT_END == 1083 and 1800 - LEFT_AT_START == 181
    assert 16 not in CUT51
    waits, phases, starts, margin = device_time(results, 16)
    assert len(waits) == 16 and waits[16] == pre_phase_s(16) == 33
    assert (min(waits.values()), max(waits.values())) == (33, 459)
    assert phases[16] == 953 and starts[16] == 97 and sum(CALL_WALLS) < DEVICE_USED51[16]
    assert phases == {10: 143, 11: 693, 12: 982, 13: 951, 14: 923, 16: 953}
    assert starts == {10: 36, 11: 101, 12: 88, 13: 35, 14: 35, 15: 106, 16: 97}
    assert margin == 570


def test_the_docs_quote_these_records():
    assert_quoted("bench/RESULTS.md", (
        "The first ask got no machine (181 s of the session's 1,800 gone); the second, with 1,619 s left",
        "its `build.txt` names the same sha256 (de968deb…)",
        "the phase began 33 s after the second call's facts (the two model files), against 297-459 s in sessions 1-15",
        "whole in 953 s (estimated 943); the three calls took 1,083 s of device time: 33 s before the phase, 953 s of "
        "it and 97 s of starts and transfers",
        "generated the same tokens (10,095, 9,425 and 9,797)",
        "They processed 2,663, 6,541 and 1,734 more prompt tokens than shipped (209,154, 184,719 and 217,536 against "
        "206,491, 178,178 and 215,802)",
        "(105, 93 and 102, against shipped's 104, 86 and 101)",
        "differed by 243-8,059 prompt tokens a schedule (sessions 12 and 13), and this config's two runs of its first "
        "two schedules (sessions 15 and 16) by 1,241 and 3,617",
        "(session 5: the same 79,423 tokens as 4) and 1x (session 9: the same 23,562)",
        "They created 563, 507 and 534 checkpoints (restoring 25, 23 and 21), about shipped's 559, 509 and 532, at a "
        "median copy alone of 33.9 ms (1,535 copies in the log)",
        "a plan that holds 9,787 MiB more a server",
        "Follow-up TTFT p50 3,362, 3,135 and 3,995 ms against shipped's 2,006, 2,048 and 2,426, p99 8,249, 10,118 and "
        "15,244 against 7,138, 10,219 and 11,800; tok/s 36.95, 25.42 and 33.23 against 36.46, 26.31 and 33.60; walls "
        "273, 371 and 295 s against 277, 358 and 292",
        "The p50s are 1.53-1.68 times shipped's, inside the 1.41-3.12 times",
        "(4,143 and 2,401 ms in session 15 against 3,362 and 3,135 here)",
        "It held 20,152 MiB against peaks of 12,071, 12,075 and 13,142 MiB, 53.3 % above; the RSS peak (13,956 MiB) "
        "stayed under the planned total (21,682), MemoryMax (23,851)",
        "(`memory.events` `max` 1,085, 1,087 and 1,621) with no OOM kill",
        "less 4x without checkpoints' (559 MiB), is 84 of them",
        "above all 20 HEAP51 configs measured (0.2-53.3 %)",
        "4 spared 40,119, 36,815 and 33,242 prompt tokens (medians, 1x, 2x and 4x), 104-111, 96-101 and 87-92 s",
        "(the same tokens at 1x and 2x, 1,734-6,541 more at 4x, inside a run's spread) and plans 9,787 MiB more",
        "plans 29,408 MiB held a server against shipped's 10,366",
    ), after="### Session 16")
    assert_quoted("docs/host.md", (
        "its peaks held were 12,071, 12,075 and 13,142 MiB against the 20,152 planned, 53.3 % above",
        "the peak was about 84 of them",
        "the RSS peak (13,956 MiB) stayed under the planned total (21,682) and MemoryMax (23,851)",
        "above all 20 HEAP51 configs measured (0.2-53.3 %; `tests/unit/test_records51p.py` for session 16)",
    ))
    assert_quoted("bench/traffic/README.md", (
        "A phase took 297-459 s before its first config when the GPU machine built the binary (sessions 1-15: the "
        "build 224-357 s, Volta's choice and FORCE_MMQ 61-93 s) and 33 s with offbuild's (session 16)",
        "a session's calls spend 35-106 s more on starts and transfers (sessions 10-16)",
        "Session 16 (an H100) started from session 15's results with the prebuilt binary",
        "its three calls took 1,083 s of device time (181 s more went to an ask without a machine)",
        "The matrix is complete",
        "session 16's are `bench/records/offbuild51`, the binary its build.txt names",
        "After session 16 the checkout and the pack come to 26.2 + 39.6 MB of the 67.1 MB a call carries, 1.3 MB "
        "left, or 26.2 + 28.1 MB with `--prebuilt` (measured at session 16's commit)",
    ))
    assert_var_comment("group_vars/v100_32gb.yml", r"^server_ctx_checkpoints: 4 +# .*; 8 spared nothing 4 did not at 1x, "
                       r"2x or 4x \(sessions 9, 5 and 16: the same prompt tokens, 1,734-6,541 more at 4x\);")
