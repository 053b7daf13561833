"""Issue 38 on the H200 (bench/records/proof38/run1): llama-server's host memory while 16 chats fill
their slots' context checkpoints, v100_32gb's argv on the shipped build (FORCE_MMQ), recomputed from
the raw progress log the run printed (every turn's VmRSS, each repetition's peak and the checkpoints
its log shows) against voltafleet.planning.hostmem's plan for the same argv."""
import json
import statistics
import re
from pathlib import Path

import pytest

from bench.gpu.gpu_proof import FILL38, plan38, v32_cfg
from bench.gpu.groups import group_cfg
from voltafleet.planning import hostmem, vram
from voltafleet.models.gguf_header import from_json

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "bench/records/proof38/run1"
TURN = re.compile(r"host38 (\S+) (\d+) (\d+) ([\d.]+) (\d+) (\d+)$")
PEAK = re.compile(r"host38 (\S+) (\d+) peak ([\d.]+) held (\d+) \[([\d.]+)\]$")
SLOTS, N = 16, 32


def progress() -> tuple[dict, dict]:
    """{(config, rep): [RSS MiB after each turn]}, {(config, rep): (peak MiB, checkpoints held, MiB each)}."""
    turns, peaks = {}, {}
    for line in (RUN / "progress.txt").read_text().splitlines():
        if m := TURN.search(line):
            rss = turns.setdefault((m.group(1), int(m.group(2))), [])
            assert int(m.group(3)) == len(rss) and m.group(6) == "0"  # turns in order, no request failed
            rss.append(int(m.group(5)))
        elif m := PEAK.search(line):
            peaks[(m.group(1), int(m.group(2)))] = (float(m.group(3)), int(m.group(4)), float(m.group(5)))
    return turns, peaks


def planned(slots: int = SLOTS, **over) -> hostmem.Instance:
    header = from_json(json.loads((REPO / "tests/fixtures/gguf/qwen35-27b-q4ks.json").read_text()))
    cfg = v32_cfg(slots, **{"voltafleet_backend": "cuda", "server_ctx_checkpoints": N, **over})  # as it ran
    return hostmem.plan(cfg, vram.ModelShape.from_header(header), 1).instance


def resident(inst: hostmem.Instance, held: int) -> float:
    """The plan's part of VmRSS at `held` checkpoints, MiB: its anonymous terms and the program's file pages
    (VmRSS counts neither the page tables nor the kernel's memory, and only the token_embd rows the words
    touched)."""
    return (inst.process + inst.host_buffers + inst.cache_ram + inst.program) / 2**20 + held * inst.checkpoint_bytes / 2**20


def held(turn: int) -> int:
    """Checkpoints the 16 slots hold after `turn` (from 0): the first turn's prompt makes one a slot (at
    its end), each follow-up two (its user message's start, its end); at N a slot llama.cpp evicts
    before it adds (with the default --checkpoint-min-step, down to N - 2), so a full slot holds N - 1."""
    return SLOTS * min(1 + 2 * turn, N - 1)


def test_the_run_is_the_fill_config_of_plan38_on_v100_32gb_argv():
    item = next(c for c in plan38()["host38"]["configs"] if c["name"] == "fill-np16-ck32")
    assert item["slots"] == SLOTS and item["ckpt"] == N and item["turns"] == FILL38["turns"] == 17
    argv = (RUN / "argv.txt").read_text()
    assert " ".join(item["args"]) in argv  # the argv the run served, as plan38 renders it today


def test_every_turn_adds_two_checkpoints_a_slot_of_the_logged_size_until_the_slots_are_full():
    turns, peaks = progress()
    rss = turns[("fill-np16-ck32", 0)]
    peak, n, size = peaks[("fill-np16-ck32", 0)]
    assert len(rss) == 17 and n == held(16) == SLOTS * (N - 1) and peak == pytest.approx(max(rss), abs=1)
    assert size == pytest.approx(planned().checkpoint_bytes / 2**20, abs=0.001)  # 149.626 logged, 149.627 planned
    for t in range(1, 16):  # 32 new checkpoints a turn, each one of the logged size
        assert rss[t] - rss[t - 1] == pytest.approx((held(t) - held(t - 1)) * size, abs=2), t
    assert rss[16] - rss[15] == pytest.approx(0, abs=2)  # full: one evicted for each created


