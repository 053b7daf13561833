"""Issue 51's first traffic run (bench/records/proof51/session1, an H100, b11434 with Volta's kernel choice):
every figure bench/RESULTS.md and bench/traffic/README.md quote from it, recomputed by bench.traffic.analyze
from the raw results.json; and the parser's rules on the server's own log lines."""
import json
import statistics
from pathlib import Path

import pytest

from bench.traffic import analyze

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "bench/records/proof51/session1/call3/results.json"  # held by a later call's results (analyze.raw)


@pytest.fixture(scope="module")
def results():
    return analyze.load(str(RUN))


@pytest.fixture(scope="module")
def rows(results):
    return {r["name"]: r for r in analyze.table(results)}


def test_the_run_built_b11434_with_volta_s_choice_on_an_h100():
    facts = (RUN.parent / "facts.txt").read_text()
    assert "NVIDIA H100 80GB HBM3" in facts and "580.159.04" in facts
    assert "FORCE_MMQ = 1" in analyze.load(str(RUN))["traffic51"][0]["log"][0]
    assert (RUN.parent / "build-volta.txt").read_text().count("rc=0") >= 1


def test_the_table(rows):
    ship, cache, ck0 = rows["2x-ck4-cr0"], rows["2x-ck4-cr8"], rows["2x-ck0-cr0"]
    assert ship["complete"] and ship["reps"] == 3 and cache["complete"] and cache["reps"] == 3
    assert not ck0["complete"] and ck0["reps"] == 1  # the device's half hour ran out
    got = {n: (round(r["followup_cached_share"], 2), round(r["followup_ttft_p50_ms"]), round(r["followup_ttft_p99_ms"]),
               round(r["opening_ttft_p50_ms"]), round(r["aggregate_tps"], 1), round(r["processed"]))
           for n, r in rows.items()}
    assert got == {"2x-ck4-cr0": (0.33, 2746, 7484, 1866, 36.0, 86995),
                   "2x-ck4-cr8": (0.57, 8288, 39638, 36332, 21.4, 63693),
                   "2x-ck0-cr0": (0.0, 984, 5079, 961, 43.1, 116241)}


def test_every_schedule_generated_the_same_tokens_whatever_the_flags(results):
    for field in ("generated", "requests"):
        for a, b in (("2x-ck4-cr0", "2x-ck4-cr8"), ("2x-ck4-cr0", "2x-ck0-cr0")):
            pairs = analyze.paired(results, a, b, field)
            assert pairs and all(x == y for _, x, y in pairs)


def test_host_memory_stayed_under_every_plan(rows):
    for r in rows.values():
        assert r["rss_peak_mib"] < r["planned_mib"] < r["memory_max_mib"] and r["cgroup_peak_mib"] < r["planned_mib"]
        assert r["alive_at_end"] in (True, None)  # None: the partial config's record ended with the session
    assert [round(rows[n]["rss_peak_mib"]) for n in ("2x-ck4-cr0", "2x-ck4-cr8", "2x-ck0-cr0")] == [10798, 18989, 1360]
    assert [round(rows[n]["planned_mib"]) for n in ("2x-ck4-cr0", "2x-ck4-cr8", "2x-ck0-cr0")] == [11704, 19912, 2109]


def test_a_checkpoint_copy_holds_the_server_about_114_ms(results):
    gaps = [g for c in results["traffic51"] for g in analyze.checkpoint_copy_ms(c.get("log") or [])]
    assert len(gaps) == 13 and round(statistics.median(gaps), 1) == 113.6 and (min(gaps), max(gaps)) == (103.0, 125.4)
    sizes = {line.rsplit("size = ", 1)[1] for c in results["traffic51"] for line in c.get("log") or [] if "created context" in line}
    assert sizes == {"149.626 MiB)"}


def test_what_the_v100_would_save(results):
    """Per schedule, the prompt tokens checkpoints and the host cache spared, in a V100's seconds."""
    (ck0,) = analyze.paired(results, "2x-ck4-cr0", "2x-ck0-cr0", "processed")
    spared = ck0[2] - ck0[1]
    assert spared == 29246 and [round(s) for s in analyze.v100_prefill_s(spared)] == [76, 81]
    cache = sorted(b - a for _, b, a in analyze.paired(results, "2x-ck4-cr0", "2x-ck4-cr8", "processed"))
    assert cache == [15252, 23302, 35962] and [round(s) for s in analyze.v100_prefill_s(cache[1])] == [61, 64]
    walls = sorted(round(b - a) for _, a, b in analyze.paired(results, "2x-ck4-cr0", "2x-ck4-cr8", "wall_s"))
    assert walls == [55, 87, 115]  # what the host cache added to the H100's replays
    # the copies 4 checkpoints cost on that schedule: its requests x 2-3 copies x the median copy
    (req,) = analyze.paired(results, "2x-ck4-cr0", "2x-ck0-cr0", "requests")
    copy_s = statistics.median(g for c in results["traffic51"] for g in analyze.checkpoint_copy_ms(c.get("log") or [])) / 1e3
    assert req[1] == 98 and [round(req[1] * n * copy_s) for n in (2, 3)] == [22, 33]


