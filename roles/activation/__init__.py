"""Activation, the last step of a host's rollout: restart what changed (each instance out of
the gateway's rotation first, its drain confirmed), have the smoke role's Judge measure and
judge it, and on any failure after the host's first change (drain, restart, health, smoke,
probe) roll it back (voltafleet.state.rollback decides the steps): the last good release, flags,
unit and model (files are kept by content) come back, restart and are judged again. On
success: record `good`, prune what rollback no longer needs, write the Prometheus textfile and
put the instances back in the gateway. Either way the host's outcome record of this run says
passed, rolled_back or failed, with a one-line reason: the rolling driver reads only that.

A converged host (nothing restarts) is probed without a restart, so a re-run changes
nothing and still proves every instance serves the pinned model correctly.
"""
from __future__ import annotations

import shlex
import time

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, deploy, operation

from roles.facts import Releases, ServerInstances
from roles.factcache import host_fact
from roles.gateway_api import DrainError, drain, drain_timeout, gateway_hosts, out_of_rotation, ready
from roles.run import changes, record, run_context
from roles.shell import bin_path, q, restart_command, sh
from voltafleet.state import rollback
from voltafleet.planning.hostplan import ENV_DIR, GOOD_DIR, UNIT_PATH, HostPlan
from voltafleet.planning.restarts import restart_set
from voltafleet.state.rollback import StepFailed as Failed

def _good(plan: HostPlan, action: str) -> str:
    return q(bin_path(plan, "vf-good"), action, plan.root, ENV_DIR, GOOD_DIR, UNIT_PATH)


def _journal(host, index: int) -> list[str]:
    # -t: the server's own lines only (systemd's "Failed to start" says nothing of the cause)
    ok, out = sh(host, f"journalctl -u llama-server@{index}.service -t llama-server -o cat --no-pager -n 60")
    return out.stdout.splitlines() if ok else []


def _restart(state, host, plan: HostPlan, index: int, timings: dict) -> int:
    """Drain (confirmed) then restart one instance; the streams a drain had to cut. `timings`
    gets the seconds of each (the plan's drain and restart constants are calibrated from them)."""
    t0 = time.monotonic()
    cut = drain(state, host.name, index, drain_timeout(plan.settings)) if gateway_hosts(state) else 0
    t1 = time.monotonic()
    ok, out = sh(host, restart_command(index))
    timings["drain_s"].append(round(t1 - t0, 2))
    timings["restart_s"].append(round(time.monotonic() - t1, 2))
    if not ok:
        fits = plan.vram.fits if plan.vram is not None else None
        cause = rollback.likely_cause(_journal(host, index), fits)
        raise Failed("restart", f"llama-server@{index} did not start: "
                     + (cause or (out.stderr.strip().splitlines() or ["systemctl restart failed"])[-1]))
    return cut


def _current_release(host, plan: HostPlan) -> str | None:
    ok, out = sh(host, f"basename \"$(readlink {shlex.quote(plan.root + '/current')})\"")
    return out.stdout.strip() or None if ok else None


def _after_pass(state, host, plan: HostPlan, report: dict, judge) -> None:
    cfg = plan.settings
    ok, out = sh(host, _good(plan, "record"))
    if not ok:
        raise Failed("smoke", f"could not record the good snapshot: {out.stderr.strip()[:200]}")
    keep = [f.dest for f in plan.model_files]
    sh(host, q(bin_path(plan, "vf-prune-models"), cfg.model.dir, *keep))
    judge.textfile(host, report)
    ready(state, host.name, [i.index for i in plan.instances])


