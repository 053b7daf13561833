"""The pin gate's GPU proof (issue 50, bench/gpu/pin_proof.py): both pins in one run with Volta's kernel choice
and FORCE_MMQ, the same argv on each side, and the gate's record made from the run's raw results: what the gate
reads (voltafleet.state.pingate.proof_step) passes only on what the records say."""
from __future__ import annotations

import json
import subprocess

import pytest

from bench.gpu import gpu_proof, pin_proof
from bench.gpu.proof_bench import refused
from voltafleet.state import pingate
from tests.unit.test_gpu_proof import checkout  # noqa: F401  (the tiny llama.cpp repository fixture)

REPO = gpu_proof.REPO


def test_plan50_runs_the_same_shipped_argv_on_both_pins_and_builds_the_new_one_by_voltafleet_s_script():
    plan = pin_proof.plan50()
    assert refused(pin_proof.PHASES50.split(",")) is None
    for key in ("peaks", "serve27"):
        old = [x for x in plan[key] if x["build"] == pin_proof.OLD]
        new = [x for x in plan[key] if x["build"] == pin_proof.NEW]
        assert old and [{**x, "build": pin_proof.NEW} for x in old] == new
    assert {(p["name"], tuple(p["args"])) for p in plan["peaks"]} == {
        ("v32-np16-long", tuple(gpu_proof.render("v100_32gb"))), ("v16-np2-long", tuple(gpu_proof.render("v100_16gb")))}
    assert [x["args"] for x in plan["serve27"]] == [gpu_proof.render("v100_32gb")] * 2
    b, pin = plan["build_new"], gpu_proof.build_plan()
    assert b["commit"] == pin_proof.NEW_COMMIT and b["old_commit"] == gpu_proof.COMMIT == pin["commit"]
    assert b["fingerprint"] != pin["fingerprint"] and b["root"] != pin["root"]
    assert b["argv"][1:4] == [pin_proof.NEW_ROOT, b["fingerprint"], pin["argv"][3]] and b["argv"][4] == pin_proof.NEW_COMMIT
    assert b["argv"][b["argv"].index("--"):] == pin["argv"][pin["argv"].index("--"):]  # the same CMake flags


def newer(tiny: tuple) -> tuple:
    """The tiny llama.cpp repository with a second commit tagged NEW_REF on top, checked out at the first:
    (its path, the pin's commit, the new one's)."""
    src, head = tiny
    git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t"]
    (src / "NEWER").write_text("b11434\n")
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "newer"], check=True)
    new = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run(git + ["tag", pin_proof.NEW_REF], check=True)
    subprocess.run(git + ["checkout", "-q", head], check=True)
    return src, head, new


def test_the_pack_holds_both_commits_and_plan50(tmp_path, checkout):  # noqa: F811
    src, head, new = newer(checkout)
    m = pin_proof.pack50(tmp_path / "pack", bare=src, checkout=src, commit=head, new_commit=new)
    bare = tmp_path / "pack/llama.cpp.git"
    for c in (head, new):
        assert subprocess.run(["git", "-C", str(bare), "cat-file", "-t", c], capture_output=True,
                              text=True).stdout.strip() == "commit"
    plan = json.loads((tmp_path / "pack/plan.json").read_text())
    assert plan["build_new"]["commit"] == new and plan["build"]["commit"] == gpu_proof.COMMIT == plan["build_new"]["old_commit"]
    assert m["bytes"] < gpu_proof.LIMIT
    with pytest.raises(SystemExit, match="not " + "0" * 40):
        pin_proof.pack50(tmp_path / "pack2", bare=src, checkout=src, commit=head, new_commit="0" * 40)


