"""The typed records of a run (voltafleet/state/records.py) through RunDir: they round-trip, a record of
another run, a malformed one or one of the wrong types reads as no record, a writer's mistake is
refused before anything is written, and a refusal survives to the driver."""
import json

import pytest

from voltafleet.state import records
from voltafleet.measure import tune
from voltafleet.state.fleetplan import ServerEntry
from voltafleet.state.runctx import RunDir


def test_a_refusal_survives_the_round_trip_and_is_no_fleet_plan_entry(tmp_path):
    d = RunDir(tmp_path)
    why = "gpu-01: the model does not fit one GPU: short by 94 MiB. Fix: lower server_ctx"
    d.write(records.Preflight(host="gpu-01", run="t1", address="10.0.0.1", ports=(8080,), refusals=(why, "second")))
    rec = d.read(records.Preflight, "gpu-01", "t1")
    assert rec.refusals == (why, "second") and rec.entry() is None and records.entry(rec) is None
    with pytest.raises(TypeError, match="typed records only"):  # no raw mapping to decode by hand
        d.read("preflight", "gpu-01", "t1")
    assert tune.unmeasured(rec, 1, "trial-0.log") == ("refused", why)   # a tune trial's status, from the record
    assert tune.unmeasured(None, 1, "trial-0.log") == ("failed", "no tune record (pyinfra exit 1; see trial-0.log)")
    passed = records.Preflight(host="gpu-01", run="t2", address="10.0.0.1", ports=(8080,))
    assert tune.unmeasured(passed, 1, "x.log")[0] == "failed"
    assert passed.entry() == ServerEntry("gpu-01", "10.0.0.1", (8080,))


def test_another_runs_a_malformed_or_a_mistyped_record_is_no_record(tmp_path):
    d = RunDir(tmp_path)
    d.write(records.Outcome(host="a", run="r1", status="passed", ttft_ms=12))
    assert d.read(records.Outcome, "a", "r1").ttft_ms == 12 and d.read(records.Outcome, "a", "r2") is None
    good = json.loads(d.file(records.Outcome, "a").read_text())
    for bad in ({**good, "status": "ok"},            # not a status
                {**good, "streams_cut": "0"},         # a number as text
                {**good, "converged": 1},             # an int is no bool
                {**good, "ttft_ms": True},            # a bool is no number
                {k: v for k, v in good.items() if k != "status"},  # no verdict: never a default one
                [good]):                              # not a mapping
        d.file(records.Outcome, "a").write_text(json.dumps(bad))
        assert d.read(records.Outcome, "a", "r1") is None and d.read(records.Outcome, "a") is None, bad
    d.file(records.Outcome, "a").write_text(json.dumps({**good, "added_later": 1}))
    assert d.read(records.Outcome, "a", "r1").status == "passed"  # a newer writer's field is skipped


def test_a_record_that_would_not_read_back_is_never_written(tmp_path):
    d = RunDir(tmp_path)
    with pytest.raises(records.RecordError, match="preflight.ports"):
        d.write(records.Preflight(host="h", run="r", address="a", ports=("8080",)))
    with pytest.raises(records.RecordError, match="no field typo"):
        records.Tune.make({"host": "h", "run": "r", "status": "failed", "typo": 1})
    assert records.Tune.of({"host": "h", "run": "r", "status": "failed", "typo": 1}).status == "failed"
    assert not list(tmp_path.iterdir())


def smoke_report(passed: bool) -> dict:
    """smoke-<host>.json as roles/smoke and roles/activation build it: the client's report, judged."""
    report = {"instances": [{"port": 8080, "health_s": 0.1, "ttft_ms": 41.0, "single_tps": 30.5, "aggregate_tps": 80.0,
                             "parallel": 4, "errors": [], "probe": {"tokens": [1, 2], "logprobs": [-0.1, -0.2]},
                             "instance": 0},
                            {"port": 8081, "error": "TimeoutError: not ready after 5s", "instance": 1}],
              "probe_diverged": None, "gpu_health": {"gpus": [], "warnings": [], "refusals": []},
              "probe_only_failures": False, "judged": {"0": {"single_tps": 30.5, "client_tps": 30.5}},
              "disagreements": []}
    report.update(timings={"drain_s": [0.12], "restart_s": [3.4], "smoke_s": 9.87}, host="gpu-01", fingerprint="fp1",
                  batch="0", run="r1", time="2026-05-01T10:00:00+0000", epoch=1777629600.5,
                  flags=["-m", "/m.gguf", "-c", "8192"],
                  thresholds={"smoke_max_ttft_ms": 2000, "smoke_min_single_tps": 5, "smoke_min_aggregate_tps": None})
    if passed:
        report.update(passed=True, failures=[])
    else:
        report.update(after_rollback={"passed": True, "failures": [], "fingerprint": "fp0", "instances": []})
        report.update(passed=False, failures=["instance 1: not ready"], rolled_back=True)
    return report


