"""The tune's pure part (issue 29): candidates, the winner's rules, the tuned file and its loading."""
import pytest
import yaml

from voltafleet.measure import tune


def cfg_of(cfg, **over):
    return cfg.replace(model_sha256="a" * 64, **over)


def rep(tps, p99, peak=None, errors=(), p50=None):
    return {"throughput_tps": tps, "ttft_p50_ms": p50 or p99 / 2, "ttft_p99_ms": p99, "decode_tps": tps / 4,
            "peak_mib": peak, "requests": 12, "errors": list(errors)}


def trial(name, values, reps, probe="match", status="measured", **kw):
    return tune.Trial(tune.Setting(name, values), status=status, reps=reps, probe=probe, **kw)


def test_candidates_change_one_thing_at_a_time_and_keep_each_slot_s_context(cfg):
    lab = cfg_of(cfg, voltafleet_backend="cpu", server_parallel=4, server_ctx=4096)
    got = {s.name: s.values for s in tune.candidates(lab)}
    assert got["shipped"] == {} and len(got) >= 6
    assert got["slots 2"] == {"server_parallel": 2, "server_ctx": 2048}
    assert got["slots 8"] == {"server_parallel": 8, "server_ctx": 8192}  # 1,024 tokens a slot, as shipped
    assert got["n-gram drafts"] == {"server_spec_ngram": "ngram-mod"}
    assert got["context 2048 a slot"] == {"server_ctx": 8192}  # the slots kept, each with twice the context
    assert got["ubatch 256"] == {"server_ubatch": 256} and got["ubatch 1024"] == {"server_ubatch": 1024}
    assert all(len(v) <= 2 for v in got.values())
    # the host-RAM cache: turned off when the group has it, tried at llama.cpp's size when it ships it off
    assert got["no host-RAM cache"] == {"server_cache_ram": 0}
    off = {s.name: s.values for s in tune.candidates(cfg_of(lab, server_cache_ram=0))}
    assert off["host-RAM cache 8192 MiB"] == {"server_cache_ram": 8192} and "no host-RAM cache" not in off
    # a ubatch outside server_ubatch's bounds is not tried
    edge = [s.name for s in tune.candidates(cfg_of(lab, server_ubatch=2048))]
    assert "ubatch 1024" in edge and "ubatch 4096" not in edge
    cuda = cfg_of(cfg, voltafleet_backend="cuda", llama_cpp_cmake_extra=[tune.FORCE_MMQ, "-DX=1"])
    builds = [s for s in tune.candidates(cuda) if "llama_cpp_cmake_extra" in s.values]
    assert [s.values["llama_cpp_cmake_extra"] for s in builds] == [["-DX=1"]]  # the Volta-rule release beside it


def test_the_winner_is_the_fastest_setting_that_keeps_every_rule(cfg):
    c = cfg_of(cfg, tune_repetitions=3, tune_max_ttft_p99_ms=1000, tune_headroom_mib=500)
    trials = [
        trial("shipped", {}, [rep(100, 500, 9000)] * 3),
        trial("fast but slow to start", {"server_parallel": 16}, [rep(300, 1500, 9000)] * 3),
        trial("fast but diverged", {"a": 1}, [rep(290, 500, 9000)] * 3, probe="diverged: token 3"),
        trial("fast but full", {"b": 1}, [rep(280, 500, 15800)] * 3),
        trial("fast with an error", {"c": 1}, [rep(270, 500, 9000), rep(270, 500, 9000, errors=["HTTP 500"]),
                                               rep(270, 500, 9000)]),
        trial("crashed", {"d": 1}, [], status="failed"),
        trial("two reps", {"e": 1}, [rep(260, 500, 9000)] * 2),
        trial("good", {"server_spec_ngram": "ngram-mod"}, [rep(150, 600, 9000), rep(170, 400, 9000), rep(160, 500, 9000)]),
    ]
    best = tune.winner(trials, c, vram_mib=16000)
    assert best.setting.name == "good" and best.median("throughput_tps") == 160  # the median, not the best rep
    whys = {t.setting.name: tune.judge(t, c, 16000) for t in trials}
    assert "over the objective" in whys["fast but slow to start"] and "golden probe" in whys["fast but diverged"]
    assert "leaves less than 500 MiB" in whys["fast but full"] and "request error" in whys["fast with an error"]
    assert whys["crashed"] == "failed" and "2 of 3 repetitions" in whys["two reps"]
    assert tune.winner(trials[1:7], c, 16000) is None  # none passes: no winner, never a default
    assert "WINNER" in tune.table(trials, c, 16000, best).splitlines()[-1]


