"""The pin gate's steps and verdict (voltafleet/state/pingate.py, issue 50): a step passes only on its own
evidence, a step not run never makes a pass, and each refusal says why."""
from __future__ import annotations

import pytest

from voltafleet.state import pingate
from voltafleet.state.pingate import FAIL, NOT_RUN, PASS, Step

NEW, OLD = "6b0958fe153a3dcc31f6616835d6f2c3119d7d3f", "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


def all_pass() -> list[Step]:
    return [Step(name, PASS) for name in pingate.STEPS]


def test_the_verdict_is_pass_only_when_every_step_passed():
    assert pingate.verdict(all_pass()) == PASS
    steps = all_pass()
    steps[1] = Step("sm70-compile", NOT_RUN, "no CUDA 12.x nvcc")
    assert pingate.verdict(steps) == "incomplete"
    steps[2] = Step("flags", FAIL, "--defrag-thold removed")
    assert pingate.verdict(steps) == FAIL
    assert pingate.verdict(all_pass()[:-1]) == FAIL  # a missing step is no pass
    assert pingate.verdict([]) == FAIL


def test_resolve_refuses_an_unknown_ref_or_the_pin_itself():
    assert pingate.resolve_step("b11434", NEW, "b11312", OLD).status == PASS
    assert pingate.resolve_step("b11434", None, "b11312", OLD, "llama_cpp_ref: 'b11434' is not a tag").status == FAIL
    same = pingate.resolve_step("b11312", OLD, "b11312", OLD)
    assert same.status == FAIL and "already" in same.detail


def sm70(**over) -> dict:
    return {"commit": NEW, "nvcc_version": "12.8.93", "rc": 0, "linked": True, "seconds": 812,
            "kernels_sm70": ["_Z12mul_mat_vec_qIL9ggml_type12E", "_Z9mul_mat_qIL9ggml_type12E",
                             "_Z15flash_attn_ext_vecILi256E"], **over}


def test_the_sm70_evidence_must_be_this_commit_cuda_12_linked_with_every_kernel_family():
    assert pingate.sm70_step(None, NEW, "x/sm70.json").status == NOT_RUN
    ok = pingate.sm70_step(sm70(), NEW, "x")
    assert ok.status == PASS and ok.figures["kernels"] == {"mmq": 1, "mmvq": 1, "fattn": 1}
    for over, why in [({"commit": OLD}, "is not 6b0958fe153a"), ({"nvcc_version": "13.0.88"}, "not CUDA 12.x"),
                      ({"rc": 2}, "failed"), ({"linked": False}, "failed"),
                      ({"kernels_sm70": ["_Z12mul_mat_vec_q"]}, "no sm_70 mmq kernel")]:
        bad = pingate.sm70_step(sm70(**over), NEW, "x")
        assert bad.status == FAIL and why in bad.detail, (over, bad.detail)


def test_flags_fail_naming_the_group_and_are_not_run_without_a_binary():
    assert pingate.flags_step({}, None).status == NOT_RUN
    assert pingate.flags_step({"lab": [], "v100_32gb": []}, "vf-lab-1:--help").status == PASS
    bad = pingate.flags_step({"lab": [], "v100_32gb": ["--defrag-thold: removed; use nothing"]}, "h")
    assert bad.status == FAIL and bad.detail.startswith("v100_32gb: --defrag-thold")


def proof(new: dict, old: dict, **over) -> dict:
    good = {"vram_plan_never_under": True, "golden_probe": True, "guard_64": True, "volta_choice": True}
    return {"sides": {NEW: {**good, **new}, OLD: {**good, **old}}, **over}


def test_the_h200_proof_needs_both_sides_and_no_loss_beyond_noise():
    assert pingate.proof_step(None, NEW, OLD, "x").status == NOT_RUN
    assert pingate.proof_step(proof({"tok_s_16": 310, "tok_s_1": 84}, {"tok_s_16": 300, "tok_s_1": 84}), NEW, OLD,
                              "x").status == PASS
    worse = pingate.proof_step(proof({"tok_s_16": 280, "tok_s_1": 84}, {"tok_s_16": 300, "tok_s_1": 84}), NEW, OLD, "x")
    assert worse.status == FAIL and "tok_s_16" in worse.detail
    probe = pingate.proof_step(proof({"tok_s_16": 300, "tok_s_1": 84, "golden_probe": False},
                                     {"tok_s_16": 300, "tok_s_1": 84}), NEW, OLD, "x")
    assert probe.status == FAIL and "golden_probe" in probe.detail
    assert pingate.proof_step({"sides": {NEW: {}}}, NEW, OLD, "x").status == FAIL
    stock = pingate.proof_step(proof({"tok_s_16": 300, "tok_s_1": 84, "volta_choice": False}, {"tok_s_16": 300, "tok_s_1": 84}),
                               NEW, OLD, "x")
    assert stock.status == FAIL and "new side did not run the shipped build" in stock.detail