def _roll_back(state, host, plan: HostPlan, failure: rollback.Failure, report: dict,
               judge) -> tuple[str, str]:
    """Carry out rollback.decide's steps; (status, reason) for the record."""
    cfg = plan.settings
    has_good, _ = sh(host, q(bin_path(plan, "vf-good"), "has", plan.root, GOOD_DIR))
    facts = rollback.Facts(has_good=has_good, rollback=cfg.smoke.rollback,
                           instances=[i.index for i in plan.instances])
    steps = rollback.decide(failure, facts)
    if not steps:
        return "failed", f"{failure.reason} ({rollback.why_not(facts)})"
    passed_again, note, kept_out = None, "", []
    try:
        for step in steps:
            if step.action == "restore":
                ok, out = sh(host, _good(plan, "restore"))
                if not ok:
                    raise Failed("rollback", f"restore failed: {out.stderr.strip()[:200]}")
            elif step.action == "restart":
                if gateway_hosts(state):  # every restart is drained first, a rollback's too
                    try:
                        drain(state, host.name, step.instance, drain_timeout(cfg))
                    except DrainError as e:
                        kept_out.append(step.instance)
                        note += f"; instance {step.instance} restored on disk, not restarted, left out of rotation: {e}"
                        continue
                ok, out = sh(host, restart_command(step.instance))
                if not ok:
                    cause = rollback.last_error(_journal(host, step.instance))
                    raise Failed("rollback", f"the old release's llama-server@{step.instance} did not start "
                                 f"either: {cause or 'see its journal'}")
            elif step.action == "smoke":
                # the old release is judged on serving as before (healthy, every stream answered);
                # the thresholds and the golden probe are the new configuration's
                again = judge.client(host)
                broken = [f"instance {m['instance']}: {m.get('error') or m['errors'][0]}" for m in again["instances"]
                          if "error" in m or m.get("errors")]
                report["after_rollback"] = {"passed": not broken, "failures": broken,
                                            "fingerprint": _current_release(host, plan), "instances": again["instances"]}
                passed_again = not broken
                if broken:
                    note = f"; the old release does not serve either: {broken[0]}"
            elif step.action == "ready" and passed_again:
                back = [i.index for i in plan.instances if i.index not in kept_out]
                ready(state, host.name, back)  # it serves as before (an instance whose drain failed stays out)
    except Exception as e:  # the rollback itself failed: say so, in one line
        reason = e.reason if isinstance(e, Failed) else f"{type(e).__name__}: {e}"
        return "failed", f"{failure.reason}; rollback failed: {reason}"
    status = rollback.outcome_status(steps, passed_again)
    if kept_out:  # restored on disk but still running what failed: never "rolled back"
        status = "failed"
    return status, failure.reason + ("; rolled back to the last release, flags, unit and model that passed"
                                     if status == "rolled_back" else note)


def _activate(state, host, plan: HostPlan, todo: list[int], judge) -> bool:
    """Restart `todo` (drained), smoke, and on any failure roll back; write the outcome."""
    cfg = plan.settings
    restarted, cut, report = [], 0, {"instances": []}
    timings = {"drain_s": [], "restart_s": [], "smoke_s": None}  # seconds, for the plan's calibration
    failure = gold = None
    try:
        gold = judge.golden()
        for i in todo:
            restarted.append(i)  # drained and restarted, or tried: the rollback restarts it (drained)
            cut += _restart(state, host, plan, i, timings)
        if cfg.smoke.enabled:
            t0 = time.monotonic()
            report, fails = judge.measure(host, gold)
            timings["smoke_s"] = round(time.monotonic() - t0, 2)
            if fails:
                raise Failed("probe" if report["probe_only_failures"] else "smoke", "; ".join(fails))
    except Failed as e:
        failure = rollback.Failure(e.phase, e.reason, restarted)
    except DrainError as e:
        failure = rollback.Failure("drain", str(e), restarted)
    except Exception as e:  # anything else is a failure too, in one line, never a traceback
        failure = rollback.Failure("smoke", f"{type(e).__name__}: {e}", restarted)
    release = _current_release(host, plan)
    report.update(timings=timings, host=host.name, fingerprint=release, batch=run_context().batch, run=run_context().run,
                  time=time.strftime("%Y-%m-%dT%H:%M:%S%z"), epoch=time.time(),
                  flags=plan.argv[plan.instances[0].index] if plan.instances else [],
                  thresholds={"smoke_max_ttft_ms": cfg.smoke.max_ttft_ms, "smoke_min_single_tps": cfg.smoke.min_single_tps,
                              "smoke_min_aggregate_tps": cfg.smoke.min_aggregate_tps})
    common = dict(flags=report["flags"], model_sha256=plan.model_files[0].sha256, restarted=restarted,
                  streams_cut=cut, **judge.figures(report))
    if report["instances"]:
        print("\n" + judge.table(host.name, report), flush=True)
    if failure is None:
        try:
            probe = "recorded" if run_context().record_probe and cfg.smoke.probe else None
            if probe:
                judge.record_golden(host, report)
            report.update(passed=True, failures=[])
            _after_pass(state, host, plan, report, judge)
        except Exception as e:
            reason = e.reason if isinstance(e, Failed) else f"{type(e).__name__}: {e}"
            record(cfg, host.name, "failed", f"after its smoke test passed: {reason}", release=release, **common)
            host.log_styled(f"smoke passed, then: {reason}", fg="red", log_func=logger.error)
            return False
        judge.write(host.name, report)
        if not cfg.smoke.enabled:  # restarted and serving, but nothing was measured or probed
            record(cfg, host.name, "unmeasured", "not measured: smoke_enabled is false", release=release,
                   probe="not run" if cfg.smoke.probe else None, **common)
            print(f"{host.name}: smoke not run (smoke_enabled: false): UNMEASURED", flush=True)
            return True
        record(cfg, host.name, "passed", "", release=release, probe=probe or ("match" if gold is not None else None),
               **common)
        print(f"{host.name}: smoke PASSED", flush=True)
        return True
    status, reason = _roll_back(state, host, plan, failure, report, judge)
    report.update(passed=False, failures=[failure.reason], rolled_back=status == "rolled_back")
    judge.write(host.name, report)
    try:
        judge.textfile(host, report)
    except Exception as e:  # the record below says what failed; the textfile is a bonus
        logger.warning(f"{host.name}: textfile not written: {e}")
    probe = f"diverged: {report['probe_diverged']}" if report.get("probe_diverged") else None
    record(cfg, host.name, status, reason, release=_current_release(host, plan), probe=probe, **common)
    host.log_styled(f"{host.name}: smoke FAILED ({status}): {reason}", fg="red", log_func=logger.error)
    return False


