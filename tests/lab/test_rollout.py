"""The whole rollout on the real lab fleet: real Debian hosts with systemd and sshd, real
llama.cpp built from source, a real GGUF over HTTP, the real systemd units, the real
smoke test. Each test starts from a converged fleet (the `converged` fixture) and puts
back what it changed, so the files and tests run in any order.
"""
import pytest

from lab import fleet
from tests.lab.helpers import (SERVER_HOST, build_info, compiled_here, current_release, deploy, fresh_cache, lab,
                               main_pid, report, rollout, ssh, th)


@pytest.fixture
def hosts(converged):
    return converged[:2]


def test_first_rollout_converges(first_rollout):
    run, fresh = first_rollout
    assert run.rc == 0, run
    if fresh:  # from `lab up --fresh` (as `make test` does): everything was installed and smoked
        assert run.changed > 0
        assert "smoke PASSED" in run.out


def test_every_instance_is_active_under_systemd(hosts):
    for h in hosts:
        for i in (0, 1):
            unit = th(h).service(f"llama-server@{i}.service")
            assert unit.is_running and unit.is_enabled
            assert th(h).run(f"curl -sf http://{SERVER_HOST}:{h['server_port_base'] + i}/health").rc == 0


def test_smoke_report_has_the_three_numbers(hosts):
    run = deploy(env={"VOLTAFLEET_SMOKE": "always"})  # measure the converged fleet now
    assert run.rc == 0 and "smoke PASSED" in run.out, run
    for h in hosts:
        r = report(h)
        assert r["passed"] is True and r["failures"] == []
        assert [m["port"] for m in r["instances"]] == [h["server_port_base"], h["server_port_base"] + 1]
        for m in r["instances"]:
            assert 0 < m["ttft_ms"] < 5000
            assert m["single_tps"] > 5 and m["aggregate_tps"] > 5
            assert m["parallel"] == 4 and m["errors"] == []


def test_servers_answer_with_the_model_over_ssh(hosts):
    out = ssh(hosts[0], "curl -s http://%s:%d/completion -d '{\"prompt\":\"hi\",\"n_predict\":4,\"temperature\":0}'"
              % (SERVER_HOST, hosts[0]["server_port_base"]))
    assert '"tokens_predicted":4' in out and "hello" in out


def test_second_run_changes_nothing(hosts):
    # `hosts` ran a rollout (converged); one more must change nothing
    run = deploy()
    assert run.rc == 0, run
    assert run.changed == 0, run


def test_shared_strategy_compiled_exactly_once(hosts):
    every = lab()["hosts"]
    fps = {current_release(h) for h in every}
    assert len(fps) == 1
    fp = fps.pop()
    compiles = [h["name"] for h in every if fp in compiled_here(h)]
    assert compiles == [hosts[0]["name"]]
    assert {build_info(h)["built_on"] for h in every} == {hosts[0]["name"]}


@pytest.fixture
def joining_host(hosts):
    """A fresh lab host (vf-lab-5) that joins the fleet, taken away again afterwards."""
    fleet.remove_host(5)
    yield fleet.add_host(5)
    fleet.remove_host(5)
    deploy()  # the gateway forgets its instances


def test_host_joining_later_gets_the_release_without_compiling(hosts, joining_host):
    third = joining_host
    run = deploy()
    assert run.rc == 0, run
    fp = current_release(hosts[0])
    assert current_release(third) == fp
    assert compiled_here(third) == []
    assert build_info(third)["built_on"] == hosts[0]["name"]
    assert ssh(third, "systemctl is-active llama-server@0.service llama-server@1.service").split() == ["active"] * 2
    # still exactly one compile in the whole fleet
    assert sum(fp in compiled_here(h) for h in lab()["hosts"]) == 1


