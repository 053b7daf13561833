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
from pyinfra.operations import files

from roles.server import API_KEY_PATH, ENV_DIR, GOOD_DIR, RUNTIME
from voltafleet import smoke as smokemod

REPO = Path(__file__).resolve().parents[2]
CLIENT = "voltafleet-smoke"


def _run(state, host, ctx: dict) -> None:
    cfg = ctx["cfg"]
    root = cfg["voltafleet_root"]
    ports = " ".join(f"--port {i.port}" for i in ctx["instances"])
    parallel = cfg["smoke_parallel"] or cfg["server_parallel"]
    cmd = (f"python3 {root}/bin/{CLIENT} {ports} --tokens {cfg['smoke_tokens']} --parallel {parallel} "
           f"--health-timeout {cfg['smoke_health_timeout_s']} --unit-prefix llama-server@")
    if cfg["server_api_key_file"]:
        cmd += f" --api-key-file {API_KEY_PATH}"
    ok, out = host.run_shell_command(cmd)
    if not ok:
        raise OperationError(f"smoke client failed on {host.name}: {out.stderr}")
    report = json.loads(out.stdout.strip().splitlines()[-1])
    fails = smokemod.verdict(report, cfg)
    report.update(host=host.name, time=time.strftime("%Y-%m-%dT%H:%M:%S%z"), passed=not fails,
                  failures=fails, fingerprint=RUNTIME.get(host.name, {}).get("fingerprint"),
                  thresholds={k: cfg[k] for k in ("smoke_max_ttft_ms", "smoke_min_single_tps",
                                                  "smoke_min_aggregate_tps")})
    outdir = REPO / cfg["smoke_report_dir"] if not os.path.isabs(cfg["smoke_report_dir"]) \
        else Path(cfg["smoke_report_dir"])
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / f"smoke-{host.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    print("\n" + smokemod.table(host.name, report) + "\n"
          + (f"{host.name}: smoke PASSED" if not fails else f"{host.name}: smoke FAILED"), flush=True)
    if not fails:
        ok, out = host.run_shell_command(
            f"set -e; ln -sfn \"$(readlink {root}/current)\" {root}/good.tmp && mv -T {root}/good.tmp {root}/good; "
            f"rm -rf {GOOD_DIR}.tmp; cp -a {ENV_DIR} {GOOD_DIR}.tmp; rm -rf {GOOD_DIR}; mv {GOOD_DIR}.tmp {GOOD_DIR}")
        if not ok:
            raise OperationError(f"could not record the good snapshot on {host.name}: {out.stderr}")
        return
    msg = "smoke test failed:\n  " + "\n  ".join(fails)
    if cfg["smoke_rollback"]:
        has_good, _ = host.run_shell_command(f"test -L {root}/good -a -d {GOOD_DIR}")
        if not has_good:
            msg += "\nno release has passed a smoke test on this host yet: nothing to roll back to"
        else:
            restarts = " && ".join(f"systemctl restart llama-server@{i.index}.service" for i in ctx["instances"])
            ok, out = host.run_shell_command(
                f"set -e; cp {GOOD_DIR}/*.env {ENV_DIR}/; "
                f"ln -sfn \"$(readlink {root}/good)\" {root}/current.tmp && mv -T {root}/current.tmp {root}/current; "
                + restarts)
            msg += ("\nrolled back to the last release and flags that passed the smoke test" if ok
                    else f"\nrollback failed too: {out.stderr}")
    raise OperationError(msg)


@operation()
def passed(ctx: dict):
    """Run the smoke client on the host against every instance and judge the numbers.

    + ctx: the preflight context

    .. code:: python

        smoke.passed(ctx)
    """
    restarted = RUNTIME.get(host.name, {}).get("restarted")
    if restarted or os.environ.get("VOLTAFLEET_SMOKE") == "always":
        yield FunctionCommand(_run, (ctx,), {})


@deploy("Smoke test")
def smoke(ctx: dict) -> None:
    """Upload the smoke client and, after a change, measure and judge.

    .. code:: python

        smoke(ctx)
    """
    if not ctx["cfg"]["smoke_enabled"]:
        return
    files.put(name="Smoke client", src=str(REPO / "voltafleet" / "smoke.py"),
              dest=f"{ctx['cfg']['voltafleet_root']}/bin/{CLIENT}", mode="755")
    passed(name="Smoke test: health, offload, TTFT, tok/s", ctx=ctx)
