"""Smoke test after a rollout: health, all layers offloaded, time to first token,
single-stream and N-way tok/s against thresholds; on failure, go back to the last
release and flags that passed (the `good` snapshot) and fail the host.

It runs when this rollout restarted something on the host (or always with
VOLTAFLEET_SMOKE=always), so a converged fleet re-run changes nothing.
"""
from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

from pyinfra import host
from pyinfra.api import FunctionCommand, OperationError, deploy, operation

from roles.common import changes
from roles.facts import Releases
from roles.helpers import SMOKE_CLIENT, bin_path
from voltafleet import smoke as smokemod
from voltafleet.hostplan import API_KEY_PATH, ENV_DIR, GOOD_DIR, HostPlan

REPO = Path(__file__).resolve().parents[2]


def report_dir(cfg: dict) -> Path:
    d = Path(cfg["smoke_report_dir"])
    return d if d.is_absolute() else REPO / d


def client_command(plan: HostPlan) -> str:
    cfg = plan.cfg
    args = [bin_path(plan, SMOKE_CLIENT)]
    for inst in plan.instances:
        args += ["--port", str(inst.port)]
    args += ["--tokens", str(cfg["smoke_tokens"]), "--parallel", str(cfg["smoke_parallel"] or cfg["server_parallel"]),
             "--health-timeout", str(cfg["smoke_health_timeout_s"]), "--unit-prefix", "llama-server@"]
    if cfg["server_api_key_file"]:
        args += ["--api-key-file", API_KEY_PATH]
    return "python3 " + " ".join(shlex.quote(a) for a in args)


def _good(plan: HostPlan, action: str) -> str:
    return " ".join(shlex.quote(a) for a in (bin_path(plan, "vf-good"), action, plan.root, ENV_DIR, GOOD_DIR))


def _measure(state, host, plan: HostPlan) -> None:
    cfg = plan.cfg
    ok, out = host.run_shell_command(client_command(plan))
    if not ok:
        raise OperationError(f"smoke client failed on {host.name}: {out.stderr}")
    report = json.loads(out.stdout.strip().splitlines()[-1])
    fails = smokemod.verdict(report, cfg)
    report.update(host=host.name, time=time.strftime("%Y-%m-%dT%H:%M:%S%z"), passed=not fails,
                  failures=fails, fingerprint=host.get_fact(Releases, root=plan.root)["current"],
                  thresholds={k: cfg[k] for k in ("smoke_max_ttft_ms", "smoke_min_single_tps",
                                                  "smoke_min_aggregate_tps")})
    outdir = report_dir(cfg)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / f"smoke-{host.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    print("\n" + smokemod.table(host.name, report) + "\n"
          + (f"{host.name}: smoke PASSED" if not fails else f"{host.name}: smoke FAILED"), flush=True)
    if not fails:
        ok, out = host.run_shell_command(_good(plan, "record"))
        if not ok:
            raise OperationError(f"could not record the good snapshot on {host.name}: {out.stderr}")
        return
    msg = "smoke test failed:\n  " + "\n  ".join(fails)
    if cfg["smoke_rollback"]:
        has_good, _ = host.run_shell_command(" ".join(shlex.quote(a) for a in (
            bin_path(plan, "vf-good"), "has", plan.root, GOOD_DIR)))
        if not has_good:
            msg += "\nno release has passed a smoke test on this host yet: nothing to roll back to"
        else:
            restarts = " && ".join(f"systemctl restart {i.unit}" for i in plan.instances)
            ok, out = host.run_shell_command(f"set -e; {_good(plan, 'restore')}; {restarts}")
            msg += ("\nrolled back to the last release and flags that passed the smoke test" if ok
                    else f"\nrollback failed too: {out.stderr}")
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


@deploy("Smoke test")
def smoke(plan: HostPlan, restart_op=None) -> None:
    """After a change: measure and judge, roll back on failure.

    .. code:: python

        smoke(plan, restart_op)
    """
    if plan.cfg["smoke_enabled"]:
        passed(name="Smoke test: health, offload, TTFT, tok/s", plan=plan, restart_op=restart_op)
