"""Issue 49 item 3 on the H200: two runs of phase host49 (bench/records/proof49/run3 and run4), each
llama-server in a cgroup v2 of its own whose memory.max is its unit's MemoryMax, recomputed from the raw
records against voltafleet.planning.hostmem's plan for the same argv.

- run3 validated the constants fitted on proof38 (within 1-2 % at the worst case) and showed the process
  growing with -np faster than the plan's host buffers;
- the process terms were then fitted (gpu_proof.fit49) on run3 alone, and run4 was its validation run: the
  anonymous memory held, but at the ceiling the kernel's own memory grew by 14 MiB while it reclaimed the
  model's page cache, and the cgroup's charge less page cache went 9 MiB over the plan (below);
- group_vars now carry the fit on run3 and run4 together, kernel memory under reclaim included; run 5
  (bench/records/proof49/run5, gpu_proof.plan49v) is their validation run, not fitted on: the fill at 512 of
  512, 0, 4 and 8 checkpoints at the shipped 16 slots and the latency tier as shipped, each planned within 5 %
  and never under (below). It ran on an H100 (the device lent one), and the session's device time ended
  before chat-np16-ck32 and the slot sweep: those stay validated by the run3 -> run4 fit check alone."""
import json
from pathlib import Path

import pytest
import yaml

from bench.gpu.gpu_proof import FIT49_RUNS, fit49, host49_table, host_plan, plan49

REPO = Path(__file__).resolve().parents[2]
RUN3, RUN4 = (REPO / r for r in FIT49_RUNS)
RUN5 = REPO / "bench/records/proof49/run5"  # the validation run: not in FIT49_RUNS


def results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())


def table(run: Path) -> dict:
    return {r["name"]: r for r in host49_table(results(run))}


def test_run4_served_the_argv_plan49_renders_three_repetitions_each_under_the_ceiling_its_unit_would_get():
    planned = {c["name"]: c for c in plan49()["host49"]["configs"]}
    got = results(RUN4)["host49"]
    assert [r["name"] for r in got] == list(planned)
    for r in got:
        want = [a.replace("MODEL", "/tmp/models/q4ks.gguf") for a in planned[r["name"]]["args"]]
        assert r["args"] == want and r["healthy"] and len(r["reps"]) == 3, r["name"]
        assert r["cgroup_error"] is None and r["memory_max_mib"] > 0


def test_group_vars_carry_the_fit_on_run3_and_run4():
    fit = fit49([results(RUN3), results(RUN4)])
    shipped = yaml.safe_load((REPO / "group_vars/all.yml").read_text())
    for key in ("hostmem_process_mib", "hostmem_slot_mib", "hostmem_kernel_mib", "hostmem_program_mib"):
        assert shipped[key] == fit[key], key
    assert fit["slots"] == [4, 8, 16, 24] and all(0 <= v < 25 for v in fit["residual_mib"].values())
    assert 5 <= fit["hostmem_slot_mib"] < 6  # the process grows ~5 MiB a slot beyond the plan's host buffers


def test_both_runs_are_planned_never_under_and_within_5_percent_at_16_slots():
    """The plan at the checkpoints each repetition held: never under the process's anonymous memory
    (RssAnon + RssShmem) or the cgroup's charge less its page cache, in any repetition of either run; at the
    shipped 16 slots within 5 % of both at 0, 4, 8 and 32 checkpoints and at every slot's checkpoints
    (496 held: a full slot holds 31 of its 32, test_proof38). VmRSS stays under the plan's total."""
    for run in (RUN3, RUN4):
        for name, r in table(run).items():
            assert r["errors"] == 0 and not r["killed"], (run.name, name)
            assert r["anon_over_plan_max"] <= 1 and r["unreclaimable_over_plan_max"] <= 1, (run.name, name)
            assert r["rss_mib"] < r["plan_total_mib"], (run.name, name)
    t = table(RUN4)
    for name in ("chat-np16-ck0", "chat-np16-ck4", "chat-np16-ck8", "chat-np16-ck32", "fill-np16-ck32"):
        assert t[name]["reps"] == 3, name
        assert t[name]["anon_over_plan_max"] >= 0.95 and t[name]["unreclaimable_over_plan_max"] >= 0.95, name
    assert t["fill-np16-ck32"]["held"] == 496 and t["chat-np16-ck4"]["held"] == 64
    assert t["chat-np16-ck8"]["held"] == 112 and t["chat-np16-ck32"]["held"] == 130  # chats of 4 turns
    full = host_plan(16, 32).instance.total / 2**20
    assert 1.0 < full / t["fill-np16-ck32"]["rss_mib"] < 1.05  # the plan at 512 of 512 (+4.3 %), over the 496 held


