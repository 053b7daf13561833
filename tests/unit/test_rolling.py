import pytest

from voltafleet.state.records import STATUSES, Outcome
from voltafleet.state.rolling import HostResult, RollingError, batch_results, batch_size, batches, should_stop, summary, table


def test_batch_size_counts_and_percentages():
    assert batch_size("2", 10) == 2 and batch_size(3, 10) == 3
    assert batch_size("25%", 10) == 3 and batch_size("1%", 10) == 1 and batch_size("100%", 7) == 7
    for bad in ("0", "x", "150%", "-1"):
        with pytest.raises(RollingError, match="--batch"):
            batch_size(bad, 10)


def test_canary_first_then_batches_in_inventory_order():
    assert batches(list("abcde"), ["a"], "50%") == [["a"], ["b", "c"], ["d", "e"]]
    assert batches(list("abcde"), ["c"], 3) == [["c"], ["a", "b", "d"], ["e"]]
    assert batches(list("ab"), [], 1) == [["a"], ["b"]]
    with pytest.raises(RollingError, match="canary host"):
        batches(list("ab"), ["z"], 1)


def test_canary_failure_stops_everything():
    assert "canary a did not pass" in should_stop({"a": "rolled_back"}, 50, ["a"])
    assert should_stop({"a": "passed"}, 0, ["a"]) is None


def test_fail_percent_counts_every_host_tried():
    res = {"a": "passed", "b": "passed", "c": "failed", "d": "passed"}
    assert should_stop(res, 25, ["a"]) is None          # 1 of 4 = 25 %: not above
    assert "1 of 4 hosts failed (25 % > fail percent 20 %)" in should_stop(res, 20, ["a"])
    assert should_stop({**res, "e": "unreachable"}, 25, ["a"]).startswith("2 of 5")


def rec(host, status, reason="", **kw):
    return Outcome(host=host, run="r1", status=status, reason=reason, **kw)


def row(host, batch, status="not_run", fingerprint=None, detail="", **figures):
    """A fleet report row whose figures are its outcome record's."""
    return HostResult(host, batch, status, detail, Outcome(host=host, run="r1", status=status, reason=detail,
                                                           release=fingerprint, **figures))


def test_batch_results_come_from_each_hosts_own_record():
    records = {"a": rec("a", "passed", release="f1", flags=["-c", "8192"], ttft_ms=12.0, single_tps=280.0,
                        aggregate_tps=700.0, probe="match"),
               "b": rec("b", "rolled_back", "instance 0: single-stream 3 tok/s < 5")}
    a, b = batch_results(1, ["a", "b"], records, 1, "batch-1.log")
    assert (a.status, a.single_tps, a.aggregate_tps, a.probe, a.flags) == ("passed", 280.0, 700.0, "match", ["-c", "8192"])
    assert b.status == "rolled_back" and "3 tok/s" in b.detail  # b explains pyinfra's non-zero exit


def test_a_missing_record_is_a_failure_never_a_pass():
    (r,) = batch_results(0, ["a"], {"a": None}, 0, "batch-0.log")
    assert r.status == "failed" and "no outcome record" in r.detail and "batch-0.log" in r.detail
    (r,) = batch_results(0, ["a"], {}, 1, "x.log")
    assert r.status == "failed" and "pyinfra exited 1" in r.detail


def test_a_pass_with_an_unexplained_nonzero_exit_is_a_failure():
    (a, b) = batch_results(0, ["a", "b"], {"a": rec("a", "passed"), "b": rec("b", "passed")}, 1, "x.log")
    assert a.status == b.status == "failed" and "no host of the batch recorded why" in a.detail
    # the same passes stand when pyinfra exited 0
    assert [r.status for r in batch_results(0, ["a"], {"a": rec("a", "passed")}, 0, "x.log")] == ["passed"]


def test_table_and_summary_name_every_host():
    rs = [row("a", 0, "passed", "f1", ttft_ms=5, single_tps=300, aggregate_tps=700, probe="reference"),
          row("b", 1, "rolled_back", detail="single-stream 3 tok/s < 5"), HostResult("c", 2)]
    text = table(rs)
    assert text.splitlines()[1].split()[:4] == ["a", "0", "passed", "f1"]
    assert "rolled_back" in text and "single-stream 3 tok/s" in text and "not_run" in text
    s = summary(rs, "1 of 2 hosts failed")
    assert s["ok"] is False and s["counts"]["passed"] == 1 and s["counts"]["not_run"] == 1


def test_the_table_and_the_json_agree_for_every_status():
    rs = [row(f"h{i}", i, s, f"fp{i}" if i % 2 else None, ttft_ms=10.0 * i, single_tps=1.5 * i,
              probe="match" if i % 2 else None, detail=f"why {s}") for i, s in enumerate(STATUSES)]
    rows = table(rs).splitlines()[1:]
    assert len(rows) == len(STATUSES)
    for line, r in zip(rows, rs):
        d = r.to_dict()
        cols = line.split()
        assert cols[:4] == [d["host"], str(d["batch"]), d["status"], d["fingerprint"] or "-"]
        assert line.endswith(d["detail"])


