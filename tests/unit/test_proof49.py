"""Issue 49 item 3 on the H200 (bench/records/proof49/run3): a run the host-memory constants were not
fitted on (hostmem_process_mib and the host buffers: proof38 run1 and run2), each llama-server in a
cgroup v2 of its own whose memory.max is its unit's MemoryMax, recomputed from the raw record against
voltafleet.planning.hostmem's plan for the same argv. What the run shows, and what it does not: the
per-slot part of the process grows faster than the plan's host buffers (the next fit, to be validated on
a run after it)."""
import json
from pathlib import Path

from bench.gpu.gpu_proof import host49_table, host_plan, plan49

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "bench/records/proof49/run3"


def table() -> dict:
    return {r["name"]: r for r in host49_table(json.loads((RUN / "results.json").read_text()))}


def test_every_config_served_the_argv_plan49_renders_under_the_ceiling_its_unit_would_get():
    results = json.loads((RUN / "results.json").read_text())
    planned = {c["name"]: c for c in plan49()["host49"]["configs"]}
    for r in results["host49"]:
        want = [a.replace("MODEL", "/tmp/models/q4ks.gguf") for a in planned[r["name"]]["args"]]
        assert r["args"] == want and r["healthy"], r["name"]
        assert r["memory_max_mib"] == planned[r["name"]]["memory_max_mib"] and r["cgroup_error"] is None


def test_the_worst_case_is_planned_within_5_percent_never_under_rss_or_the_cgroup():
    w = table()["fill-np16-ck32"]
    assert w["reps"] == 3 and w["held"] == 496 and w["errors"] == 0  # a full slot holds 31 of 32 (test_proof38)
    assert 0.95 <= w["rss_over_plan_max"] <= 1.0 and 0.95 <= w["unreclaimable_over_plan_max"] <= 1.0
    assert round(w["rss_mib"]) == 75560 and round(w["unreclaimable_mib"]) == 74868
    # at its MemoryMax the kernel reclaimed the model's page cache (memory.events max) and killed nothing
    assert not w["killed"] and w["events"]["max"] > 0 and w["events"]["oom_kill"] == 0 and w["events"]["high"] == 0
    full = host_plan(16, 32).instance.total / 2**20
    assert round(full) == 78642 and 1.0 < full / w["rss_mib"] < 1.05  # the plan at 512: +4.1 %


def test_a_ceiling_below_the_model_file_loads_it_through_reclaim_and_kills_nothing():
    ck0 = table()["chat-np16-ck0"]
    assert ck0["memory_max_mib"] == 2236 and not ck0["killed"]
    assert ck0["events"]["max"] > 0 and ck0["events"]["oom_kill"] == 0  # 15.6 GB of model through a 2.2 GB ceiling


def test_checkpoints_and_no_checkpoints_are_planned_never_under():
    t = table()
    for name in ("chat-np4-ck0", "chat-np8-ck0", "chat-np16-ck0", "chat-np24-ck0"):
        r = t[name]
        assert r["reps"] == 3 and r["errors"] == 0 and not r["killed"], name
        assert r["rss_over_plan_max"] < 1 and r["unreclaimable_over_plan_max"] < 1, name
    ck4 = t["chat-np16-ck4"]  # one repetition came back before the device's half hour ended
    assert ck4["held"] == 64 and ck4["rss_over_plan_max"] < 1


def test_the_process_grows_with_slots_faster_than_the_planned_host_buffers():
    """Outside the model's mapped pages, VmRSS at no checkpoints grows about 9 MiB a slot from 4 to 24 slots;
    the plan's host buffers (the output buffer) 3.8. What is left, about 5.5 MiB a slot, is the per-slot heap
    the plan does not count: below the plan only through its token_embd term (682 MiB) at 24 slots."""
    t = table()
    rss = {n: t[f"chat-np{n}-ck0"]["rss_mib"] for n in (4, 8, 16, 24)}
    buffers = {n: host_plan(n, 0).instance.host_buffers / 2**20 for n in (4, 8, 16, 24)}
    slope = (rss[24] - rss[4]) / 20
    planned_slope = (buffers[24] - buffers[4]) / 20
    assert 8 < slope < 10.5 and 3 < planned_slope < 4.5 and 4.5 < slope - planned_slope < 6.5
    inst = host_plan(24, 0).instance
    without_model = (inst.process + inst.host_buffers) / 2**20
    assert rss[24] > without_model  # the plan holds only through the model term: the next fit's case
    assert rss[24] < inst.total / 2**20