def test_at_the_ceiling_the_kernel_reclaims_the_model_s_page_cache_and_kills_nothing():
    for run in (RUN3, RUN4):
        ck0 = table(run)["chat-np16-ck0"]
        # 15.6 GB of model loaded and served through a ceiling of 2.2-2.3 GB
        assert ck0["memory_max_mib"] < 2400 and ck0["events"]["max"] > 0
        assert ck0["events"]["oom_kill"] == 0 and ck0["events"]["high"] == 0 and not ck0["killed"]
    assert table(RUN4)["chat-np16-ck0"]["events"]["max"] > 40000  # reclaiming all through its chats


def test_run4_found_the_run3_fit_under_by_the_kernel_s_memory_while_it_reclaims():
    """The fit on run3 alone, checked on run4: the anonymous memory is planned at every config, but where
    the server ran at its ceiling reclaiming page cache (chat-np16-ck0 and -ck4: memory.events max in the tens
    of thousands) the cgroup held 14 MiB more kernel memory than anywhere in run3, and its charge less page
    cache went over that fit's plan. Kernel memory beside the page tables: 6-10 MiB, 20-24 under reclaim."""
    run3 = fit49([results(RUN3)])
    assert run3["hostmem_kernel_mib"] == 10
    over = []
    for r in results(RUN4)["host49"]:
        inst = host_plan(r["slots"], 0).instance
        for rep in r["reps"]:
            peak = rep["peak"]
            anon = peak["RssAnon"] + peak["RssShmem"]
            planned_anon = run3["hostmem_process_mib"] + run3["hostmem_slot_mib"] * r["slots"] + \
                inst.host_buffers / 2**20 + rep["ckpt"]["held"] * 149.626
            assert anon <= planned_anon, (r["name"], rep["rep"])
            kernel = peak["cgroup"]["cg_unreclaimable"] - anon - anon / 512
            if kernel > run3["hostmem_kernel_mib"]:
                over.append((r["name"], round(kernel)))
    assert {name for name, _ in over} == {"chat-np16-ck0", "chat-np16-ck4"}
    assert 20 <= max(k for _, k in over) <= 24 and min(k for _, k in over) >= 19


def test_the_process_grows_with_slots_and_the_plan_follows_it():
    """Anonymous memory less the host buffers at 4, 8, 16 and 24 slots (no checkpoints): it grows about
    5 MiB a slot beyond the plan's host buffers (3.8 a slot), the same in both runs; the plan's slot term
    follows it."""
    for run in (RUN3, RUN4):
        t = table(run)
        rest = {n: t[f"chat-np{n}-ck0"]["anon_mib"] - host_plan(n, 0).instance.host_buffers / 2**20
                for n in (4, 16, 24)}
        assert 4 < (rest[16] - rest[4]) / 12 < 7.5 and 2.5 < (rest[24] - rest[16]) / 8 < 5, (run.name, rest)
    a, b = table(RUN3)["chat-np16-ck0"]["anon_mib"], table(RUN4)["chat-np16-ck0"]["anon_mib"]
    assert abs(a - b) < 1  # the same process, two sessions: anonymous memory within 1 MiB


