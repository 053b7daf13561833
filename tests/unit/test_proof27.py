"""Issue 27's H200 record (bench/records/proof27/run1: the Volta-rule build, raw): the planner against every
peak, recomputed from the records; the patch that makes the H200 take Volta's kernel choice."""
import json
from pathlib import Path

import pytest

from bench.gpu import voltarule
from voltafleet.models.gguf_header import from_json
from voltafleet.planning.vram import MIB, NGRAM_DRAFT_MAX, ModelShape, plan, pool_bytes, routed, spec_rows

ROOT = Path(__file__).resolve().parents[2]
RUN1 = ROOT / "bench/records/proof27/run1"
PEAKS = json.loads((RUN1 / "results.json").read_text())["peaks"]
V100_32 = 32480


def shape():
    return ModelShape.from_header(from_json(json.loads((ROOT / "tests/fixtures/gguf/qwen35-27b-q4ks.json").read_text())))


def volta_peaks():
    return [pytest.param(r, id=r["name"]) for r in PEAKS if r["build"] == "volta"]


def test_the_record_covers_five_slot_counts_short_and_long_and_ngram():
    names = {r["name"] for r in PEAKS if r["build"] == "volta"}
    assert {f"v32-np{n}-{k}" for n in (2, 4, 8, 12, 16) for k in ("short", "long")} <= names
    assert {"v16-np2-short", "v16-np2-long", "v32-np16-ngram"} <= names
    for r in PEAKS:
        reqs = r["requests"]
        assert r["healthy"] and len(reqs) == r["parallel"] and not any(q.get("error") for q in reqs)
        assert all(q["prompt_n"] == r["prompt"] for q in reqs)  # every slot got its whole prompt at once


@pytest.mark.parametrize("r", volta_peaks())
def test_planner_within_1_percent_of_every_volta_rule_peak_and_never_under(r):
    p = plan(shape(), r["ctx"], r["parallel"], "q8_0", "q8_0", V100_32, 1024, 610, how="volta",
             ngram=bool(r.get("spec")))
    planned = p.needed / MIB
    assert planned >= r["mem_peak"], (p.describe(), r["mem_peak"])
    assert (planned - r["mem_peak"]) / r["mem_peak"] < 0.01, (p.describe(), r["mem_peak"])


def test_the_planned_after_load_is_the_measured_one():
    # the pool is empty after load: the rest of the plan (the 18 MiB of the first request aside) is llama.cpp's
    for r in PEAKS:
        if r["build"] == "volta" and not r.get("spec"):
            p = plan(shape(), r["ctx"], r["parallel"], "q8_0", "q8_0", V100_32, 1024, 610, how="volta")
            assert abs((p.needed - p.pool) / MIB - 18 - r["mem_load"]) < 12, r["name"]


def test_the_pool_is_the_largest_routed_op():
    m = shape()
    ffn = 5120 * 17408 * 2 + 512 * 17408 * 2   # the FFN in F16 and a 512-token ubatch's F16 input
    assert pool_bytes(m, "volta", 16) == ffn + 160 * MIB
    assert pool_bytes(m, "mmq", 16) == 32 * MIB
    # the output matrix: 16 decoding slots stay on MMQ on Volta (16 < 64 rows), not with FORCE_CUBLAS (> 8)
    out16 = 248320 * 5120 * 2 + 16 * 5120 * 2 + 16 * 248320 * 2
    assert not routed("volta", 16) and routed("cublas", 16) and not routed("cublas", 8)
    assert pool_bytes(m, "cublas", 16) == out16 + 160 * MIB
    # n-gram drafting: up to 64 tokens a slot verified at once: even one slot reaches 64 rows on Volta
    assert spec_rows(1, NGRAM_DRAFT_MAX) == 65 and spec_rows(16, NGRAM_DRAFT_MAX) == 512
    assert pool_bytes(m, "volta", 1, 65) == 248320 * 5120 * 2 + 65 * 5120 * 2 + 160 * MIB
    # measured: the n-gram load grew 2,602 MiB over its after-load figure (the output matrix in F16)
    (ngram,) = [r for r in PEAKS if r["build"] == "volta" and r["name"] == "v32-np16-ngram"]
    assert ngram["mem_peak"] - ngram["mem_load"] == 2602 and sum(q["draft_n"] for q in ngram["requests"]) > 0


def test_the_voltarule_patch_is_the_one_the_gpu_ran():
    diff = (RUN1 / "voltarule.diff").read_text()
    for name, old, new in voltarule.HUNKS:
        assert f"+++ b/{name}" in diff
        assert all(("+" + line) in diff for line in new.splitlines() if line not in old.splitlines())
    text = "x\n" + voltarule.HUNKS[0][1] + "y\n"
    out = voltarule.patched(voltarule.MMQ, text)
    assert "return ne11 < MMQ_DP4A_MAX_BATCH_SIZE;" in out and "#ifdef GGML_CUDA_FORCE_MMQ" in out
    with pytest.raises(voltarule.AnchorMissing, match="moved"):
        voltarule.patched(voltarule.MMQ, "nothing here")
    with pytest.raises(voltarule.AnchorMissing, match="2 times"):
        voltarule.patched(voltarule.CUDA, voltarule.HUNKS[1][1] * 2)
    for b in ("volta", "mmq"):
        assert f"{b} rc=0" in (RUN1 / f"build-{b}.txt").read_text()