def test_the_tuned_file_holds_the_values_their_figures_and_calibrates_the_planner(cfg):
    c = cfg_of(cfg, tune_repetitions=1)
    t = trial("n-gram drafts", {"server_spec_ngram": "ngram-mod"}, [rep(150, 600, 15000)],
              loaded_mib=14100, planned_mib=14800, planned_static_mib=13700)
    text = tune.document("v100_32gb", t, [trial("shipped", {}, [rep(100, 500, 14900)]), t], c,
                         {"host": "gpu-01", "gpu": {"name": "Tesla V100-SXM2-32GB"}, "model_sha256": "a" * 64})
    doc = yaml.safe_load(text)
    # the context measured after load is 400 MiB (14,100 - 13,700), but a plan fell 200 MiB short of its
    # peak (15,000 vs 14,800): the planner's overhead becomes the one planned with plus that, 610 + 200
    assert doc["values"] == {"server_spec_ngram": "ngram-mod", "vram_cuda_overhead_mib": 810}
    assert doc["calibration"]["cuda_overhead_after_load_mib"] == 400 and doc["calibration"]["plan_short_at_peak_mib"] == 200
    assert doc["chosen"]["figures"]["throughput_tps"] == 150 and doc["tuned"]["gpu"]["name"].startswith("Tesla")
    assert doc["calibration"]["planner_error_pct"]["n-gram drafts"] == pytest.approx(1.35)  # 15,000 vs 14,800
    assert [x["setting"] for x in doc["trials"]] == ["shipped", "n-gram drafts"]
    none = yaml.safe_load(tune.document("lab", None, [t], c, {}))
    # no winner: the shipped values stay; the calibration holds whatever won
    assert none["values"] == {"vram_cuda_overhead_mib": 810} and none["chosen"]["setting"] is None
    # a plan over every peak: the context measured after load decides
    over = trial("shipped", {}, [rep(100, 500, 14000)], loaded_mib=14100, planned_mib=14800, planned_static_mib=13700)
    assert tune.calibration([over], 610)["cuda_overhead_mib"] == 400


def test_the_calibration_covers_every_repetition_s_peak_not_the_median():
    """Issue 38: a repetition that peaks over the plan counts, however the others went."""
    reps = [rep(100, 500, 14790), rep(100, 500, 14829.2), rep(100, 500, 14795)]  # median 14,795: under the plan
    t = trial("shipped", {}, reps, loaded_mib=14100, planned_mib=14800, planned_static_mib=13700)
    assert t.median("peak_mib") < t.planned_mib < t.highest("peak_mib")
    cal = tune.calibration([t, trial("slots 8", {}, [rep(1, 1, 9000)] * 3, planned_mib=9100)], 610)
    assert cal["plan_short_at_peak_mib"] == pytest.approx(29.2) and cal["cuda_overhead_mib"] == 640  # 610 + 29.2
    assert cal["peaks_covered"] == 6 and cal["planner_error_pct"]["shipped"] == pytest.approx(0.2)
    for r in reps:  # with the calibrated overhead every repetition's peak is within its plan
        assert t.planned_mib - 610 + cal["cuda_overhead_mib"] >= r["peak_mib"]


def test_a_reading_taken_after_requests_is_shown_not_planned_with():
    """The plan counts the CUDA pool apart: memory read after the first requests (older records read it
    after the smoke test) holds the pool's growth, and planning with it would count the pool twice."""
    old = trial("shipped", {}, [rep(100, 500, 14700)] * 3, after_load_mib=14400, planned_mib=14800,
                planned_static_mib=13700)  # 700 over the static part: context + first request + pool
    cal = tune.calibration([old], 610)
    assert cal["cuda_overhead_after_load_mib"] is None and cal["cuda_overhead_after_requests_mib"] == 700
    assert cal["cuda_overhead_mib"] == 510  # 610 - 100: every peak sat 100 MiB under its plan
    new = trial("shipped", {}, [rep(100, 500, 14700)] * 3, loaded_mib=14250, after_load_mib=14400,
                planned_mib=14800, planned_static_mib=13700)
    cal = tune.calibration([new], 610)
    assert cal["cuda_overhead_after_load_mib"] == 550 and "cuda_overhead_after_requests_mib" not in cal
    assert cal["cuda_overhead_mib"] == 550  # the context read before any request is the floor
    assert tune.Trial.of(tune.Setting("s", {}), {"status": "measured", "loaded_mib": 14250}).loaded_mib == 14250