def test_the_phase_records_the_kernel_s_memory_by_kind_for_the_next_run(tmp_path):
    """The next run can tell what the kernel's memory under reclaim is (run3 and run4 kept only its sum):
    the sampler keeps memory.stat's kernel lines beside the charge."""
    from bench.gpu.proof.runner import KERNEL_STAT, cgroup_mem

    mib = 2**20
    (tmp_path / "memory.stat").write_text(
        f"anon {400 * mib}\nfile {1000 * mib}\nactive_file {600 * mib}\ninactive_file {400 * mib}\n"
        f"kernel {30 * mib}\npagetables {2 * mib}\nslab_reclaimable {20 * mib}\nslab_unreclaimable {5 * mib}\n"
        f"workingset_nodes 12345\n")
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 0\noom_kill 0\n")
    (tmp_path / "memory.current").write_text(f"{1430 * mib}\n")
    got = cgroup_mem(str(tmp_path))
    assert got["cg_unreclaimable"] == 430 and got["cg_events"]["max"] == 7
    assert got["cg_kernel"]["slab_reclaimable"] == 20 and got["cg_kernel"]["pagetables"] == 2
    assert set(got["cg_kernel"]) <= set(KERNEL_STAT) and "anon" not in got["cg_kernel"]


@pytest.mark.parametrize("run, slots", [(RUN4, {4, 16, 24}), (RUN5, {16})])
def test_the_host_buffers_and_the_vram_plan_at_load_hold_on_runs_they_were_not_fitted_on(run, slots):
    """The CUDA_Host compute buffer (fitted on 30 H200 loads of proof27-38) and the output buffer are planned at
    or just above what run4's llama-server logged at 4, 16 and 24 slots; the VRAM plan (vram_cuda_overhead_mib
    610: 592 after load + 18 after the first request, fitted on proof27) is never under the GPU memory each
    server held once loaded (nvidia-smi), less the CUDA pool the first requests take, and at most 20 MiB over it.
    (The peak after requests was not sampled in this phase: the overhead's 18 MiB after the first request stays
    validated only by proof29's runs.) Run 5 (an H100) the same at its 16 slots, and no repetition's file pages
    above hostmem_program_mib."""
    import json as _json

    from bench.gpu.gpu_proof import group_cfg
    from voltafleet.models.gguf_header import from_json
    from voltafleet.planning import vram

    cfg = group_cfg("v100_32gb")
    shape = vram.ModelShape.from_header(from_json(_json.loads((REPO / "tests/fixtures/gguf/qwen35-27b-q4ks.json").read_text())))
    seen = set()
    for r in results(run)["host49"]:
        rss_file = max(x["peak"].get("RssFile", 0) for x in r["reps"])
        assert rss_file <= cfg.server.hostmem_program_mib, (r["name"], rss_file)
        logged = {}
        for where, what, mib in r["buffers"]:
            logged[(where, what)] = max(logged.get((where, what), 0), mib)
        inst = host_plan(r["slots"], r["ckpt"]).instance
        host = logged[("CUDA_Host", "compute")] + logged[("CUDA_Host", "output")]
        assert host <= inst.host_buffers / 2**20 <= host + 2.5, (r["name"], host)
        p = vram.plan(shape, 8192 * r["slots"], r["slots"], cfg.server.cache_type_k, cfg.server.cache_type_v,
                      32768, overhead_mib=610)  # the context (592) + the first request (18): the group's 640 adds 30
        at_load = (p.needed - p.pool) / 2**20  # the CUDA pool is taken by the first requests, not at load
        assert 0 <= at_load - r["gpu_load_mib"] <= 20, (r["name"], at_load, r["gpu_load_mib"])
        seen.add(r["slots"])
    assert seen == slots


# ---------------------------------------------------------------- run 5: the validation run, prepared (not yet run)

def plan5() -> dict:
    from bench.gpu.gpu_proof import plan49v

    return plan49v()