def test_both_v100_groups_build_one_release_and_a_toolkit_move_rebuilds_it_once():
    import yaml

    from voltafleet.inputs.settings import Settings
    from voltafleet.planning import hostplan
    from voltafleet.state.fleetplan import ServerEntry, builders

    def cfg(group, **over):
        c = yaml.safe_load((ROOT / "group_vars/all.yml").read_text())
        c.update(yaml.safe_load((ROOT / f"group_vars/{group}.yml").read_text()), **over)
        return Settings.of(c)

    commit, cxx = "0c1e57098bba43ac29e6e3b677cdceebdd22334f", "12.2.0 x86_64-linux-gnu"
    for g in ("v100_16gb", "v100_32gb"):
        assert cfg(g).toolchain.cuda_toolkit_version == "12.8" and "-DGGML_CUDA_FORCE_MMQ=ON" in cfg(g).build.cmake_extra
    spec = {g: hostplan.build_spec(cfg(g), [70], commit) for g in ("v100_16gb", "v100_32gb")}
    assert spec["v100_16gb"] == spec["v100_32gb"]  # the same flags, toolkit path and targets: one release
    assert "-DCMAKE_CUDA_COMPILER=/usr/local/cuda-12.8/bin/nvcc" in spec["v100_32gb"].flags
    fp128 = spec["v100_32gb"].fingerprint("12.8.93", cxx)
    old = hostplan.build_spec(cfg("v100_32gb", cuda_toolkit_version="12.9"), [70], commit).fingerprint("12.9.86", cxx)
    assert fp128 != old  # the move to 12.8 is a new release, compiled once for every host of both groups
    hosts = [ServerEntry(f"h{i}", "127.0.0.1", (8080 + i,), 16, fp128) for i in range(6)]
    assert builders(hosts) == {fp128: "h0"}


# ---- the second session (bench/records/proof27/run2): FORCE_MMQ against the Volta rule, one session
RUN2 = json.loads((ROOT / "bench/records/proof27/run2/results.json").read_text())


@pytest.mark.parametrize("name", ["v32-np16-long", "v16-np2-long", "v32-np16-ngram"])
def test_planner_within_1_percent_of_the_force_mmq_peaks_and_never_under(name):
    (r,) = [x for x in RUN2["peaks"] if x["build"] == "mmq" and x["name"] == name]
    p = plan(shape(), r["ctx"], r["parallel"], "q8_0", "q8_0", V100_32, 1024, 610, how="mmq", ngram=bool(r.get("spec")))
    assert r["mem_peak"] <= p.needed / MIB < r["mem_peak"] * 1.01, (p.describe(), r["mem_peak"])


def bench(build, what):
    (r,) = [x for x in RUN2["llama_bench"] if x["build"] == build and x["what"] == what]
    return {(row["n_prompt"], row["n_gen"]): sorted(row["samples_ts"])[1] for row in r["rows"]}  # median of 3


def test_prompt_and_decode_figures_results_quotes():
    from bench.gpu import proof_report as pr

    volta, mmq = bench("volta", "pp27"), bench("mmq", "pp27")
    assert [round(volta[(n, 0)]) for n in (128, 512, 2048)] == [1433, 3653, 3608]
    assert [round(mmq[(n, 0)]) for n in (128, 512, 2048)] == [1943, 2560, 2532]
    assert round(bench("volta", "tg27")[(0, 128)], 1) == 88.2 and round(bench("mmq", "tg27")[(0, 128)], 1) == 87.9
    serve = {s["build"]: pr.serve_table([s])[s["name"]] for s in RUN2["serve27"]}
    assert round(serve["volta"][1]["ttft_p50"][0]) == 292 and round(serve["mmq"][1]["ttft_p50"][0]) == 309
    assert round(serve["volta"][16]["ttft_p50"][0]) == 3320 and round(serve["mmq"][16]["ttft_p50"][0]) == 4024
    assert round(serve["volta"][16]["wall"][0], 1) == 216.8 and round(serve["mmq"][16]["wall"][0], 1) == 206.0
    assert {s["build"]: s["mem_after"] for s in RUN2["serve27"]} == {"volta": 22434, "mmq": 22160}
    results = (ROOT / "bench/RESULTS.md").read_text()
    for quoted in ("1,433 | 3,653 | 3,608", "1,943 | 2,560 | 2,532", "292 / 3,320", "309 / 4,024"):
        assert quoted in results, quoted


def test_the_long_probe_ran_the_64_plus_path_on_both_builds_and_agreed():
    runs = {r["build"]: r["runs"] for r in RUN2["probe"] if r["model"] == "q4ks.gguf"}
    for build in ("volta", "mmq"):
        assert len(runs[build]) == 3 and all(x["long"]["prompt_n"] == 552 for x in runs[build])
    first = runs["volta"][0]["long"]
    assert all(x["long"]["tokens"] == first["tokens"] for b in runs for x in runs[b])  # deterministic, equal