def test_the_headroom_is_judged_at_every_repetition_s_peak(cfg):
    c = cfg_of(cfg, tune_repetitions=3, tune_max_ttft_p99_ms=1000, tune_headroom_mib=500)
    t = trial("one full rep", {}, [rep(100, 500, 9000), rep(100, 500, 15700), rep(100, 500, 9000)])
    assert t.median("peak_mib") == 9000 and "VRAM peak 15700" in tune.judge(t, c, 16000)


def test_the_gpu_s_memory_is_read_as_the_workload_reads_its_peaks():
    assert tune.gpu_used_command(2) == "nvidia-smi -i 2 --query-gpu=memory.used --format=csv,noheader,nounits"
    assert tune.gpu_used_mib("22133\n") == 22133 and tune.gpu_used_mib("") is None
    assert tune.gpu_used_mib("No devices were found\n") is None


def test_the_inventory_applies_a_tuned_file_after_its_group_file(tmp_path, cfg):
    from voltafleet.inputs.config import ConfigError
    from voltafleet.inputs.groupvars import build_inventory

    gv = tmp_path / "group_vars"
    gv.mkdir()
    (gv / "all.yml").write_text(yaml.safe_dump(cfg.replace(model_sha256="a" * 64, server_parallel=4).flat()))
    (gv / "g.yml").write_text("server_parallel: 6\n")
    inv = build_inventory({"g": ["h1"]}, origin="inv.py", group_vars=gv)
    assert inv["g"][0][1]["server_parallel"] == 6
    (gv / "g.tuned.yml").write_text(tune.document("g", trial("slots 8", {"server_parallel": 8}, [rep(1, 1)]),
                                                  [], cfg.replace(tune_repetitions=1), {}))
    data = build_inventory({"g": ["h1"]}, origin="inv.py", group_vars=gv)["g"][0][1]
    assert data["server_parallel"] == 8 and data["voltafleet_sources"]["server_parallel"] == "group_vars/g.tuned.yml"
    (gv / "g.tuned.yml").write_text("values:\n  server_parallel: 0\n")
    with pytest.raises(ConfigError, match=r"group_vars/g.tuned.yml: server_parallel: is 0, below the minimum"):
        build_inventory({"g": ["h1"]}, origin="inv.py", group_vars=gv)


def test_the_gpu_proof_tunes_the_v100_32gb_group_as_its_hosts_get_it():
    """bench/gpu/tune29.py: the shipped setting's argv is the group's own, each setting is planned for a
    V100-32GB, and the build variant runs on the Volta-rule release."""
    from bench.gpu.gpu_proof import plan_tune29, render

    p = plan_tune29()
    by = {s["name"]: s for s in p["settings"]}
    assert by["shipped"]["args"] == render("v100_32gb") and by["shipped"]["build"] == "mmq"
    assert by["Volta rule build (no FORCE_MMQ)"]["build"] == "volta"
    assert all(s["planned_mib"] and s["planned_static_mib"] < s["planned_mib"] for s in p["settings"] if s["fits"])
    assert "-np" in by["slots 8"]["args"] and by["slots 8"]["args"][by["slots 8"]["args"].index("-np") + 1] == "8"
    assert p["gpu_mib"] == 32768 and p["workload"][p["workload"].index("--reps") + 1] == "3"


def test_tune_try_keeps_the_shipped_setting_and_only_the_kinds_named():
    from tests.fixture_vars import all_yml_settings
    from voltafleet.measure.tune import candidates, kind

    cfg = all_yml_settings(voltafleet_backend="cuda", server_parallel=16, server_ctx=131072, server_ctx_checkpoints=4,
                           server_cache_ram=0, llama_cpp_cmake_extra=["-DGGML_CUDA_FORCE_MMQ=ON"])
    every = candidates(cfg)
    assert {kind(s) for s in every[1:]} == {"slots", "context", "ubatch", "ngram", "backend_sampling",
                                            "host_cache", "checkpoints", "build"}
    assert candidates(cfg.replace(tune_try=None)) == every
    some = candidates(cfg.replace(tune_try=["slots", "checkpoints"]))
    assert [s.name for s in some] == ["shipped", "slots 8", "slots 32", "32 checkpoints"]
    assert candidates(cfg.replace(tune_try=[])) == every[:1]


def test_an_unknown_kind_in_tune_try_is_refused_naming_the_kinds(cfg):
    from voltafleet.inputs.config import ConfigError, validate_values

    with pytest.raises(ConfigError) as e:
        validate_values("h", {**cfg.flat(), "model_sha256": "a" * 64, "tune_try": ["slots", "threads"]})
    assert "tune_try" in str(e.value) and "'threads'" in str(e.value) and "backend_sampling" in str(e.value)