def test_run5_holds_plan49s_seven_configs_as_plan49_renders_them_the_worst_case_first():
    """plan49v: plan49's configs, each with today's argv, planned_mib and memory_max_mib, less the fill at the
    default spacing (runs 3 and 4 hold six repetitions of it; the 512 fill is its worst case); the 512-checkpoint
    fill first, then 0, 4, 8 and 32 checkpoints at 16 slots (3 repetitions), then the process term at 4, 24 and
    8 slots (one each: runs 3 and 4 hold three)."""
    from bench.gpu.gpu_proof import CMS0

    got = {c["name"]: c for c in plan5()["host49"]["configs"]}
    for c in plan49()["host49"]["configs"]:
        if c["name"] != "fill-np16-ck32":
            assert {k: v for k, v in got[c["name"]].items() if k != "runs"} == c, c["name"]
    assert list(got) == [CMS0, "chat-np16-ck0", "chat-np16-ck4", "chat-np16-ck8", "chat-np16-ck32", "chat-np4-ck0",
                         "chat-np24-ck0", "chat-np8-ck0"]
    assert plan5()["host49"]["runs"] == 3
    assert {n: c.get("runs") for n, c in got.items()} == {n: 1 if "-ck0" in n and "np16" not in n else None
                                                           for n in got}


def test_run5_renders_the_shipped_argv_of_each_config():
    """Each config's argv is voltafleet's server_args of v100_32gb's variables at its slots and checkpoints; the ones
    run before are those runs' argv, byte for byte (run4's seven, run3's chat-np8-ck0)."""
    from bench.gpu.gpu_proof import CMS0, host49_cfg
    from voltafleet.planning.flags import server_args

    recorded = {r["name"]: r["args"] for run in (RUN3, RUN4) for r in results(run)["host49"]}
    for c in plan5()["host49"]["configs"]:
        assert c["args"] == server_args(host49_cfg(c["slots"], c["ckpt"], c["cms"]), "MODEL", port=18080,
                                        api_key_file=None), c["name"]
        if c["name"] != CMS0:
            assert [a.replace("MODEL", "/tmp/models/q4ks.gguf") for a in c["args"]] == recorded[c["name"]], c["name"]


def test_run5_fills_every_checkpoint_with_no_minimum_spacing_planned_as_16_x_32():
    """The worst case: FILL38's 17 short turns at 16 slots and 32 checkpoints with `--checkpoint-min-step 0` in
    server_extra_flags (llama.cpp's create_checkpoint then evicts only a duplicate, and the oldest at 32: a slot
    holds 32 of 32, not 31). voltafleet's own check of server_extra_flags takes it at the pinned llama.cpp, and
    the plan is the same 16 x 32 = 512 checkpoints as plan49's fill."""
    from bench.gpu.gpu_proof import CMS0, COMMIT, host49_cfg, host_plan
    from voltafleet.planning.flags import extra_flag_errors

    c = next(c for c in plan5()["host49"]["configs"] if c["name"] == CMS0)
    assert c["kind"] == "fill" and c["turns"] == 17 and (c["slots"], c["ckpt"], c["cms"]) == (16, 32, 0)
    args = c["args"]
    assert args[args.index("--checkpoint-min-step") + 1] == "0" and args.count("--checkpoint-min-step") == 1
    assert args[args.index("--ctx-checkpoints") + 1] == "32" and args[args.index("-np") + 1] == "16"
    cfg = host49_cfg(16, 32, 0)
    assert list(cfg.server.extra_flags) == ["--checkpoint-min-step", "0"]
    assert extra_flag_errors(list(cfg.server.extra_flags), COMMIT) == []
    inst = host_plan(16, 32, 0).instance
    assert inst.slots * inst.checkpoints_per_slot == 512 and inst == host_plan(16, 32).instance
    fill = next(x for x in plan49()["host49"]["configs"] if x["name"] == "fill-np16-ck32")
    assert (c["planned_mib"], c["memory_max_mib"]) == (fill["planned_mib"], fill["memory_max_mib"])


