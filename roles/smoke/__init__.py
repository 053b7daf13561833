"""Smoke test after a rollout: health, all layers offloaded, time to first token,
single-stream (judged on the lowest of client, server and /metrics figures) and N-way
tok/s against thresholds, and the quality probe against the canary's. On failure: go back
to the last release, flags and unit that passed (the `good` snapshot), restart, smoke
again, and fail the host. On success: record `good`, prune models rollback no longer
needs, write the Prometheus textfile, and put the host's instances back in the gateway.

It runs when this rollout restarted something on the host (or always with
VOLTAFLEET_SMOKE=always), so a converged fleet re-run changes nothing.
"""
from __future__ import annotations

import json
import os
import shlex
import time
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import FunctionCommand, OperationError, deploy, operation
from pyinfra.api.state import BaseStateCallback
from pyinfra.operations import files

from roles import gateway
from roles.common import changes, sh
from roles.facts import GpuHealth, Releases
from roles.helpers import SMOKE_CLIENT, bin_path
from roles.server import restart_command
from voltafleet import gpuhealth, smoke as smokemod
from voltafleet.hostplan import API_KEY_PATH, ENV_DIR, GOOD_DIR, UNIT_PATH, HostPlan

REPO = Path(__file__).resolve().parents[2]
PROMPT_PATH = "smoke-probe-prompt.txt"  # under voltafleet_root


def report_dir(cfg: dict) -> Path:
    """VOLTAFLEET_REPORT_DIR (the rolling driver's run directory), else smoke_report_dir."""
    d = Path(os.environ.get("VOLTAFLEET_REPORT_DIR") or cfg["smoke_report_dir"])
    return d if d.is_absolute() else REPO / d


def client_command(plan: HostPlan) -> str:
    cfg = plan.cfg
    args = [bin_path(plan, SMOKE_CLIENT)]
    for inst in plan.instances:
        args += ["--port", str(inst.port)]
    args += ["--tokens", str(cfg["smoke_tokens"]), "--parallel", str(cfg["smoke_parallel"] or cfg["server_parallel"]),
             "--health-timeout", str(cfg["smoke_health_timeout_s"]), "--unit-prefix", "llama-server@",
             "--gpu-sample-interval", str(cfg["smoke_gpu_sample_s"] if plan.cuda else 0)]
    if cfg["server_api_key_file"]:
        args += ["--api-key-file", API_KEY_PATH]
    if cfg["smoke_probe"]:
        args += ["--probe-prompt-file", f"{plan.root}/{PROMPT_PATH}", "--probe-tokens", str(cfg["smoke_probe_tokens"])]
    return "python3 " + " ".join(shlex.quote(a) for a in args)


def _q(*args: str) -> str:
    return " ".join(shlex.quote(a) for a in args)


def _good(plan: HostPlan, action: str) -> str:
    return _q(bin_path(plan, "vf-good"), action, plan.root, ENV_DIR, GOOD_DIR, UNIT_PATH)


def _reference() -> dict | None:
    path = os.environ.get("VOLTAFLEET_PROBE_REFERENCE")
    return json.loads(Path(path).read_text()) if path and Path(path).exists() else None


def _smoke(host, plan: HostPlan, reference: dict | None) -> tuple[dict, list[str]]:
    """Run the client on the host; (report, failures)."""
    ok, out = sh(host, client_command(plan))
    if not ok:
        raise OperationError(f"smoke client failed on {host.name}: {out.stderr}")
    report = json.loads(out.stdout.strip().splitlines()[-1])
    fails = smokemod.verdict(report, plan.cfg, reference)
    judged, notes = {}, []
    for m in report["instances"]:
        if "error" not in m:
            single, figures, note = smokemod.single_stream(m)
            judged[str(m["instance"])] = {"single_tps": single, **{f"{k}_tps": v for k, v in figures.items()}}
            notes += [f"instance {m['instance']}: {note}"] if note else []
    report.update(judged=judged, disagreements=notes)
    probe = next((m["probe"] for m in report["instances"] if m.get("probe")), None)
    if probe is not None:
        why = smokemod.probe_compare(reference, probe, plan.cfg["smoke_probe_tolerance"]) if reference else None
        report["probe"] = {**probe, "verdict": "reference" if reference is None else ("match" if not why
                                                                                      else f"diverged: {why}")}
    return report, fails


def _write(plan: HostPlan, host, report: dict) -> None:
    outdir = report_dir(plan.cfg)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / f"smoke-{host.name}.json").write_text(json.dumps(report, indent=2) + "\n")


def _after_pass(state, host, plan: HostPlan, report: dict) -> None:
    cfg = plan.cfg
    ok, out = sh(host, _good(plan, "record"))
    if not ok:
        raise OperationError(f"could not record the good snapshot on {host.name}: {out.stderr}")
    keep = [f.dest for f in plan.model_files]
    sh(host, _q(bin_path(plan, "vf-prune-models"), cfg["model_dir"], *keep))
    _textfile(host, plan, report)
    gateway.ready(state, host.name, [i.index for i in plan.instances])


def _textfile(host, plan: HostPlan, report: dict) -> None:
    """voltafleet.prom for node_exporter, after a pass and after a failure alike (the
    alerts read voltafleet_smoke_passed and the GPU gauges)."""
    cfg = plan.cfg
    if cfg["smoke_textfile_dir"]:
        prom = smokemod.textfile(host.name, report, report.get("fingerprint"))
        sh(host, f"mkdir -p {shlex.quote(cfg['smoke_textfile_dir'])} && "
                 + _q(bin_path(plan, "vf-atomic"), "file", f"{cfg['smoke_textfile_dir']}/voltafleet.prom")
                 + f" <<'VOLTAFLEET_PROM'\n{prom}VOLTAFLEET_PROM")


