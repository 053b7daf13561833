"""Calibrating the plan's timeline from a real rollout (voltafleet.state.calibrate): the figures a
rollout leaves in its run directory, and the plan's estimate beside each run's wall time."""
import json

from voltafleet.state import calibrate, records
from voltafleet.state.runctx import RunDir
from voltafleet.planning.timeline import Constants, Work, estimate


def fixture(tmp_path):
    """A plan of two batches and the rollout that followed it."""
    work = {h: Work(h, restarts=2, instances=2, consts=Constants(run_s=2, drain_s=0.5, restart_s=1, smoke_s=2))
            for h in ("a", "b")}
    plan = {"estimate": estimate([["a"], ["b"]], work, gateway=True).to_dict()}
    report = {"runs": {"preflight": 2.5, "gateway": 2.0, "batch-0": 8.0, "batch-1": 9.0}}
    run_dir = tmp_path / "rollout-x"
    d = RunDir(run_dir)
    (run_dir / "batch-0.log").parent.mkdir(parents=True)  # the logs' progress lines are for people: not read
    (run_dir / "batch-0.log").write_text("    voltafleet: release 3f2a built in 999 s\n"
                                         "    voltafleet: downloading m.gguf: 3000 MiB, 999 MiB/s\n")
    d.write(records.Build(host="a", run="b0", fingerprint="3f2a", built=True, seconds=228))
    d.write(records.Build(host="b", run="b1", fingerprint="3f2a", built=False, seconds=4.0, source="a"))  # no compile
    d.write(records.Fetch(host="a", run="b0", downloads=(records.Download("/m/m.gguf", 3000 * 2**20, 30.0),)))
    d.write(records.Fetch(host="b", run="b1", downloads=(records.Download("/m/m.gguf", 6000 * 2**20, 50.0),
                                                         records.Download("/m/d.gguf", 0, 0.1))))  # whole: no rate
    for host, restarts in (("a", [1.0, 1.2]), ("b", [0.8, 1.4])):
        d.write(records.Smoke(host=host, run=f"r-{host}", passed=True, failures=[],
                              timings=records.Timings(drain_s=[0.1, 0.3], restart_s=restarts, smoke_s=2.4)))
    return plan, report, run_dir


def test_measured_figures_come_from_the_records_never_the_logs(tmp_path):
    plan, report, run_dir = fixture(tmp_path)
    s = calibrate.suggestions(plan, report, run_dir)
    assert s["plan_compile_s"] == (228, 1) and s["plan_model_mib_s"] == (110, 2)
    assert s["plan_restart_s"] == (1.1, 4) and s["plan_drain_s"] == (0.2, 4) and s["plan_smoke_s"] == (2.4, 2)
    # batch-0 took 8 s, its steps were estimated at 2 x (0.5 + 1) + 2 = 5 s: 3 s left for the run itself
    assert calibrate.run_residuals(plan, report) == [3.0, 4.0]
    assert s["plan_run_s"] == (3.0, 3)  # 3, 4 and the preflight run's 2.5


def test_each_run_estimated_beside_measured(tmp_path):
    plan, report, run_dir = fixture(tmp_path)
    assert calibrate.runs(plan, report) == [("preflight", 2, 2.5), ("gateway", 2, 2.0), ("batch-0", 7.0, 8.0),
                                            ("batch-1", 7.0, 9.0)]
    text = calibrate.report_text(plan, report, run_dir)
    assert ["batch-1", "7.0", "9.0", "1.29"] in [line.split() for line in text.splitlines()]
    assert ["plan_compile_s:", "228", "#", "1", "measurement(s)"] in [line.split() for line in text.splitlines()]


def test_the_command_reads_the_run_directory_beside_the_report(tmp_path, capsys):
    plan, report, run_dir = fixture(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "rollout-x.json").write_text(json.dumps(report))
    assert calibrate.main([str(tmp_path / "plan.json"), str(tmp_path / "rollout-x.json")]) == 0
    assert "plan_restart_s:    1.1" in capsys.readouterr().out
    assert calibrate.main([]) == 2