def test_every_run5_config_s_ceiling_is_its_unit_s_memorymax():
    """memory_max_mib, the cgroup's memory.max on the GPU machine, is the MemoryMax= the server role's unit carries
    for the same variables (voltafleet.planning.unitfile), in MiB rounded up; planned_mib is the plan's total."""
    import math
    import re

    from bench.gpu.gpu_proof import host49_cfg, host_plan
    from voltafleet.planning.unitfile import render_unit

    for c in plan5()["host49"]["configs"]:
        p = host_plan(c["slots"], c["ckpt"], c["cms"])
        unit = render_unit(host49_cfg(c["slots"], c["ckpt"], c["cms"]).replace(voltafleet_backend="cuda"), 255, p)
        memory_max = int(re.search(r"^MemoryMax=(\d+)$", unit, re.M).group(1))
        assert c["memory_max_mib"] == math.ceil(memory_max / 2**20), c["name"]
        assert c["planned_mib"] == round(p.instance.total / 2**20, 1) and c["planned_mib"] * 1.1 <= c["memory_max_mib"]


def test_run5_runs_the_latency_tier_as_shipped_for_a_second_run_of_its_overhead():
    """The tier's vram_cuda_overhead_mib (640) was fitted on bench/records/tier41 alone: run 5 runs the tier as
    group_vars/latency.yml ships it (depth 2, on the file whose drafts are all accepted), the argv tier41's lat-d2 ran."""
    from bench.gpu.gpu_proof import PHASES49V, latency41
    from voltafleet.planning.flags import server_args

    t = plan5()["tier41"]
    (c,) = t["configs"]
    lat = yaml.safe_load((REPO / "group_vars/latency.yml").read_text())
    assert c["name"] == f"lat-d{lat['server_spec_draft_max']}" and c["model"] == "q4ks-mtp-acc.gguf"
    tier41 = {r["name"]: r for r in json.loads((REPO / "bench/records/tier41/results.json").read_text())["tier41"]}
    assert c["args"][2:] == tier41[c["name"]]["args"][2:]
    assert c["args"] == server_args(latency41(lat["server_spec_draft_max"]), "MODEL", port=18080, api_key_file=None)
    assert t["build"] == "mmq" and PHASES49V == "tier41:mmq,host49:mmq"  # the tier first: ~48 s, then host49


def test_run5_fits_the_device_session_the_important_configs_first():
    """estimate49v reproduces run4's phase time from its own results; run 5's phases take about 16 minutes after the
    build (a session's 30 device minutes hold the machine's start, the build and them), the tier and the four
    16-slot chats with the 512 fill done in the first 15."""
    from bench.gpu.gpu_proof import estimate49v

    runs = [results(RUN3), results(RUN4)]
    own = estimate49v([results(RUN4)], {"host49": plan49()["host49"]})
    assert abs(own["phase_s"] - results(RUN4)["phase_seconds"]["host49:mmq"]) < 5
    e = estimate49v(runs)
    assert 900 < e["phase_s"] <= 17 * 60, e
    first = list(e["configs"])[:5]
    assert e["tier41_s"] + sum(e["configs"][n] for n in first) < 15 * 60


def test_validate49_gives_run4_s_verdicts_as_if_it_were_the_validation_run():
    """validate49 on run4's records (a fit run, here only to exercise it): planned against measured in both
    quantities, within 5 % and never under at 16 slots, never under at 4 and 24; and not validated, for what run4
    lacks: no config held every checkpoint (496 of 512) and no latency tier."""
    from bench.gpu.gpu_proof import validate49, validate49_report

    v = validate49(RUN4)
    rows = {r["name"]: r for r in v["host49"]}
    assert list(rows) == [c["name"] for c in plan49()["host49"]["configs"]]
    for name, r in rows.items():
        assert r["ok"] and not r["killed"] and r["events_high"] == 0 and r["reps"] == 3, name
        for q in ("anon", "unreclaimable"):
            assert r[q]["high"] <= 1, (name, q)
            if r["slots"] == 16:
                assert r[q]["low"] >= 0.95 and r[f"{q}_verdict"] == "within 5 %, never under", (name, q)
    assert rows["chat-np4-ck0"]["unreclaimable_verdict"].startswith("never under, 9.")
    assert rows["fill-np16-ck32"]["held"] == [496] and not rows["fill-np16-ck32"]["full"]
    assert rows["chat-np16-ck0"]["unreclaimable"]["measured_mib"] == table(RUN4)["chat-np16-ck0"]["unreclaimable_mib"]
    assert v["host49_ok"] is False and v["tier41_ok"] is False and v["ok"] is False
    assert v["why"] == ["no config held every checkpoint (slots x 32)",
                        "no latency tier config (vram_cuda_overhead_mib not validated)"]
    text = validate49_report(v)
    assert "| chat-np16-ck0 | 0 | 534 / 527 (0.987-0.988) | 559 / 552 (0.987-0.988) | ok:" in text
    assert text.endswith("NOT validated: no config held every checkpoint (slots x 32); no latency tier config "
                         "(vram_cuda_overhead_mib not validated)")


