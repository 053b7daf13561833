"""Issue 51's third session (bench/records/proof51/session3, an H100, b11434 with Volta's kernel choice, FORCE_MMQ):
heap51, glibc's malloc kept to its heap (gpu_proof.HEAP51) beside its baselines in the same run. Item 3 again
(v100_32gb as shipped, the seed's stage-3 flags, the shipped argv with HEAP51) and 2x shipped again, with one
schedule of 3 of 2x with HEAP51 before the device's half hour ran out. Every figure bench/RESULTS.md quotes from
it, recomputed by bench.traffic.analyze from the raw results.json and the servers' whole logs (logs.tgz)."""
import statistics
from pathlib import Path

from bench.traffic import analyze
from tests.unit.records51 import call_fixtures

REPO = Path(__file__).resolve().parents[2]
CALL = REPO / "bench/records/proof51/session3/call2"
SEED = "thr-seed-again"  # the seed of this run: both sides of every ratio from one run


results, logs, rounds = call_fixtures(CALL, seed=SEED)


def by_name(results, name):
    return next(c for c in results["traffic51"] if c["name"] == name)


def test_the_session_built_b11434_with_volta_s_choice_on_an_h100(results, logs):
    facts = (CALL / "facts.txt").read_text()
    assert "NVIDIA H100 80GB HBM3" in facts and "580.159.04" in facts
    assert "build rc=0 seconds=231" in (CALL / "build.txt").read_text()
    assert "volta rc=0" in (CALL / "build-volta.txt").read_text() and "mmq rc=0" in (CALL / "build-mmq.txt").read_text()
    for name in ("thr-ship-again", "thr-ship-heap", "2x-ck4-cr0-again", "2x-ck4-cr0-heap"):
        assert "FORCE_MMQ = 1" in logs[f"load-mmq-{name}.log"]
        assert by_name(results, name)["build"] == "mmq"
    # the heap configs ran with HEAP51 and the rest without: the argv is the same
    heap = {n: by_name(results, n) for n in ("thr-ship-heap", "2x-ck4-cr0-heap")}
    assert all(c["env"] == {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"}
               for c in heap.values())
    assert heap["thr-ship-heap"]["args"] == by_name(results, "thr-ship-again")["args"]
    assert heap["2x-ck4-cr0-heap"]["args"] == by_name(results, "2x-ck4-cr0-again")["args"]
    assert not by_name(results, "thr-ship-again").get("env") and not by_name(results, "2x-ck4-cr0-again").get("env")


def test_item_3_with_heap51_against_the_seed_of_the_same_run(rounds):
    got = {n: {s: (f["median"], f["x_seed"]) for s, f in shapes.items()}
           for n, shapes in rounds.items() if n in ("thr-ship-again", SEED, "thr-ship-heap")}
    assert got == {"thr-ship-again": {"128/128": (312.4, 2.27), "160/256": (365.6, 2.3)},
                   SEED: {"128/128": (137.8, 1.0), "160/256": (158.9, 1.0)},
                   "thr-ship-heap": {"128/128": (355.0, 2.58), "160/256": (395.4, 2.49)}}
    for n in got:
        assert all(len(f["tps"]) == 3 for f in rounds[n].values())  # median of 3
    assert rounds["thr-ship-heap"]["128/128"]["tps"] == [317.0, 356.4, 355.0]  # the median, not the best rep


def test_the_decode_steps_bound_the_ratio_below_3(results, rounds):
    steps = {n: {s: round(f["step_median"], 1) for s, f in rounds[n].items()}
             for n in ("thr-ship-again", SEED, "thr-ship-heap")}
    assert steps == {"thr-ship-again": {"128/128": 33.6, "160/256": 34.2}, SEED: {"128/128": 20.0, "160/256": 20.3},
                     "thr-ship-heap": {"128/128": 33.7, "160/256": 34.0}}
    assert analyze.decode_ceiling(results, "thr-ship-heap", seed=SEED) == {"128/128": 2.38, "160/256": 2.39}


def test_heap51_cuts_a_checkpoint_copy_to_a_third(results, logs):
    """The same argv makes the same checkpoints (one a fresh prompt, 16-17 a round); with HEAP51 each copy seen
    alone in the whole log takes 26.5 ms instead of 76.0 (medians of 99 and 100)."""
    ship, heap = (analyze.work(by_name(results, n), logs) for n in ("thr-ship-again", "thr-ship-heap"))
    assert [r["created"] for r in ship["per_rep"]] == [16, 17, 16, 17, 16, 17]
    assert [r["created"] for r in heap["per_rep"]] == [16, 17, 16, 17, 16, 16]
    assert (ship["copies_alone"], round(ship["copy_ms_median"], 1)) == (100, 76.0)
    assert (heap["copies_alone"], round(heap["copy_ms_median"], 1)) == (99, 26.5)
    ttft = {n: [round(statistics.median(statistics.median(r["ttft_ms"] for r in rep["recs"])
                                        for rep in by_name(results, n)["reps"] if rep["tokens"] == t) / 1e3, 2)
                for t in (128, 256)] for n in ("thr-ship-again", "thr-ship-heap", SEED)}
    assert ttft == {"thr-ship-again": [2.29, 2.44], "thr-ship-heap": [1.48, 1.68], SEED: [6.77, 10.98]}


def test_heap51_host_memory_under_its_plan_and_its_ceiling(results):
    """Resident peaks during the rounds under the plan, the server alive at the end, the cgroup never OOM. At load
    VmHWM is higher with HEAP51 (15,206 MiB against 13,025), and as high for the seed without it: VmHWM counts the
    model file's mapped pages, which the kernel reclaimed during the baseline's load (its cgroup held the file's
    pages and met memory.max) and not during the heap run's (the pages were cached, charged elsewhere)."""
    for name in ("thr-ship-again", "thr-ship-heap"):
        c = by_name(results, name)
        rss = max(r["peak"]["VmRSS"] for r in c["reps"])
        assert rss < c["planned_mib"] < c["memory_max_mib"] and c["alive_at_end"] is True
        assert c["cgroup_end"]["cg_events"]["oom"] == 0 and c["cgroup_end"]["cg_events"]["oom_kill"] == 0
    ship, heap = by_name(results, "thr-ship-again"), by_name(results, "thr-ship-heap")
    assert [round(max(r["peak"]["VmRSS"] for r in c["reps"])) for c in (ship, heap)] == [3724, 4761]
    assert [round(c["mem_load"]["VmHWM"]) for c in (ship, heap)] == [13025, 15206]
    assert heap["cgroup_end"]["cg_peak"] < heap["memory_max_mib"] == 12875
    seed = by_name(results, SEED)
    assert round(seed["mem_load"]["VmHWM"]) == 15208 and not seed.get("env")  # no HEAP51, no cgroup: as high
    model_mib = 15583524384 / 2**20  # the shape-exact file (progress.txt)
    assert "15583524384 bytes" in (CALL / "progress.txt").read_text()
    assert heap["mem_load"]["VmHWM"] - model_mib < 400  # the whole file mapped, plus the server's own memory
    load = {n: by_name(results, n)["cgroup_load"] for n in ("thr-ship-again", "thr-ship-heap")}
    assert round(load["thr-ship-again"]["cg_file"]) == 12460 and load["thr-ship-again"]["cg_events"]["max"] == 10070
    assert load["thr-ship-heap"]["cg_file"] == 0 and load["thr-ship-heap"]["cg_events"]["max"] == 0
    assert [round(by_name(results, n)["mem_load"]["RssAnon"]) for n in ("thr-ship-again", "thr-ship-heap")] == [275, 276]


def test_2x_shipped_again_whole_and_its_heap_schedule(results, logs):
    rows = {r["name"]: r for r in analyze.table(results)}
    again = rows["2x-ck4-cr0-again"]
    assert again["complete"] and again["reps"] == 3
    assert (again["followup_cached_share"], round(again["followup_ttft_p50_ms"]), round(again["followup_ttft_p99_ms"]),
            round(again["opening_ttft_p50_ms"]), round(again["aggregate_tps"], 1), round(again["processed"])) == \
        (0.3773, 1758, 5642, 1688, 39.0, 84406)
    assert round(again["rss_peak_mib"]) == 10663 < round(again["planned_mib"]) == 11704
    # the same three schedules as session 1's 2x-ck4-cr0: the same tokens generated
    pairs = analyze.paired(results, "2x-ck4-cr0", "2x-ck4-cr0-again", "generated")
    assert len(pairs) == 3 and all(a == b for _, a, b in pairs)
    # HEAP51 got its first schedule (partial: it runs again from its start); paired with the same run's
    heap = rows["2x-ck4-cr0-heap"]
    assert not heap["complete"] and heap["reps"] == 1
    fields = {f: analyze.paired(results, "2x-ck4-cr0-again", "2x-ck4-cr0-heap", f)
              for f in ("generated", "processed", "wall_s")}
    assert [(a, b) for f in fields.values() for _, a, b in f] == [(4712, 4712), (83227, 81874), (120.78, 111.78)]
    first = by_name(results, "2x-ck4-cr0-again")["reps"][0]["summary"], by_name(results, "2x-ck4-cr0-heap")["reps"][0]["summary"]
    assert [(round(s["followup_ttft_p50_ms"]), round(s["aggregate_tps"], 1)) for s in first] == [(1721, 39.0), (1175, 42.1)]
    assert round(heap["rss_peak_mib"]) == 10650 < round(heap["planned_mib"]) == 11704
    w = {n: analyze.work(by_name(results, n), logs) for n in ("2x-ck4-cr0-again", "2x-ck4-cr0-heap")}
    assert [r["created"] for r in w["2x-ck4-cr0-again"]["per_rep"]] == [276, 249, 277]
    assert [r["created"] for r in w["2x-ck4-cr0-heap"]["per_rep"]] == [276]  # its log, though its record is partial
    assert [(x["copies_alone"], round(x["copy_ms_median"], 1)) for x in w.values()] == [(737, 75.9), (280, 27.1)]


def test_what_a_v100_trades_with_heap51_copies(results, logs):
    """Session 2's trade (schedule 1: 29,243 prompt tokens spared by 4 checkpoints, 76-81 s of V100 prefill) against
    98 requests x 2-3 copies: 16-24 s at 82.2 ms a copy, 5-8 s at this run's 27.1 ms with HEAP51."""
    copy_s = analyze.work(by_name(results, "2x-ck4-cr0-heap"), logs)["copy_ms_median"] / 1e3
    n = by_name(results, "2x-ck4-cr0-heap")["reps"][0]["summary"]["requests"]
    assert n == 98 and [round(n * k * copy_s, 1) for k in (2, 3)] == [5.3, 8.0]
    spared = [b - a for _, a, b in analyze.paired(results, "2x-ck4-cr0", "2x-ck0-cr0", "processed")]
    assert spared[0] == 29243 and [round(s) for s in analyze.v100_prefill_s(spared[0])] == [76, 81]


def test_session_4_resumes_where_session_3_stopped(results):
    """The next session starts with 2x-ck4-cr0-heap from its start beside a third 2x baseline (heap51b), then
    51b's rest (the 8 GiB cache without its idle-slot saves), then session 5's configs with HEAP51 (heap51d)."""
    from bench.gpu import gpu_proof
    from bench.gpu.proof.traffic import done

    todo = [c["name"] for c in gpu_proof.plan51()["traffic51"]["configs"] if not done(results["traffic51"], c)]
    assert todo[:5] == ["2x-ck4-cr0-heap", "2x-ck4-cr0-base4", "2x-ck4-cr8-noidle", "2x-ck4-cr0-ship",
                        "2x-ck4-cr8-noidle-heap"]
    assert not {"thr-ship-again", "thr-seed-again", "thr-ship-heap", "2x-ck4-cr0-again"} & set(todo)
