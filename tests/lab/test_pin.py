"""The pin gate on the lab fleet (issue 50): the lab's llama.cpp mirror holds the pin (b11312) and b11434
side by side; the gate resolves b11434 once, moves the fleet to it and back under pooled keep-alive load
with the rolling driver, checks every group's flags against the new binary's --help, reads the sm_70
compile's record (bench/records/pin50, made here with clang and CUDA 12.8's ptxas) and the GPU proof's
(bench/records/pin-gate/b11434/h200.json): the verdict the records give (`pass` with both; `incomplete`, never a
pass, without the GPU proof's)."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.lab.helpers import REPO, current_release, lab
from voltafleet.state import pingate


def test_the_gate_moves_the_fleet_to_b11434_and_back_under_load_and_says_what_it_could_not_run(converged):
    state = lab()
    before = {h["name"]: current_release(h) for h in state["hosts"]}
    run = subprocess.run([sys.executable, "-m", "rollout", "inventory/lab.py", "--pin-check", state["llama_cpp_new_ref"]],
                         cwd=REPO, capture_output=True, text=True, timeout=3000)
    out = run.stdout + run.stderr
    gate = json.loads((REPO / "reports" / sorted(p.name for p in (REPO / "reports").glob("pin-check-*"))[-1]
                       / "gate.json").read_text())
    steps = {s["name"]: s for s in gate["steps"]}
    # the GPU proof is the record kept in bench/records/pin-gate/b11434 (without it: not run, `incomplete`)
    where = f"bench/records/pin-gate/{state['llama_cpp_new_ref']}/h200.json"
    h200 = REPO / where
    proof = pingate.proof_step(json.loads(h200.read_text()) if h200.exists() else None, state["llama_cpp_new_commit"],
                               state["llama_cpp_ref"], where)
    want = {pingate.PASS: (0, "pass"), pingate.FAIL: (1, "fail"), pingate.NOT_RUN: (3, "incomplete")}[proof.status]
    assert (run.returncode, gate["verdict"]) == want, out[-3000:]
    assert gate["commit"] == state["llama_cpp_new_commit"] and gate["old_commit"] == state["llama_cpp_ref"]
    assert steps["resolve"]["status"] == "pass"
    lab_step = steps["lab-rollout"]
    assert lab_step["status"] == "pass", lab_step
    assert lab_step["figures"]["failed"] == 0 and lab_step["figures"]["requests"] > 20, lab_step["figures"]
    moved = lab_step["figures"]["releases"]["to_ref"]
    assert len(set(moved.values())) == 1 and set(moved.values()).isdisjoint(before.values())  # one new release
    assert lab_step["figures"]["releases"]["back"] == before  # each host back on its old release, kept
    assert len(lab_step["figures"]["compiled_to_ref"]) <= 1  # compiled at most once (none: the release cache had it)
    assert steps["flags"]["status"] == "pass" and "vf-lab-1" in steps["flags"]["figures"]["source"]
    # the sm_70 compile's evidence: bench/pin/sm70_compile.py's record of b11434 (clang with CUDA 12.8's ptxas)
    assert steps["sm70-compile"]["status"] == "pass" and "no nvcc" in steps["sm70-compile"]["detail"], steps["sm70-compile"]
    assert steps["sm70-compile"]["figures"]["kernels"]["mmvq"] > 0
    assert steps["h200-proof"]["status"] == proof.status and steps["h200-proof"]["detail"] == proof.detail
    assert {h["name"]: current_release(h) for h in state["hosts"]} == before
    # the move's fleet report kept the resolved commit of the tag
    report = json.loads((REPO / "reports" / f"rollout-{lab_step['figures']['to_ref']}.json").read_text())
    assert list(report["commits"].values()) == [state["llama_cpp_new_commit"]], report["commits"]