def test_issue_51_s_pack_builds_the_shipped_pin_and_plans_at_its_graph(tmp_path, checkout):  # noqa: F811
    """pack51: both commits in the pack, the first build is b11434's (PHASES=traffic51:mmq builds it), and every
    traffic config has plan51's argv with the host plan at b11434's graph (CUDA_Host + 20 MiB)."""
    src, head, new = newer(checkout)
    m = pin_proof.pack51(tmp_path / "pack", bare=src, checkout=src, commit=head, new_commit=new)
    plan = json.loads((tmp_path / "pack/plan.json").read_text())
    assert plan["build"] == gpu_proof.build_plan(commit=new) and m["fingerprint"] == plan["build"]["fingerprint"]
    assert plan["build"]["fingerprint"] != gpu_proof.build_plan()["fingerprint"] and "build_new" not in plan
    assert subprocess.run(["git", "-C", str(tmp_path / "pack/llama.cpp.git"), "cat-file", "-t", new],
                          capture_output=True, text=True).stdout.strip() == "commit"
    old, got = gpu_proof.plan51()["traffic51"]["configs"], plan["traffic51"]["configs"]
    assert [c["name"] for c in got] == [c["name"] for c in old] and [c.get("args") for c in got] == [c.get("args") for c in old]
    for a, b in zip(old, got):
        if "planned_mib" in a:
            ub = int(a["args"][a["args"].index("-ub") + 1]) if "-ub" in a["args"] else 512
            extra = ub * 2 * 5120 * 4 / 2**20  # vram.graph_extra_bytes of the 27B: 20 MiB at -ub 512
            assert b["planned_mib"] - a["planned_mib"] == pytest.approx(extra, abs=0.11), a["name"]
            assert b["memory_max_mib"] >= a["memory_max_mib"]


# ---------------------------------------------------------------- the gate's record from raw results

FORCE = "system_info: n_threads = 8 (n_threads_batch = 8) / 16 | CUDA : ARCHS = 900 | FORCE_MMQ = 1 | USE_GRAPHS = 1 |"


def peaks(build: str, over: int = 0) -> list:
    """Each shipped group's peak record on `build`, 100 MiB under its plan (`over`: MiB added)."""
    out = []
    for name, group in (("v32-np16-long", "v100_32gb"), ("v16-np2-long", "v100_16gb")):
        r = {"build": build, "name": name, "group": group, "healthy": True, "mem_peak": 0, "requests": [{"error": None}],
             "mem_load": 1000, "log": [FORCE]}
        commit = pin_proof.NEW_COMMIT if build == pin_proof.NEW else gpu_proof.COMMIT
        planned = pin_proof.vram_verdicts([r], build, commit)[name]["planned_mib"]
        out.append({**r, "mem_peak": round(planned - 100 + over)})
    return out


def serve(build: str, rate16: float, rate1: float) -> dict:
    """serve27's record on `build`: 3 repetitions at 1 and 16 clients whose tokens arrive at the given rates."""
    def recs(k, rate):
        per = rate / k  # each stream's share, 128 tokens each
        return [{"t_start": 0.0, "times_ms": [1000 * (i + 1) / per for i in range(128)], "ttft_ms": 1000 / per}
                for _ in range(k)]
    rounds = [{"rep": rep, "streams": k, "recs": recs(k, rate * (1 + 0.01 * (rep - 1)))}
              for rep in range(3) for k, rate in ((1, rate1), (16, rate16))]
    rounds += [{"rep": rep, "streams": 4, "recs": recs(4, 140.0 * (1 + 0.4 * (rep - 1)))} for rep in range(3)]  # noisy
    return {"build": build, "name": "v100_32gb-ship", "rounds": rounds, "log": [FORCE]}


def probe(build: str, model: str, token0: int = 7, long_n: int = 600) -> dict:
    one = {"short": {"tokens": [token0, 8, 9], "logprobs": [-0.5, -0.2, -0.1], "prompt_n": 12},
           "long": {"tokens": [3, 4, 5], "logprobs": [-0.3, -0.3, -0.3], "prompt_n": long_n}}
    return {"build": build, "model": model, "runs": [one, one, one]}


