import pytest

from voltafleet.rolling import HostResult, RollingError, batch_size, batches, host_result, should_stop, summary, table


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


def test_host_result_merges_status_smoke_and_errors():
    smoke = {"fingerprint": "f1", "instances": [{"instance": 0, "ttft_ms": 12.0, "single_tps": 300.0,
                                                  "aggregate_tps": 700.0}],
             "judged": {"0": {"single_tps": 280.0}}, "probe": {"verdict": "match"}}
    r = host_result("h", 1, smoke, {"ok": True, "fingerprint": "f1", "flags": ["-c", "8192"]}, None)
    assert (r.status, r.single_tps, r.aggregate_tps, r.probe, r.flags) == ("passed", 280.0, 700.0, "match", ["-c", "8192"])
    rolled = host_result("h", 1, {**smoke, "rolled_back": True, "failures": ["too slow"]}, None, "Error: smoke")
    assert rolled.status == "rolled_back" and "too slow" in rolled.detail
    assert host_result("h", 2, None, None, "[h] Could not connect (timeout)").status == "unreachable"
    assert host_result("h", 2, None, None, None).detail == "no status (see the log)"


def test_table_and_summary_name_every_host():
    rs = [HostResult("a", 0, "passed", "f1", ttft_ms=5, single_tps=300, aggregate_tps=700, probe="reference"),
          HostResult("b", 1, "rolled_back", detail="single-stream 3 tok/s < 5"), HostResult("c", 2)]
    text = table(rs)
    assert text.splitlines()[1].split()[:4] == ["a", "0", "passed", "f1"]
    assert "rolled_back" in text and "single-stream 3 tok/s" in text and "not_run" in text
    s = summary(rs, "1 of 2 hosts failed")
    assert s["ok"] is False and s["counts"]["passed"] == 1 and s["counts"]["not_run"] == 1