def test_the_plan_holds_every_measured_turn_and_is_within_5_percent_of_the_worst_case():
    turns, peaks = progress()
    inst = planned()
    plan_mib = inst.total / 2**20
    measured = [v for rss in turns.values() for v in rss] + [p for p, _, _ in peaks.values()]
    assert len(turns) == 2 and len(measured) == 17 + 15 + 1  # repetition 1 was cut at turn 14 (the device time)
    worst = max(measured)
    assert worst <= plan_mib and (plan_mib - worst) / worst < 0.05, (plan_mib, worst)
    # at every turn, the plan's resident part at the checkpoints then held covers VmRSS (never under), within
    # 60 MiB; the plan's total adds the 682 MiB token_embd whose pages real text maps row by row (these chats'
    # few words map a few), the page tables and the kernel's memory
    for (name, rep), rss in turns.items():
        for t, v in enumerate(rss):
            at = resident(inst, held(t))
            assert 0 <= at - v < 60, (rep, t, at, v)


def test_the_process_figure_of_group_vars_is_the_largest_base_measured():
    """What is left of VmRSS once the checkpoints held are taken away is the process's base with its host
    buffers, the program's file pages (and the few token_embd pages the workload's words touched): the plan's
    process (hostmem_process_mib and hostmem_slot_mib, fitted on proof49 run3 and run4, not on this run) with the
    host buffers and hostmem_program_mib covers it."""
    turns, _ = progress()
    inst = planned()
    size = inst.checkpoint_bytes / 2**20
    base = [v - held(t) * size for rss in turns.values() for t, v in enumerate(rss)]
    process = inst.process / 2**20
    assert 1300 < max(base) < 1400 and max(base) - min(base) < 20  # flat over 31 turns: the checkpoints are the growth
    assert 0 <= process + (inst.host_buffers + inst.program) / 2**20 - max(base) < 60


# ------------------------------------------------------------ real chats on the lab's CPU server
LAB = REPO / "bench/records/proof38/lab-cpu"


def test_real_chat_follow_ups_resume_from_a_checkpoint_at_any_count_and_from_none_without():
    """The same host38 phase on the lab's llama-server (CPU, the tiny qwen35 with the pinned Qwen3.5/3.6
    chat template, 4 slots, 6 turns of 400-word questions, 3 repetitions): the history goes back without
    the thinking, so every follow-up leaves the cached sequence where the last answer began. With no
    checkpoint the whole conversation is reprocessed; with 2 or more the server resumes from the one at
    the end of the last prompt, and the share it finds cached is the same at 2, 4, 8 and 32 (and with no
    minimum spacing): the count bounds the memory, not the reuse. Tokens are the model's vocabulary's, so
    the shares hold for the 27B; its times do not (a CPU and a 12 MB model)."""
    from bench.gpu.gpu_proof import host38_table

    rows = {r["name"]: r for r in host38_table(json.loads((LAB / "results.json").read_text()))}
    assert set(rows) == {"chat-np4-ck0", "chat-np4-ck2", "chat-np4-ck4", "chat-np4-ck8", "chat-np4-ck32",
                         "chat-np4-ck4-cms0"}
    assert all(r["reps"] == 3 and r["errors"] == 0 for r in rows.values())
    assert rows["chat-np4-ck0"]["cached_share"] == 0 and rows["chat-np4-ck0"]["held"] == 0
    shares = {n: r["cached_share"] for n, r in rows.items() if n != "chat-np4-ck0"}
    assert min(shares.values()) > 0.8 and max(shares.values()) - min(shares.values()) < 0.01, shares
    for r in rows.values():  # never more than the count a slot (a full slot holds N - 1 with the default spacing)
        assert r["held"] <= r["slots"] * r["ckpt"], r


# ------------------------------------------------ run 2: every config, 3 repetitions (bench/records/proof38/run2)
RUN2 = REPO / "bench/records/proof38/run2"


def run2() -> list[dict]:
    return json.loads((RUN2 / "results.json").read_text())["host38"]


def plan_of(r: dict) -> hostmem.Instance:
    return planned(r["slots"], server_ctx_checkpoints=r["ckpt"])