@pytest.mark.parametrize("case, why", [
    ({"load": {"requests": 900, "failed": 1}}, "1 of 900 requests failed"),
    ({"load": {"requests": 0, "failed": 0}}, "0 of 0"),
    ({"moved": {"h1": "new", "h2": "old"}}, "not on the ref's release after the move: h2"),
    ({"back": {"h1": "old", "h2": "new"}}, "not back on the old release: h2"),
    ({"rebuilt": ["h1"]}, "compiled again on the way back"),
    ({"ok": (True, False)}, "a rollout failed"),
])
def test_the_lab_step_fails_on_any_lost_request_wrong_release_or_rebuild(case, why):
    args = {"load": {"requests": 900, "failed": 0}, "moved": {"h1": "new", "h2": "new"},
            "back": {"h1": "old", "h2": "old"}, "rebuilt": [], "ok": (True, True), **case}
    step = pingate.lab_step(args["load"], args["moved"], args["back"], {"h1": "new", "h2": "new"},
                            {"h1": "old", "h2": "old"}, args["rebuilt"], args["ok"])
    assert step.status == FAIL and why in step.detail, step.detail


def test_the_lab_step_passes_with_every_host_moved_and_back_and_no_request_lost():
    step = pingate.lab_step({"requests": 900, "failed": 0}, {"h1": "new"}, {"h1": "old"}, {"h1": "new"}, {"h1": "old"},
                            [], (True, True))
    assert step.status == PASS and "900 requests" in step.detail


def test_every_groups_argv_is_checked_against_the_new_binarys_help():
    from rollout import pingate as gate
    from voltafleet.planning import flags

    text = flags.pinned_help("0c1e57098bba")
    assert set(gate.check_flags(text)) == set(gate.GROUPS) and not any(gate.check_flags(text).values())
    # a --help where -np/--parallel is gone: every group's argv is refused, naming it
    cut = "\n".join(line for line in text.splitlines() if "--parallel" not in line)
    assert all(any(p.startswith("-np") for p in problems) for problems in gate.check_flags(cut).values())
    argv = gate.group_argv("v100_32gb")
    assert "--api-key-file" in argv and "-md" in argv  # the optional flags are checked too


def test_the_b11434_record_is_what_results_md_says():
    """bench/RESULTS.md's issue 50 table, read back from the gate's record (bench/records/pin-gate/b11434)."""
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    gate = json.loads((root / "bench/records/pin-gate/b11434/gate.json").read_text())
    steps = {s["name"]: s for s in gate["steps"]}
    assert gate["verdict"] == pingate.verdict([Step(s["name"], s["status"]) for s in gate["steps"]]) == "pass"
    text = (root / "bench/RESULTS.md").read_text()
    table = text[text.index("## Issue 50: the pin gate"):]
    rows = dict(re.findall(r"^\| (resolve|sm70-compile|flags|h200-proof|lab-rollout) \| (pass|not run|fail) \|", table, re.M))
    assert rows == {n: s["status"].replace("-", " ") for n, s in steps.items()}, rows
    lab = steps["lab-rollout"]["figures"]
    assert f"{lab['requests']} requests from 3 pooled keep-alive clients, {lab['failed']} failed" in table
    assert lab["summary"]["cut"] == 0 and gate["commit"].startswith("6b0958fe153a") and gate["old_commit"].startswith("0c1e57098bba")
    new = {line.split()[0] for line in (root / "bench/records/pin-gate/b11434/llama-server-help.txt").read_text().splitlines()
           if line.startswith("-")}
    assert "--spec-draft-sampling" in {n.rstrip(",") for n in new}