def test_validate49_passes_a_run_that_fills_every_checkpoint_and_fails_one_under_its_plan():
    """The verdicts on run4's records changed the way run 5 should differ: the fill holding 512 (each repetition's
    anonymous memory and charge 16 checkpoints larger) validates the host plan; a repetition 1 % over its plan fails
    as under, named."""
    import copy

    from bench.gpu.gpu_proof import validate49

    run = copy.deepcopy(results(RUN4))
    fill = next(r for r in run["host49"] if r["name"] == "fill-np16-ck32")
    for rep in fill["reps"]:
        more = 16 * max(rep["ckpt"]["size_mib"])
        rep["ckpt"]["held"] += 16
        rep["peak"]["RssAnon"] += more
        rep["peak"]["cgroup"]["cg_unreclaimable"] += more * (1 + 1 / 512)
    v = validate49(run)
    assert v["host49_ok"] and next(r for r in v["host49"] if r["name"] == "fill-np16-ck32")["full"]
    ck8 = next(r for r in run["host49"] if r["name"] == "chat-np16-ck8")
    ck8["reps"][1]["peak"]["RssAnon"] *= 1.01
    v = validate49(run)
    assert not v["host49_ok"] and v["why"][0].startswith("chat-np16-ck8: anonymous UNDER by ")


def test_validate49_gives_the_tier41_record_s_vram_verdicts_at_the_shipped_overhead():
    """The latency tier's part on the record its overhead was fitted on (the code path run 5 takes): VRAM planned at
    640 within 5 % and never under at every depth, host memory never under."""
    from bench.gpu.gpu_proof import validate49

    v = validate49(REPO / "bench/records/tier41")
    tier = {t["name"]: t for t in v["tier41"]}
    assert set(tier) == {f"lat-d{d}{s}" for d in range(4) for s in ("", "-rej")}
    assert all(t["ok"] and t["overhead_mib"] == 640 for t in tier.values())
    d2 = tier["lat-d2"]
    assert d2["depth"] == 2 and 0 <= d2["vram"]["planned_mib"] - d2["vram"]["measured_mib"] <= 0.002 * d2["vram"]["measured_mib"]
    assert v["tier41_ok"] and v["why"] == ["no host49 config"] and not v["ok"]


def test_the_phase_runs_a_config_s_own_repetitions_where_it_has_them(monkeypatch):
    """host49 on the GPU machine: plan49v's fill at the default spacing once, every other config the plan's 3 (the
    phase's servers, cgroups and chats stood in for here)."""
    from types import SimpleNamespace

    from bench.gpu.proof import hostmem as phase

    calls = []
    monkeypatch.setattr(phase, "make_cgroup", lambda name, mib: f"/cg/{name}")
    monkeypatch.setattr(phase, "cgroup_mem", lambda path: {})
    monkeypatch.setattr(phase, "proc_mem", lambda pid: {"VmRSS": 1.0})
    monkeypatch.setattr(phase, "gpu_mem", lambda pid: {})
    monkeypatch.setattr(phase, "chat_turn", lambda c, item, followup: {})
    monkeypatch.setattr(phase.time, "sleep", lambda s: None)
    monkeypatch.setattr(phase, "chat_rep", lambda run, s, item, rep, workload, rng, cgroup:
                        calls.append((item["name"], rep, cgroup)) or {"rep": rep})

    class Run:
        plan, port, results = plan5(), 18080, {}

        def server(self, build, name, args, cgroup=None):
            return SimpleNamespace(ok=True, args=args, load_s=1.0, p=SimpleNamespace(pid=1, poll=lambda: None),
                                   stop=lambda: None, buffers=lambda: [])

        def loglines(self, s):
            return []

        def save(self):
            pass

    phase.host_memory_validation(Run(), "mmq")
    reps = {}
    for name, _, cgroup in calls:
        reps[name] = reps.get(name, 0) + 1
        assert cgroup == f"/cg/{name}"
    assert reps == {c["name"]: c.get("runs", 3) for c in plan5()["host49"]["configs"]}
    assert sorted(set(reps.values())) == [1, 3]
    assert [r["name"] for r in Run.results["host49"]] == list(reps)