def test_run2_served_plan38s_configs_as_rendered_today_three_repetitions_each_without_an_error():
    configs = {c["name"]: c for c in plan38()["host38"]["configs"]}
    runs = run2()
    assert [r["name"] for r in runs] == list(configs)
    for r in runs:
        assert r["args"][2:] == configs[r["name"]]["args"][2:] and r["healthy"], r["name"]  # [0:2] is -m and the device's path
        assert len(r["reps"]) == 3, r["name"]
        assert all("error" not in q for rep in r["reps"] for t in rep["turns"] for q in t["recs"]), r["name"]
        assert " ".join(r["args"]) in (RUN2 / "argv.txt").read_text()


def test_run2_the_plan_covers_every_repetitions_peak_and_is_within_5_percent_at_the_worst_case():
    """At every config and repetition the plan, at the checkpoints its log held, is never under the
    peak VmRSS (and above it by no more than the model term and 2 %); the fullest config (16 slots x 32, 496 of
    512 held) is within 5 % of the full plan."""
    worst = None
    for r in run2():
        inst = plan_of(r)
        for rep in r["reps"]:
            peak, held = rep["peak"]["VmRSS"], rep["ckpt"]["held"]
            assert held <= r["slots"] * max(r["ckpt"], 0) and set(rep["ckpt"]["size_mib"]) <= {149.626}
            # the log's count is the one at the end; a repetition may have held one more at its peak (chat-np16-ck32
            # rep 1 ends at 129 with the others' 130 and their VmRSS): the most the config's repetitions held
            at = resident(inst, max(x["ckpt"]["held"] for x in r["reps"]))
            # never under; above by at most 2 % (the plan's total adds token_embd's mapped rows, few touched here)
            assert 0 <= at - peak <= 0.02 * peak, (r["name"], rep["rep"], at, peak)
            if worst is None or peak > worst[0]:
                worst = (peak, inst.total / 2**20, r["name"])
    peak, plan_mib, name = worst
    assert name == "fill-np16-ck32" and 0 <= plan_mib - peak < 0.05 * peak, worst


def test_run2_follow_ups_resume_with_any_checkpoint_count_and_recompute_without():
    from bench.gpu.gpu_proof import host38_table

    rows = {r["name"]: r for r in host38_table({"host38": run2()})}
    assert rows["chat-np16-ck0"]["cached_share"] == 0 and rows["chat-np16-ck0"]["held"] == 0
    shares = [rows[f"chat-np16-ck{n}"]["cached_share"] for n in (4, 8, 32)] + [rows["chat-np16-ck4-cms0"]["cached_share"]]
    assert min(shares) > 0.85 and max(shares) - min(shares) < 0.01, shares
    # without checkpoints every turn reprocesses the whole history, so each turn's TTFT grows with it
    by_turn = [statistics.median(statistics.median(q["ttft_ms"] for q in rep["turns"][t]["recs"])
                                 for rep in next(r for r in run2() if r["name"] == "chat-np16-ck0")["reps"])
               for t in range(4)]
    assert by_turn == sorted(by_turn) and by_turn[3] - by_turn[0] > 1000, by_turn


def test_run2_the_shipped_count_is_the_one_that_resumes_for_the_least_memory_and_keeps_throughput():
    """The decision in group_vars/v100_32gb.yml, recomputed: among the counts that resume a follow-up
    (4, 8, 32) 4 holds the least host memory, its throughput is the best measured (at or above 0's) and
    its follow-up TTFT within 10 % of the best with checkpoints; no minimum spacing (-cms 0) is slower."""
    from bench.gpu.gpu_proof import host38_table

    shipped = group_cfg("v100_32gb").server.ctx_checkpoints
    rows = {r["ckpt"]: r for r in host38_table({"host38": run2()}) if r["kind"] == "chat" and r["cms"] is None}
    assert shipped == 4 and set(rows) == {0, 4, 8, 32}
    resume = {n: r for n, r in rows.items() if n}
    assert min(resume, key=lambda n: resume[n]["peak_rss_mib"]) == shipped
    assert rows[shipped]["tps"] == max(r["tps"] for r in rows.values())
    assert rows[shipped]["ttft_followup_ms"] <= 1.1 * min(r["ttft_followup_ms"] for r in resume.values())
    cms0 = next(r for r in host38_table({"host38": run2()}) if r["cms"] == 0)
    assert cms0["ttft_followup_ms"] > rows[shipped]["ttft_followup_ms"] and cms0["tps"] < rows[shipped]["tps"]


def test_run2_table_in_results_md_is_the_records():
    from bench.gpu.gpu_proof import host38_report

    assert host38_report({"host38": run2()}) in (REPO / "bench/RESULTS.md").read_text()