def _converged(plan: HostPlan, judge):
    """Nothing restarts: probe every instance against the golden probe; record the outcome."""
    cfg = plan.settings
    gold = judge.golden()
    idx = [i.index for i in plan.instances]
    common = dict(flags=plan.argv[idx[0]] if idx else [], model_sha256=plan.model_files[0].sha256, converged=True)
    if gold is not None:
        fails = judge.probe_only(host, gold)
        if fails:
            reason = "converged, but " + "; ".join(fails)
            record(cfg, host.name, "failed", reason, probe="diverged: " + fails[0], **common)

            def fail(state, host):
                host.log_styled(f"{host.name}: {reason}", fg="red", log_func=logger.error)
                return False
            yield FunctionCommand(fail, (), {})
            return
    release = host_fact(host, Releases, root=plan.root)["current"]
    record(cfg, host.name, "passed", "", release=release, probe="match" if gold is not None else None, **common)
    if out_of_rotation(host.state, host.name, idx):
        # an earlier run left instances drained (an interrupted rollout): they serve, so they go back
        yield FunctionCommand(lambda state, host: ready(state, host.name, idx) or True, (), {})


@operation()
def activated(plan: HostPlan, env_ops: dict, everything_ops: tuple, judge):
    """Restart (drained, one at a time), smoke and probe the instances that changed, with
    rollback on any failure; a converged host is only probed. Every instance restarts when
    one of `everything_ops` (unit, release, model, driver) changes the host, else those whose
    environment file changes, plus any that is not running.

    .. code:: python

        activation.activated(plan, env_ops={0: env0}, everything_ops=(unit, switch, *model_ops), judge=judge)
    """
    live = host.get_fact(ServerInstances, env_dir=ENV_DIR)
    todo, _ = restart_set(sorted(env_ops), {i for i, op in env_ops.items() if changes(op)},
                          any(changes(op) for op in everything_ops), live)
    if todo or run_context().smoke_always:
        yield FunctionCommand(_activate, (plan, todo, judge), {})
    else:
        yield from _converged(plan, judge)


@deploy("Activation")
def activation(plan: HostPlan, server_changes, judge) -> None:
    """Restart what changed (drained), judge it, roll back on failure; record the outcome.

    .. code:: python

        activation(plan, server(plan, model_ops), smoke(plan))
    """
    activated(name="Restart (drained), smoke test (health, offload, TTFT, tok/s, probe), rollback on failure",
              plan=plan, env_ops=server_changes.env_ops, everything_ops=server_changes.everything_ops, judge=judge)
