"""Tune: one trial of `python -m rollout INVENTORY --tune` on the canary (VOLTAFLEET_PHASE=tune).

The canary's instances are drained before anything changes and stay drained (roles.gateway_api.ready
does nothing in a tune trial), the trial's setting is rolled and smoke-tested as any rollout
does (a setting the VRAM plan refuses never starts; one that fails its smoke test or the golden
probe is rolled back), then the group's workload runs on instance 0 (voltafleet/hostside/workload.py,
`tune_repetitions` times) and its figures go to tune-<host>.json beside the run's outcome record.
On CUDA, instance 0 is restarted first and its GPU's memory read once /health answers: the CUDA
context before any request, for the planner's calibration (the smoke test's requests, or the
traffic a converged instance served, have grown the CUDA pool, which the plan counts apart).
The driver restores the canary when the tune ends or is interrupted.
"""
from __future__ import annotations

import json

from pyinfra.api import FunctionCommand, deploy, operation

from roles.factcache import host_fact

from roles.gateway_api import drain_host

from roles.run import report_dir, run_context

from roles.shell import bin_path, q, restart_command, sh, WORKLOAD_CLIENT
from roles.facts import Gpus
from voltafleet.planning.hostplan import API_KEY_PATH, HostPlan, connect_host
from voltafleet.state.records import Outcome, Tune
from voltafleet.state.runctx import RunDir
from voltafleet.measure.tune import Workload, gpu_used_command, gpu_used_mib

@operation()
def held(plan: HostPlan):
    """Every instance of the canary out of rotation before the trial changes anything (the
    shipped setting's trial restarts nothing, and is measured drained too).

    .. code:: python

        tune.held(plan)
    """
    yield FunctionCommand(drain_host(plan), (), {})


def workload_command(plan: HostPlan) -> str:
    inst = plan.instances[0]
    args = [bin_path(plan, WORKLOAD_CLIENT), "--port", str(inst.port), *Workload.of(plan.settings).argv()]
    if connect_host(plan.settings) != "127.0.0.1":  # a server bound to one address of the host
        args += ["--host", connect_host(plan.settings)]
    if plan.settings.server.api_key_file:
        args += ["--api-key-file", API_KEY_PATH]
    args += ["--gpu", str(inst.index)] if plan.cuda else ["--unit", inst.unit]
    return "python3 " + q(*args)


def loaded(host, plan: HostPlan) -> tuple[bool, float | None, str]:
    """Instance 0 restarted (drained since `held`; `active` once /health answers) and its GPU's
    memory.used read before any request: (restarted, MiB or None, why not)."""
    inst = plan.instances[0]
    ok, out = sh(host, restart_command(inst.index))
    if not ok:
        return False, None, (f"llama-server@{inst.index} did not restart for the after-load reading: "
                             + ((out.stderr.strip().splitlines() or ["systemctl restart failed"])[-1])[:300])
    ok, out = sh(host, gpu_used_command(inst.index))
    return True, gpu_used_mib(out.stdout) if ok else None, ""


@operation()
def measured(plan: HostPlan):
    """When this run's smoke test passed, the workload on instance 0 (on CUDA restarted first, its
    memory once loaded read: `loaded`); tune-<host>.json either way.

    .. code:: python

        tune.measured(plan)
    """
    def run(state, host):  # pyinfra passes state and host only to these two names
        cfg, ctx = plan.settings, run_context()
        rec = RunDir(report_dir(cfg)).read(Outcome, host.name, ctx.run)
        doc = {"host": host.name, "run": ctx.run, "status": "failed", "reason": "no outcome record",
               "probe": None, "reps": [], "loaded_mib": None, "after_load_mib": None,
               "planned_mib": round(plan.vram.needed / 2**20, 1) if plan.vram is not None else None,
               # what the plan puts on the GPU at load, before the CUDA context and the pool's growth
               "planned_static_mib": round((plan.vram.needed - plan.vram.overhead - plan.vram.pool) / 2**20, 1)
               if plan.vram is not None else None}
        if plan.cuda:  # the GPU the figures were measured on, for the tuned file
            g = (host_fact(host, Gpus) or [{}])[plan.instances[0].index]
            doc["gpu"] = {k: g.get(k) for k in ("name", "compute_cap", "memory_mib", "driver_version")}
        if rec is not None:
            doc.update(probe=rec.probe, reason=rec.reason)
        ready = rec is not None and rec.status == "passed"
        if ready and plan.cuda:
            ready, doc["loaded_mib"], why = loaded(host, plan)
            doc["reason"] = why or doc["reason"]
        if ready:
            ok, out = sh(host, workload_command(plan))
            if ok:
                got = json.loads(out.stdout.strip().splitlines()[-1])
                doc.update(status="measured", reason="", reps=got["reps"], after_load_mib=got["after_load_mib"])
            else:
                doc["reason"] = "the workload failed: " + ((out.stderr.strip().splitlines() or ["no output"])[-1])[:300]
        RunDir(report_dir(cfg)).write(Tune.make(doc))
        return True
    yield FunctionCommand(run, (), {})


@deploy("Tune trial")
def tuned(plan: HostPlan) -> None:
    """The trial's measurement (after the smoke test); `held` runs before the trial's changes.

    .. code:: python

        tuned(plan)
    """
    measured(name="The tune's workload on instance 0, figures to tune-<host>.json", plan=plan)