def test_changed_ref_and_cmake_flag_rebuild_once_and_switch_every_host(converged, tmp_path):
    """Through a rolling rollout, one host a batch: the canary compiles, every later batch
    installs the release from the controller's cache (one compile for the whole fleet). The
    new ref comes with an extra CMake flag, which reaches the build (both are fingerprint
    inputs: tests/unit/test_fingerprint.py changes each alone)."""
    all_hosts = lab()["hosts"]
    before = current_release(all_hosts[0])
    pids = {h["name"]: main_pid(h, 0) for h in all_hosts}
    new = {"llama_cpp_ref": lab()["llama_cpp_next_ref"], "llama_cpp_cmake_extra": ["-DLLAMA_BUILD_COMMON=ON"]}
    run, report = rollout(["--batch", "1"], vars=new, tmp=tmp_path, env=fresh_cache(tmp_path))
    assert run.rc == 0 and report["ok"], run
    after = {current_release(h) for h in all_hosts}
    assert len(after) == 1 and before not in after
    fp = after.pop()
    assert sum(fp in compiled_here(h) for h in all_hosts) == 1
    for h in all_hosts:
        assert build_info(h)["commit"] == lab()["llama_cpp_next_commit"]
        assert "-DLLAMA_BUILD_COMMON=ON" in build_info(h)["flags"]
        assert main_pid(h, 0) != pids[h["name"]]  # restarted onto the new binary
        assert ssh(h, f"test -d /opt/voltafleet/releases/{before} && echo kept") == "kept"  # previous kept
    assert deploy(new, tmp_path).changed == 0
    # back to the pinned ref: a switch to the kept release, no compile
    builds = {h["name"]: compiled_here(h) for h in all_hosts}
    run = deploy()
    assert run.rc == 0, run
    assert "compiling llama.cpp" not in run.out
    assert {build_info(h)["commit"] for h in all_hosts} == {lab()["llama_cpp_ref"]}
    assert {h["name"]: compiled_here(h) for h in all_hosts} == builds


def test_failed_build_never_touches_current_or_the_servers(converged, tmp_path):
    all_hosts = lab()["hosts"]
    before = {h["name"]: (current_release(h), main_pid(h, 0)) for h in all_hosts}
    run = deploy({"llama_cpp_targets": ["llama-server", "no-such-target"]}, tmp_path)
    assert run.rc != 0
    assert "voltafleet: build failed, log in" in run.out and "current release untouched" in run.out
    for h in all_hosts:
        assert (current_release(h), main_pid(h, 0)) == before[h["name"]]
        assert ssh(h, f"curl -sf http://{SERVER_HOST}:{h['server_port_base']}/health")
    run = deploy()
    assert run.rc == 0 and run.changed == 0, run


def test_bad_ref_is_refused_before_any_change(converged, tmp_path):
    h = lab()["hosts"][0]
    before, pid = current_release(h), main_pid(h, 0)
    run = deploy({"llama_cpp_ref": "no-such-tag"}, tmp_path)
    assert run.rc != 0
    assert "llama_cpp_ref: 'no-such-tag' is not a tag, branch or commit" in run.out
    assert current_release(h) == before and main_pid(h, 0) == pid
    assert ssh(h, f"curl -sf http://{SERVER_HOST}:{h['server_port_base']}/health")


def test_failed_smoke_rolls_back_to_the_last_good_flags(converged, tmp_path):
    h = lab()["hosts"][0]
    env_before = ssh(h, "cat /etc/voltafleet/llama-server/0.env")
    # a flag change (restart + smoke) with a threshold no server can meet
    run = deploy({"server_ctx_checkpoints": 16, "smoke_min_single_tps": 1000000}, tmp_path)
    assert run.rc != 0
    assert "single-stream" in run.out and "rolled back" in run.out
    assert ssh(h, "cat /etc/voltafleet/llama-server/0.env") == env_before
    assert ssh(h, "systemctl is-active llama-server@0.service") == "active"
    assert ssh(h, f"curl -sf http://{SERVER_HOST}:{h['server_port_base']}/health")
    # the fleet converges again with the unchanged config
    run = deploy()
    assert run.rc == 0 and run.changed == 0, run


WRAPPER = "/usr/local/bin/c++"


def test_a_toolchain_upgrade_rebuilds_exactly_once_per_fingerprint(converged, tmp_path):
    """Issue 12's toolkit upgrade, through the fingerprint input the lab has: every host's
    C++ toolchain reports a new version (as nvcc 12.8 -> 12.9 would on a CUDA fleet); the
    fleet gets one compile, shipped to the other hosts; back, it switches without one."""
    every = lab()["hosts"]
    before = current_release(every[0])
    script = '#!/bin/sh\n[ "$1" = -dumpfullversion ] && { echo 12.2.1; exit 0; }\nexec /usr/bin/c++ "$@"\n'
    try:
        for h in every:
            ssh(h, f"printf '{script}' > {WRAPPER} && chmod 755 {WRAPPER}")
        run = deploy(tmp=tmp_path, env=fresh_cache(tmp_path))
        assert run.rc == 0, run
        after = {current_release(h) for h in every}
        assert len(after) == 1 and before not in after
        fp = after.pop()
        assert sum(fp in compiled_here(h) for h in every) == 1
        assert {build_info(h)["compiler"].split()[0] for h in every} == {"12.2.1"}
    finally:
        for h in every:
            ssh(h, f"rm -f {WRAPPER}")
    run = deploy()
    assert run.rc == 0 and "compiling llama.cpp" not in run.out, run
    assert {current_release(h) for h in every} == {before}