def results(rate16_new=400.0, rate1_new=50.0, over_new=0, token0_new=7, long_n_new=600) -> dict:
    O, N = pin_proof.OLD, pin_proof.NEW
    return {"peaks": peaks(O) + peaks(N, over_new),
            "serve27": [serve(O, 400.0, 50.0), serve(N, rate16_new, rate1_new)],
            "probe": [probe(b, m, token0_new if b == N else 7, long_n_new if b == N else 600)
                      for m in ("q4ks.gguf", "tiny-q8_0.gguf") for b in (O, N)]}


def step(res: dict) -> pingate.Step:
    rec = pin_proof.h200_record(res, "NVIDIA H200, 580.95.05, 143771 MiB")
    return pingate.proof_step(json.loads(json.dumps(rec)), pin_proof.NEW_COMMIT, gpu_proof.COMMIT, "h200.json")


def test_equal_pins_pass_and_the_record_holds_its_medians_and_plans():
    rec = pin_proof.h200_record(results(), "NVIDIA H200")
    new = rec["sides"][pin_proof.NEW_COMMIT]
    assert new["tok_s_16"] == pytest.approx(400.0, rel=1e-3) and new["tok_s_1"] == pytest.approx(50.0, rel=1e-3)
    assert new["vram_plan_never_under"] and new["golden_probe"] and new["guard_64"]
    assert all(v["planned_mib"] - v["measured_mib"] == pytest.approx(100, abs=1) for v in new["vram"].values())
    assert rec["noise"] == pin_proof.NOISE_FLOOR  # 1 % at 1 and 16 clients (the 4-client rounds' 40 % is not checked)
    assert new["rates"]["4"]["spread"] == 0.4 and new["volta_choice"]
    s = step(results())
    assert s.status == pingate.PASS and s.figures["ratio"] == {"tok_s_16": 1.0, "tok_s_1": 1.0}


@pytest.mark.parametrize("change, why", [
    ({"rate16_new": 380.0}, "worse beyond noise on tok_s_16"),           # 5 % slower at 16 clients
    ({"rate1_new": 45.0}, "worse beyond noise on tok_s_1"),
    ({"over_new": 101}, "vram_plan_never_under failed"),                # the peak 1 MiB over the plan
    ({"token0_new": 11}, "golden_probe failed"),                        # a diverging greedy token
    ({"long_n_new": 300}, "guard_64 failed"),                           # the long probe did not take the 64+ path
])
def test_what_the_records_show_failing_fails_the_step(change, why):
    s = step(results(**change))
    assert s.status == pingate.FAIL and why in s.detail, s.detail


def test_a_missing_side_or_record_is_never_a_pass():
    res = results()
    res["serve27"] = res["serve27"][:1]  # the new pin never served
    s = step(res)
    assert s.status == pingate.FAIL and "no tok_s_16 for both sides" in s.detail
    res = results()
    res["probe"] = [p for p in res["probe"] if p["build"] == pin_proof.OLD]
    assert step(res).status == pingate.FAIL
    assert pingate.proof_step(None, pin_proof.NEW_COMMIT, gpu_proof.COMMIT, "h200.json").status == pingate.NOT_RUN


def test_a_side_that_ran_a_stock_build_a_failed_round_or_no_random_weight_probe_is_never_a_pass():
    res = results()
    for r in res["serve27"] + res["peaks"]:
        if r["build"] == pin_proof.NEW:
            r["log"] = [FORCE.replace("FORCE_MMQ = 1 | ", "")]  # a rebuild that left the stock binary
    s = step(res)
    assert s.status == pingate.FAIL and "new side did not run the shipped build" in s.detail, s.detail
    res = results()
    res["serve27"][1]["rounds"][1]["recs"][3]["error"] = "ReadTimeout"  # one request of a 16-client round failed
    s = step(res)
    assert s.status == pingate.FAIL and "no tok_s_16 for both sides" in s.detail, s.detail
    res = results()
    res["probe"] = [p for p in res["probe"] if p["model"] != "tiny-q8_0.gguf"]
    rec = pin_proof.h200_record(res, "x")
    assert not rec["sides"][pin_proof.NEW_COMMIT]["golden_probe"] and "no probe of tiny-q8_0.gguf" in rec["probe"]["why"]