def clang_record(tmp, names=("_ZL9mul_mat_qIL9ggml_type12E", "_ZL13mul_mat_vec_qIL9ggml_type12E",
                             "_ZL15flash_attn_ext_f16ILi256E"), **over):
    """bench/pin/sm70_compile.py's record (the fields the gate reads) and its kernel list, under tmp."""
    import hashlib

    tsv = tmp / "b11434-kernels.tsv"
    tsv.write_text("# group\tarch\treg\tstack\tshared\tlocal\tname\n"
                   + "".join(f"x\tsm_70\t1\t0\t0\t0\t{n}\n" for n in names))
    rec = {"step": "sm70-compile", "ref": "b11434", "status": "pass", "build_rc": 0, "linked": True, "unresolved": [],
           "elf_archs": ["sm_70"], "seconds": {"total": 3177.7}, "kernel_list": str(tsv),
           "kernel_list_sha256": hashlib.sha256(tsv.read_bytes()).hexdigest(),
           "source": {"commit": None, "lab_commit": NEW},
           "toolchain": {"cuda_compiler": "clang 19.1.7 (CUDA mode)", "ptxas_version": "12.8.93", "nvcc_version": None}}
    return {**rec, **over}


def test_the_clang_compile_s_record_is_evidence_that_names_its_compiler(tmp_path, monkeypatch):
    """bench/pin/sm70_compile.py's record (clang in CUDA mode, CUDA 12.8's ptxas: no 12.x wheel ships nvcc) passes
    the step naming its compiler; its kernels are counted from its kept list, which must be the one it hashed."""
    import json

    from rollout import pingate as driver

    monkeypatch.setattr(driver, "COMPILE_RECORDS", tmp_path)
    (tmp_path / "b11434.json").write_text(json.dumps(clang_record(tmp_path)))
    ev, where = driver.sm70_evidence(tmp_path / "none", "b11434")
    ok = pingate.sm70_step(ev, NEW, where)
    assert ok.status == PASS and "clang 19.1.7" in ok.detail and "no nvcc" in ok.detail, ok.detail
    assert ok.figures["kernels"] == {"mmq": 1, "mmvq": 1, "fattn": 1} and where.endswith("b11434.json")
    # an sm70.json beside the gate's other evidence (an nvcc 12.x compile) is taken first
    (tmp_path / "ev").mkdir()
    (tmp_path / "ev/sm70.json").write_text(json.dumps(sm70()))
    ev, where = driver.sm70_evidence(tmp_path / "ev", "b11434")
    assert "compiler" not in ev and pingate.sm70_step(ev, NEW, where).detail.startswith("nvcc 12.8.93")
    # a kernel list edited after the record: no kernels counted
    (tmp_path / "b11434-kernels.tsv").write_text("x\tsm_70\t1\t0\t0\t0\t_ZL9mul_mat_qIL9ggml_type12E\n")
    ev, where = driver.sm70_evidence(tmp_path / "none", "b11434")
    assert pingate.sm70_step(ev, NEW, where).status == FAIL and ev["kernels_sm70"] == []
    assert driver.sm70_evidence(tmp_path / "none", "b99999") == (None, str(tmp_path / "none/sm70.json"))


def test_a_clang_record_of_another_source_an_unlinked_build_or_other_archs_fails(tmp_path):
    names = ["_ZL9mul_mat_qI", "_ZL13mul_mat_vec_qI", "_ZL15flash_attn_ext_f16I"]
    assert pingate.sm70_step(pingate.sm70_evidence(clang_record(tmp_path), names), NEW, "x").status == PASS
    for over, why in [({"source": {"lab_commit": OLD}}, "is not 6b0958fe153a"), ({"build_rc": 2}, "failed"),
                      ({"unresolved": ["cuMemCreate"]}, "failed"), ({"elf_archs": ["sm_70", "sm_80"]}, "failed"),
                      ({"toolchain": {"cuda_compiler": "clang", "ptxas_version": "13.0.88"}}, "ptxas 13.0.88 is not CUDA 12.x")]:
        bad = pingate.sm70_step(pingate.sm70_evidence(clang_record(tmp_path, **over), names), NEW, "x")
        assert bad.status == FAIL and why in bad.detail, (over, bad.detail)


def test_the_kept_records_of_both_pins_pass_the_step():
    """The records this repository keeps (bench/records/pin50): each pin's compile is evidence for its commit."""
    from pathlib import Path

    from rollout import pingate as driver

    for ref, commit in (("b11434", NEW), ("b11312", OLD)):
        ev, where = driver.sm70_evidence(Path("bench/records/pin-gate") / ref, ref)
        s = pingate.sm70_step(ev, commit, where)
        assert s.status == PASS and where == f"bench/records/pin50/{ref}.json", s.detail
        assert s.figures["kernels"]["mmvq"] == 317 and s.figures["kernels"]["mmq"] == 1536, s.figures
