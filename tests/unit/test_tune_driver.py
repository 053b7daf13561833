"""The --tune driver (rollout/tune.py) learns each trial's status from the trial run's records:
its tune record (measured), its preflight record (refused, with preflight's own first refusal)
or neither (failed); never from the text of the run's log."""
from types import SimpleNamespace

from rollout.fleet import Fleet
from rollout.tune import Tune
from voltafleet.state import records
from voltafleet.measure import tune as tunemod
from voltafleet.state.runctx import RunContext, RunDir

WHY = "gpu-01: the model does not fit one GPU: -c 16384 -np 8: short by 900 MiB. Fix: lower server_ctx"


class Runner:
    """Each trial's pyinfra run: what deploy.py's roles would leave in the run directory."""

    def __init__(self, leave):
        self.leave, self.interrupt = leave, SimpleNamespace(asked=False)

    def run(self, limit, ctx: RunContext, log, echo=True, label=""):
        log.write_text("preflight refused the rollout, nothing was changed:\n  gpu-01: a line the driver must not read\n")
        d = RunDir(ctx.report_dir)
        kind = self.leave[ctx.batch]
        if kind == "measured":
            d.write(records.Tune(host="gpu-01", run=ctx.run, status="measured", probe="match",
                                 reps=[{"throughput_tps": 50.0}], gpu={"name": "H200", "memory_mib": 143771}))
            return 0
        if kind == "refused":
            d.write(records.Preflight(host="gpu-01", run=ctx.run, address="a", ports=(8080,), refusals=(WHY,)))
        return 1


def test_each_trials_status_comes_from_its_runs_records(tmp_path):
    from tests.fixture_vars import prod_host_vars

    fleet = Fleet("inventory/x.py", {"gpu-01": ["v100_16gb"]}, {"gpu-01": {**prod_host_vars(), "tune_profile_hours": 0}})
    runner = Runner({"trial-0": "measured", "trial-1": "refused", "trial-2": "nothing"})
    t = Tune(SimpleNamespace(report_dir=str(tmp_path)), fleet, runner, "gpu-01")
    for n, name in enumerate(("shipped", "slots 8", "ctx x2")):
        setting = tunemod.Setting(name, {} if not n else {"server_parallel": 8})
        t.trials.append(tunemod.Trial(setting))
        t.trial(n, setting)
    measured, refused, failed = t.trials
    assert (measured.status, measured.figures()["throughput_tps"], t.gpu["memory_mib"]) == ("measured", 50.0, 143771)
    assert (refused.status, refused.reason) == ("refused", WHY)
    assert failed.status == "failed" and failed.reason.startswith("no tune record (pyinfra exit 1; see ")