def test_parser_rules():
    lines = ["0.01.000.000 I slot create_check: id  1 | task 7 | created context checkpoint 1 of 4 (pos_min = 5, "
             "pos_max = 5, n_tokens = 6, size = 149.626 MiB)",
             "0.01.110.000 I slot create_check: id  2 | task 8 | created context checkpoint 1 of 4 (pos_min = 5, "
             "pos_max = 5, n_tokens = 6, size = 149.626 MiB)",
             "0.01.220.000 I slot create_check: id  2 | task 8 | created context checkpoint 2 of 4 (pos_min = 9, "
             "pos_max = 9, n_tokens = 10, size = 149.626 MiB)",  # the same slot: a decode came between
             "0.01.900.000 I slot create_check: id  3 | task 9 | created context checkpoint 1 of 4 (pos_min = 5, "
             "pos_max = 5, n_tokens = 6, size = 149.626 MiB)",  # 680 ms later: not a copy alone
             "0.02.000.000 I slot   operator(): id  3 | task 9 | restored context checkpoint (pos_min = 5)",
             "0.02.100.000 I srv   prompt_save:  - saving prompt with length 682, total state size = 172.287 MiB "
             "(draft: 0.000 MiB)",
             "0.02.200.000 I srv  get_availabl: prompt cache update took 35.20 ms"]
    assert analyze.checkpoint_copy_ms(lines) == [110.0]
    # a whole log: the slot's own fill comes just before its checkpoint (memory_seq_rm, its sampler, superseding)
    own = ["0.05.000.000 I slot   operator(): id  0 | task 18 | cached n_tokens = 50, memory_seq_rm [50, end)",
           "0.05.000.100 I slot init_sampler: id  0 | task 18 | init sampler, took 0.01 ms, tokens: text = 54",
           "0.05.058.100 I slot create_check: id  0 | task 18 | created context checkpoint 1 of 4 (size = 149.626 MiB)",
           "0.05.058.200 I slot create_check: id  1 | task 19 | superseding context checkpoint at n_tokens = 49",
           "0.05.170.200 I slot create_check: id  1 | task 19 | created context checkpoint 2 of 4 (size = 149.626 MiB)",
           "0.05.171.000 I slot   operator(): id  2 | task 20 | cached n_tokens = 9, memory_seq_rm [9, end)",
           "0.05.230.000 I slot create_check: id  3 | task 21 | created context checkpoint 1 of 4 (size = 149.626 MiB)"]
    assert analyze.checkpoint_copy_ms(own) == [58.0, 112.0]  # the last: another slot's fill, not its own
    assert analyze.server_counts(lines) == {"created": 4, "created_mib": 598.5, "restored": 1, "save_attempts": 1,
                                            "cache_updates": 1, "cache_update_ms": 35.2}
    text = "\n".join(lines) + "\n"
    cut = len((lines[0] + "\n").encode())
    assert analyze.rep_lines(text, [cut, len(text.encode())]) == lines[1:]
    assert analyze.stamp("1.02.003.004 x") == pytest.approx(62.003004) and analyze.stamp("no stamp") is None


def test_a_resumed_session_s_complete_record_stands_for_the_partial_one(results):
    again = json.loads(json.dumps(results))
    partial = next(c for c in again["traffic51"] if c["name"] == "2x-ck0-cr0")
    whole = {**json.loads(json.dumps(partial)), "complete": True, "reps": partial["reps"] * 3}
    again["traffic51"].append(whole)
    names = [c["name"] for c in analyze.configs(again)]
    assert names == ["2x-ck4-cr0", "2x-ck4-cr8", "2x-ck0-cr0"]
    assert {r["name"]: r["reps"] for r in analyze.table(again)}["2x-ck0-cr0"] == 3
    again["traffic51"].append({**partial, "reps": partial["reps"][:1]})  # a later partial one does not replace it
    assert {r["name"]: r["complete"] for r in analyze.table(again)}["2x-ck0-cr0"] is True


