"""Rolling rollouts on the lab fleet (3 server hosts and the HAProxy gateway): canary,
batches, fail percent, rollback of one host, the fleet report. Each test starts from the
converged fleet and leaves it converged."""
from tests.lab.helpers import deploy, env_file, pids, rollout, ssh


def test_one_host_failing_its_smoke_test_rolls_back_and_the_rest_succeed(three, tmp_path):
    bad = three[1]
    before = env_file(bad)
    run, report = rollout(["--batch", "1", "--fail-percent", "50"], vars={"server_ctx_checkpoints": 16},
                          host_vars={bad["name"]: {"smoke_min_single_tps": 1000000}}, tmp=tmp_path)
    assert run.rc == 1, run
    status = {h["host"]: h for h in report["hosts"]}
    assert status[bad["name"]]["status"] == "rolled_back"
    assert "single-stream" in status[bad["name"]]["detail"]
    assert [status[h["name"]]["status"] for h in (three[0], three[2])] == ["passed", "passed"]
    assert env_file(bad) == before                                   # its old flags serve again
    assert ssh(bad, "systemctl is-active llama-server@0.service") == "active"
    assert "--ctx-checkpoints 16" in env_file(three[2])                              # the batch after it still rolled
    assert bad["name"] in run.out and "rolled_back" in run.out
    assert not report["ok"] and report["counts"]["rolled_back"] == 1
    assert deploy().rc == 0  # back to the repository's configuration


def test_a_failing_canary_stops_the_rollout_before_any_other_host_changes(three, tmp_path):
    canary, others = three[0], three[1:]
    before = {h["name"]: env_file(h) for h in others}
    before_pids = pids(others)
    run, report = rollout(["--batch", "1"], vars={"server_ctx_checkpoints": 16},
                          host_vars={canary["name"]: {"smoke_min_single_tps": 1000000}}, tmp=tmp_path)
    assert run.rc == 1, run
    assert "canary vf-lab-1 did not pass" in run.out
    assert [h["status"] for h in report["hosts"]] == ["rolled_back", "not_run", "not_run"]
    assert {h["name"]: env_file(h) for h in others} == before and pids(others) == before_pids
    assert deploy().rc == 0


def test_preflight_refusal_on_one_host_stops_everything_before_any_change(three, tmp_path):
    before = pids(three)
    run, report = rollout(["--batch", "1"], host_vars={three[2]["name"]: {"preflight_build_disk_gb": 100000}},
                          tmp=tmp_path)
    assert run.rc == 2, run
    assert "preflight refused the rollout: no host was changed" in run.out
    assert "GiB free" in run.out and report == {}
    assert pids(three) == before


def test_smoke_disabled_records_unmeasured_and_the_probe_not_run(converged, tmp_path):
    """smoke_enabled: false restarts what changed and measures nothing: each host's record says
    `unmeasured` and probe `not run` (never `passed`, never `match`); the report's restarted and
    cut columns come from the records."""
    try:
        run, report = rollout(["--batch", "2"], vars={"smoke_enabled": False, "server_ctx_checkpoints": 16},
                              tmp=tmp_path)
        assert run.rc == 0, run
        assert "3 host(s) unmeasured: smoke_enabled is false" in run.out
        for h in report["hosts"]:
            assert (h["status"], h["probe"], h["restarted"], h["streams_cut"]) == ("unmeasured", "not run", [0, 1], 0), h
        assert report["counts"]["passed"] == 0 and report["counts"]["unmeasured"] == 3 and report["ok"]
    finally:
        assert deploy().rc == 0