def gpu_check(host, plan: HostPlan, report: dict) -> list[str]:
    """On a CUDA host, the boards' health read now (GpuHealth, judged as preflight does),
    kept in the report for the textfile; its refusals fail the smoke test."""
    if not plan.cuda:
        return []
    health = gpuhealth.summary(host.name, plan.cfg, host.get_fact(GpuHealth))
    report["gpu_health"] = health
    for line in health["warnings"]:
        print(f"warning: {line}", flush=True)
    return health["refusals"]


def _measure(state, host, plan: HostPlan) -> None:
    cfg = plan.cfg
    reference = _reference()
    report, fails = _smoke(host, plan, reference)
    fails += gpu_check(host, plan, report)
    report.update(host=host.name, time=time.strftime("%Y-%m-%dT%H:%M:%S%z"), epoch=time.time(),
                  passed=not fails, failures=fails, batch=os.environ.get("VOLTAFLEET_BATCH"),
                  fingerprint=host.get_fact(Releases, root=plan.root)["current"],
                  flags=plan.argv[plan.instances[0].index] if plan.instances else [],
                  thresholds={k: cfg[k] for k in ("smoke_max_ttft_ms", "smoke_min_single_tps",
                                                  "smoke_min_aggregate_tps")})
    print("\n" + smokemod.table(host.name, report) + "\n"
          + (f"{host.name}: smoke PASSED" if not fails else f"{host.name}: smoke FAILED"), flush=True)
    if not fails:
        _write(plan, host, report)
        _after_pass(state, host, plan, report)
        return
    msg = "smoke test failed:\n  " + "\n  ".join(fails)
    has_good, _ = sh(host, _q(bin_path(plan, "vf-good"), "has", plan.root, GOOD_DIR))
    if not cfg["smoke_rollback"]:
        msg += "\nsmoke_rollback is off: the new release stays"
    elif not has_good:
        msg += "\nno release has passed a smoke test on this host yet: nothing to roll back to"
    else:
        restarts = " && ".join(restart_command(i.index) for i in plan.instances)
        ok, out = sh(host, f"set -e; {_good(plan, 'restore')}; {restarts}")
        report["rolled_back"] = True
        if not ok:
            msg += f"\nrollback failed too: {out.stderr}"
            report["after_rollback"] = {"passed": False, "failures": [out.stderr.strip()[:300]]}
        else:
            again, again_fails = _smoke(host, plan, None)  # the old release: its own figures, no new reference
            report["after_rollback"] = {"passed": not again_fails, "failures": again_fails,
                                        "fingerprint": host.get_fact(Releases, root=plan.root)["current"]}
            msg += ("\nrolled back to the last release and flags that passed the smoke test; they pass again"
                    if not again_fails else "\nrolled back, but the old release fails too:\n  "
                    + "\n  ".join(again_fails))
            if all("error" not in m and not m.get("errors") for m in again["instances"]):
                gateway.ready(state, host.name, [i.index for i in plan.instances])  # it serves as before
    _write(plan, host, report)
    _textfile(host, plan, report)
    raise OperationError(msg)


@operation()
def passed(plan: HostPlan, restart_op=None):
    """Run the smoke client on the host against every instance and judge the numbers,
    when `restart_op` (the server role's) restarted something.

    .. code:: python

        smoke.passed(plan, restart_op=restart_op)
    """
    if changes(restart_op) or os.environ.get("VOLTAFLEET_SMOKE") == "always":
        yield FunctionCommand(_measure, (plan,), {})
    elif gateway.out_of_rotation(host.state, host.name, [i.index for i in plan.instances]):
        # nothing restarts, but an earlier run left instances drained (a rollback that failed
        # its re-smoke, an interrupted rollout): they serve, so they go back
        yield FunctionCommand(lambda state, host: gateway.ready(state, host.name, [i.index for i in plan.instances]),
                              (), {})


class _StatusFiles(BaseStateCallback):
    """At the end of the run, status-<host>.json in the report directory: whether the host
    came through every operation (the rolling driver reads it)."""

    def __init__(self, plans: dict):
        self.plans = plans

    def host_disconnect(self, state, host):
        plan = self.plans.get(host.name)
        if plan is None:
            return
        out = report_dir(plan.cfg)
        out.mkdir(parents=True, exist_ok=True)
        status = {"host": host.name, "ok": host not in state.failed_hosts,
                  "flags": plan.argv[plan.instances[0].index] if plan.instances else []}
        (out / f"status-{host.name}.json").write_text(json.dumps(status, indent=2) + "\n")


def record_status(plan: HostPlan) -> None:
    """Have the run write this host's status file when it ends."""
    state = host.state
    if not hasattr(state, "_voltafleet_status"):
        state._voltafleet_status = _StatusFiles({})
        state.add_callback_handler(state._voltafleet_status)
    state._voltafleet_status.plans[host.name] = plan


@deploy("Smoke test")
def smoke(plan: HostPlan, restart_op=None) -> None:
    """After a change: measure and judge, roll back on failure.

    .. code:: python

        smoke(plan, restart_op)
    """
    record_status(plan)
    if not plan.cfg["smoke_enabled"]:
        return
    if plan.cfg["smoke_probe"]:
        files.put(name="Quality probe prompt", src=StringIO(plan.cfg["smoke_probe_prompt"]),
                  dest=f"{plan.root}/{PROMPT_PATH}", mode="644")
    passed(name="Smoke test: health, offload, TTFT, tok/s, probe", plan=plan, restart_op=restart_op)