@pytest.mark.parametrize("change", [{"mem_peak": 0}, {"mem_peak": 900}, {"requests": [{"error": "HTTP 500"}]}])
def test_a_peak_not_sampled_or_with_failed_requests_does_not_pass_the_vram_plan(change):
    res = results()
    res["peaks"] = [{**p, **change} if p["build"] == pin_proof.NEW and p["name"] == "v32-np16-long" else p
                    for p in res["peaks"]]
    s = step(res)
    assert s.status == pingate.FAIL and "vram_plan_never_under failed" in s.detail


def test_run1_the_new_graph_s_compute_buffer_is_what_the_planner_adds_and_the_table_is_the_record():
    """bench/records/pin50/run1 (an H100, both pins in one run): llama-server's own compute buffers grew by
    vram.graph_extra_bytes at every argv, on the GPU and in CUDA_Host; RESULTS.md's planned / peak table is the
    record's, and the gate's h200.json is what `record` makes of it."""
    import re
    import tarfile

    from voltafleet.models.gguf_header import from_json
    from voltafleet.planning import vram

    run = REPO / "bench/records/pin50/run1"
    shape = vram.ModelShape.from_header(from_json(json.loads((REPO / "tests/fixtures/gguf/qwen35-27b-q4ks.json").read_text())))
    extra = vram.graph_extra_bytes(shape, pin_proof.NEW_COMMIT) / 2**20
    assert extra == 20.0 and vram.graph_extra_bytes(shape, pin_proof.gpu_proof.COMMIT) == 0
    buffers = {}
    with tarfile.open(run / "logs.tgz") as t:
        for m in t.getmembers():
            text = t.extractfile(m).read().decode() if m.isfile() else ""
            for where, mib in re.findall(r"(CUDA0|CUDA_Host) compute buffer size = +([0-9.]+) MiB", text):
                buffers.setdefault(m.name.split("load-")[1].replace(".log", ""), {}).setdefault(where, set()).add(float(mib))
    for name in ("v32-np16-long", "v16-np2-long", "v100_32gb-ship"):
        for where in ("CUDA0", "CUDA_Host"):
            old, new = buffers[f"mmq-{name}"][where], buffers[f"mmqnew-{name}"][where]
            assert max(new) - max(old) == pytest.approx(extra, abs=0.02), (name, where, old, new)
    results = json.loads((run / "results.json").read_text())
    rec = pin_proof.h200_record(results, pin_proof.device_of(run))
    assert rec == json.loads((REPO / "bench/records/pin-gate/b11434/h200.json").read_text())
    assert rec["device"].startswith("NVIDIA H100")
    table = (REPO / "bench/RESULTS.md").read_text().split("Validated on run 1, which fitted neither")[1].split("\n\n")[1]
    serve = {x["build"]: x["mem_after"] for x in results["serve27"]}
    for side in rec["sides"].values():
        v = side["vram"]
        want = (f"| {side['ref']} | {v['v32-np16-long']['planned_mib']:,.1f} / {v['v32-np16-long']['measured_mib']:,} | "
                f"{v['v16-np2-long']['planned_mib']:,.1f} / {v['v16-np2-long']['measured_mib']:,} | "
                f"{v['v32-np16-long']['planned_mib']:,.1f} / {serve[side['build']]:,} |")
        assert want in table, want
        assert side["vram_plan_never_under"] and serve[side["build"]] <= v["v32-np16-long"]["planned_mib"]