def test_the_table_shows_n_client_ttft_p50_and_p99_beside_the_single_stream():
    rs = [row("a", 0, "passed", "f1", ttft_ms=41, ttft_p50_ms=120.4, ttft_p99_ms=388.6, single_tps=30,
              aggregate_tps=80), HostResult("b", 1)]
    head, a, b = table(rs).splitlines()
    assert head.split()[4:8] == ["TTFT", "ms", "N", "p50/p99"]
    assert a.split()[4:6] == ["41", "120/389"] and b.split()[4:6] == ["-", "-"]
    rec = {"status": "passed", "reason": "", "ttft_ms": 41.0, "ttft_p50_ms": 120.4, "ttft_p99_ms": 388.6}
    (r,) = batch_results(0, ["a"], {"a": Outcome(host="a", run="r", **rec)}, 0, "x.log")
    assert (r.ttft_p50_ms, r.ttft_p99_ms) == (120.4, 388.6)


def test_a_rows_keys_are_the_fleet_reports_and_its_figures_are_its_records():
    """The fleet report's JSON keys (tests/lab, monitoring read them) are unchanged; the figures
    are read from the host's outcome record, not copied from it."""
    keys = ["host", "batch", "status", "fingerprint", "flags", "ttft_ms", "ttft_p50_ms", "ttft_p99_ms", "single_tps",
            "aggregate_tps", "probe", "restarted", "streams_cut", "detail"]
    bare = HostResult("a", 3, detail="not tried: the rollout stopped").to_dict()
    assert list(bare) == keys
    assert bare == {**dict.fromkeys(keys), "host": "a", "batch": 3, "status": "not_run", "flags": [], "restarted": [],
                    "streams_cut": 0, "detail": "not tried: the rollout stopped"}
    (r,) = batch_results(2, ["a"], {"a": rec("a", "passed", release="f1", flags=["-c", "8"], restarted=[1], streams_cut=3,
                                             ttft_ms=9.5, probe="match")}, 0, "x.log")
    d = r.to_dict()
    assert list(d) == keys and (d["fingerprint"], d["flags"], d["restarted"], d["streams_cut"], d["ttft_ms"]) == \
        ("f1", ["-c", "8"], [1], 3, 9.5)
    d["flags"].append("x")  # the report's copy, never the record's
    assert r.outcome.flags == ["-c", "8"]
    r.status, r.detail = "interrupted", "stopped"  # the driver's verdict over the record's
    assert (r.to_dict()["status"], r.outcome.status) == ("interrupted", "passed")


def test_an_unmeasured_host_is_neither_passed_nor_failed():
    # smoke_enabled: false: the host restarted and serves, nothing judged it; the record says so
    assert should_stop({"a": "unmeasured", "b": "unmeasured"}, 0, ["a"]) is None
    assert should_stop({"a": "unmeasured", "b": "failed"}, 10, ["a"]).startswith("1 of 2 hosts failed")
    rec = Outcome(host="a", run="r", status="unmeasured", reason="not measured: smoke_enabled is false",
                      probe="not run", restarted=[0, 1], streams_cut=2)
    (r,) = batch_results(0, ["a"], {"a": rec}, 0, "x.log")
    assert (r.status, r.probe, r.restarted, r.streams_cut) == ("unmeasured", "not run", [0, 1], 2)
    s = summary([r], None)
    assert s["ok"] and s["counts"]["unmeasured"] == 1 and s["counts"]["passed"] == 0 and s["streams_cut"] == 2
    row = table([r]).splitlines()[1].split()
    assert row[2] == "unmeasured" and row[8:11] == ["not-run", "0,1", "2"]
    # an unmeasured record when pyinfra failed unexplained is a failure, as a passed one is
    (bad,) = batch_results(0, ["a"], {"a": rec}, 1, "x.log")
    assert bad.status == "failed"


def test_the_first_signal_waits_for_the_run_a_second_one_stops_it():
    import signal
    import subprocess
    import sys

    from rollout.runner import Interrupt

    it = Interrupt(grace=900)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    it.child = child
    try:
        it.handle(signal.SIGTERM, None)
        assert (it.name, it.code, it.forced, it.expired()) == ("SIGTERM", 143, False, False)
        assert child.poll() is None  # the run in progress goes on
        it.handle(signal.SIGINT, None)  # a second signal: stopped now, its process group SIGTERMed
        assert it.forced and child.wait(timeout=10) == -signal.SIGTERM
        assert it.name == "SIGTERM"  # the first signal names the interrupt
    finally:
        child.kill()
    late = Interrupt(grace=0)
    late.handle(signal.SIGHUP, None)
    assert late.expired() and late.code == 129