# ---------------------------------------------------------------- run 5: the validation run, as it ran

def test_run5_ran_plan49v_s_argv_in_its_order_and_was_cut_only_at_the_end():
    """Run 5 served plan49v's configs in plan49v's order with plan49v's argv and ceilings, 3 repetitions each;
    the device session's time ended during chat-np16-ck32, so the configs after chat-np16-ck8 are not in it."""
    from bench.gpu.gpu_proof import plan49v

    assert str(RUN5.relative_to(REPO)) not in FIT49_RUNS
    plan = plan49v()
    want = plan["host49"]["configs"]
    got = results(RUN5)["host49"]
    assert [r["name"] for r in got] == [c["name"] for c in want][:len(got)] and len(got) == 4
    for r, c in zip(got, want):
        assert r["args"] == [a.replace("MODEL", "/tmp/models/q4ks.gguf") for a in c["args"]], r["name"]
        assert r["memory_max_mib"] == c["memory_max_mib"] and r["healthy"] and len(r["reps"]) == 3, r["name"]
    (tier,) = results(RUN5)["tier41"]
    assert tier["name"] == plan["tier41"]["configs"][0]["name"] and tier["args"][2:] == plan["tier41"]["configs"][0]["args"][2:]
    assert "NVIDIA H100 80GB HBM3, 580.159.04" in (RUN5 / "facts.txt").read_text()  # the card it ran on


def test_run5_validates_the_shipped_plan_within_5_percent_never_under_with_every_checkpoint_held():
    """validate49 on run 5: every config within 5 % and never under in both quantities the kernel cannot
    reclaim, in every repetition; nothing killed or throttled; the 512 fill held 512 of 512; the latency tier's
    VRAM plan (vram_cuda_overhead_mib 640) within 5 % of its GPU peak and its host plan never under."""
    from bench.gpu.gpu_proof import validate49

    v = validate49(RUN5)
    assert v["ok"] and v["why"] == [], v["why"]
    rows = {r["name"]: r for r in v["host49"]}
    assert rows["fill-np16-ck32-cms0"]["full"] and rows["fill-np16-ck32-cms0"]["held"] == [512]
    assert {n: r["held"] for n, r in rows.items()} == {"fill-np16-ck32-cms0": [512], "chat-np16-ck0": [0],
                                                        "chat-np16-ck4": [64], "chat-np16-ck8": [112]}
    for r in rows.values():
        for q in ("anon", "unreclaimable"):
            assert 0.95 <= r[q]["low"] <= r[q]["high"] <= 1, (r["name"], q, r[q])
        assert not r["killed"] and r["events_high"] == 0 and r["errors"] == 0
    (t,) = v["tier41"]
    assert t["ok"] and t["overhead_mib"] == 640 and 0 <= t["vram"]["planned_mib"] - t["vram"]["measured_mib"] <= 20
    # the worst case's VmRSS against the plan's total at 512 of 512 (file pages included)
    fill = table(RUN5)["fill-np16-ck32-cms0"]
    assert fill["rss_mib"] < fill["plan_total_mib"] < 1.02 * fill["rss_mib"]