def test_session_2_resumes_where_session_1_stopped(results):
    """The plan the next session packs skips what session 1 completed (same names and argv) and runs the
    item 3 first, then the partial 2x-ck0-cr0 again from its start."""
    from bench.gpu import gpu_proof
    from bench.gpu.proof.traffic import done

    todo = [c["name"] for c in gpu_proof.plan51()["traffic51"]["configs"] if not done(results["traffic51"], c)]
    assert todo[:4] == ["thr-ship", "thr-seed", "thr-ship-ck0", "2x-ck0-cr0"]
    assert "2x-ck4-cr0" not in todo and "2x-ck4-cr8" not in todo


def test_work_reads_each_repetition_s_span_of_the_whole_log(tmp_path):
    """The next sessions' records: a config's log_file in logs.tgz and each repetition's log_span."""
    import io
    import tarfile

    def ck(t, slot, task):
        return (f"0.{t} I slot create_check: id {slot:2d} | task {task} | created context checkpoint 1 of 4 "
                f"(pos_min = 5, pos_max = 5, n_tokens = 6, size = 149.626 MiB)")
    rep0 = [ck("01.000.000", 1, 1), ck("01.115.000", 2, 2), "0.01.300.000 I srv  x: prompt cache update took 40.00 ms"]
    rep1 = [ck("03.000.000", 1, 3), "0.03.100.000 I slot   operator(): id  1 | task 3 | restored context checkpoint (x)"]
    head = "0.00.000.000 I load\n"
    text = head + "\n".join(rep0) + "\n" + "\n".join(rep1) + "\n"
    a = len(head.encode())
    b = a + len(("\n".join(rep0) + "\n").encode())
    tgz = tmp_path / "logs.tgz"
    with tarfile.open(tgz, "w:gz") as t:
        data = text.encode()
        info = tarfile.TarInfo("load-mmq-x.log")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    logs = analyze.logs_of(str(tgz))
    config = {"name": "x", "log_file": "load-mmq-x.log", "reps": [{"log_span": [a, b]}, {"log_span": [b, len(data)]}]}
    w = analyze.work(config, logs)
    assert [r["created"] for r in w["per_rep"]] == [2, 1] and [r["restored"] for r in w["per_rep"]] == [0, 1]
    assert w["per_rep"][0]["cache_update_ms"] == 40.0 and w["copies_alone"] == 1 and w["copy_ms_median"] == 115.0
    assert analyze.work({**config, "log_file": "load-mmq-y.log"}, logs) is None  # its log did not come back
    assert analyze.work({**config, "reps": [{"log_span": None}]}, logs) is None  # session 1's records: no spans


def test_group_vars_quote_these_records(rows, results):
    """v100_32gb's checkpoint comment quotes session 1: the shipped config's cached share, and what the
    V100 reading of it gives (test_what_the_v100_would_save)."""
    text = (REPO / "group_vars/v100_32gb.yml").read_text()
    line = next(x for x in text.splitlines() if x.startswith("server_ctx_checkpoints:"))
    (ck0,) = analyze.paired(results, "2x-ck4-cr0", "2x-ck0-cr0", "processed")
    lo, hi = (round(s) for s in analyze.v100_prefill_s(ck0[2] - ck0[1]))
    assert f"follow-ups {rows['2x-ck4-cr0']['followup_cached_share']:.2f} cached vs 0 without" in line
    assert f"sparing a V100 {lo}-{hi} s of prefill a replay for 22-33 s of 149.6 MiB copies" in line
    assert rows["2x-ck0-cr0"]["followup_cached_share"] == 0


def test_item_3_rounds_median_of_3_and_the_ratio_to_the_seed():
    def rec(t0, n, step):  # one request: started at t0, n tokens, a token every `step` ms from its first
        return {"t_start": t0, "times_ms": [100 + step * i for i in range(n)]}

    def config(name, step, complete=True):
        reps = [{"rep": r, "prompt": p, "tokens": n, "recs": [rec(1000.0, n, step * (1 + r / 10)) for _ in range(16)]}
                for r in range(3) for p, n in ((128, 128), (160, 256))]
        return {"name": name, "kind": "rounds", "complete": complete, "reps": reps}

    results = {"traffic51": [config("thr-ship", 50), config("thr-seed", 150), config("thr-ship-ck0", 40, False)]}
    got = analyze.rounds(results)
    assert set(got) == {"thr-ship", "thr-seed"}  # a partial config is not a figure
    ship = got["thr-ship"]["128/128"]
    # rep r: 16 x 128 tokens over 0.1 + 127 x 50 x (1 + r/10) ms; the median is rep 1's
    assert ship["tps"][1] == round(16 * 128 / (0.1 + 127 * 0.055), 1) == ship["median"]
    assert got["thr-seed"]["160/256"]["x_seed"] == 1.0
    assert got["thr-ship"]["128/128"]["x_seed"] == round(ship["median"] / got["thr-seed"]["128/128"]["median"], 2)