@pytest.mark.parametrize("passed", [True, False])
def test_the_smoke_report_is_a_typed_record_with_its_keys_on_disk(tmp_path, passed):
    d = RunDir(tmp_path)
    d.write(records.Smoke.make(smoke_report(passed)))
    on_disk = json.loads(d.file(records.Smoke, "gpu-01").read_text())
    assert {k: on_disk[k] for k in smoke_report(passed)} == smoke_report(passed)  # every key as the roles wrote it
    rec = d.read(records.Smoke, "gpu-01", "r1")
    assert rec.passed is passed and rec.timings.restart_s == [3.4] and rec.instances[0]["ttft_ms"] == 41.0
    assert rec.rolled_back is not passed
    # a smoke test that never ran (smoke_enabled: false, or the client failed): no figures, still a record
    bare = {"instances": [], "timings": {"drain_s": [], "restart_s": [], "smoke_s": None}, "host": "h", "run": "r",
            "fingerprint": None, "batch": None, "time": "t", "epoch": 1.0, "flags": [], "thresholds": {},
            "passed": True, "failures": []}
    assert records.Smoke.make(bare).timings.smoke_s is None


def test_a_tune_record_is_its_trial(tmp_path):
    setting = tune.Setting("slots 8", {"server_parallel": 8})
    doc = {"host": "gpu-01", "run": "r1", "status": "measured", "reason": "", "probe": "match",
           "reps": [{"throughput_tps": 80.0, "ttft_p50_ms": 100.0}], "loaded_mib": 1000.0, "after_load_mib": None,
           "planned_mib": 1200.5, "planned_static_mib": 900.0, "gpu": {"name": "H200", "memory_mib": 143771}}
    RunDir(tmp_path).write(records.Tune.make(doc))
    rec = RunDir(tmp_path).read(records.Tune, "gpu-01", "r1")
    assert tune.Trial.of(setting, rec, seconds=3.0) == tune.Trial.of(setting, doc, seconds=3.0)
    assert tune.Trial.of(setting, rec).figures()["throughput_tps"] == 80.0 and rec.gpu["memory_mib"] == 143771
    assert tune.Trial.of(setting, None).status == "failed"  # no record: failed, never measured


def test_a_plan_records_instances_are_numbers_again_after_json(tmp_path):
    from voltafleet.state import dryrun

    change = dryrun.HostChange(host="@fake/a", flags={1: ["-t 1 -> 2"]}, restart=[1], run="p1")
    dryrun.write(tmp_path, change)
    assert json.loads(RunDir(tmp_path).file("plan", "@fake/a").read_text())["flags"] == {"1": ["-t 1 -> 2"]}
    assert dryrun.read(tmp_path, "@fake/a") == change == records.read(tmp_path, records.HostChange, "@fake/a", "p1")
    assert records.read(tmp_path, records.HostChange, "@fake/a", "p2") is None
    assert dryrun.HostChange is records.HostChange


def test_a_fetch_record_holds_each_download_and_its_rate():
    rec = records.Fetch.of({"host": "h", "run": "r", "downloads": [{"dest": "/m/a.gguf", "bytes": 200 * 2**20,
                                                                     "seconds": 2.0}]})
    assert rec.downloads == (records.Download("/m/a.gguf", 200 * 2**20, 2.0),) and rec.downloads[0].mib_s == 100.0
    assert records.Download("/m/a.gguf", 0, 2.0).mib_s is None  # nothing downloaded: no rate
    assert records.Fetch.of({"host": "h", "run": "r", "downloads": [{"dest": "/m/a.gguf", "bytes": "1", "seconds": 1}]}) \
        is None
