"""Smoke test, the last step of a host's rollout: restart what changed (each instance out
of the gateway's rotation first, its drain confirmed), then health, all layers offloaded,
time to first token, single-stream (judged on the lowest of client, server and /metrics
figures) and N-way tok/s against thresholds, and every instance's quality probe against
the golden one kept in the repository (probes/).

Any failure after the host's first change (drain, restart, health, smoke, probe) rolls it
back (voltafleet.rollback decides the steps): the last good release, flags, unit and model
(files are kept by content) come back, restart and are smoked again. On success: record
`good`, prune what rollback no longer needs, write the Prometheus textfile and put the
instances back in the gateway. Either way the host's outcome record of this run says
passed, rolled_back or failed, with a one-line reason: the rolling driver reads only that.

A converged host (nothing restarts) is probed without a restart, so a re-run changes
nothing and still proves every instance serves the pinned model correctly.
"""
from __future__ import annotations

import json
import shlex
import time

from pyinfra import host, logger
from pyinfra.api import FactBase, FunctionCommand, deploy, operation

from roles.factcache import host_fact

from roles.gateway_api import drain, drain_timeout, DrainError, gateway_hosts, out_of_rotation, ready

from roles.run import changes, record, report_dir, run_context

from roles.shell import bin_path, q, restart_command, sh, SMOKE_CLIENT
from roles.facts import GpuHealth, Releases, ServerInstances
from roles.filesync import Wanted, synced
from voltafleet import gpuhealth
from voltafleet import probe as probemod
from voltafleet import rollback
from voltafleet import smoke as smokemod
from voltafleet.runctx import RunDir
from voltafleet.hostplan import API_KEY_PATH, ENV_DIR, GOOD_DIR, UNIT_PATH, HostPlan
from voltafleet.restarts import restart_set

PROMPT_PATHS = {"probe": "smoke-probe-prompt.txt", "probe_long": "smoke-probe-long-prompt.txt"}  # under voltafleet_root
PROMPT_FLAGS = {"probe": "--probe-prompt-file", "probe_long": "--probe-long-prompt-file"}


def prompt_files(plan: HostPlan) -> list[Wanted]:
    """The quality probes' prompts, where the smoke client reads them."""
    return [Wanted(f"{plan.root}/{PROMPT_PATHS[p.name]}", "644", text=p.prompt) for p in probemod.probes(plan.cfg)]


def client_command(plan: HostPlan, probe_only: bool = False) -> str:
    cfg = plan.cfg
    args = [bin_path(plan, SMOKE_CLIENT)]
    for inst in plan.instances:
        args += ["--port", str(inst.port)]
    args += ["--tokens", str(cfg["smoke_tokens"]), "--parallel", str(cfg["smoke_parallel"] or cfg["server_parallel"]),
             "--health-timeout", str(cfg["smoke_health_timeout_s"]), "--unit-prefix", "llama-server@",
             "--gpu-sample-interval", str(cfg["smoke_gpu_sample_s"] if plan.cuda else 0)]
    if cfg["server_api_key_file"]:
        args += ["--api-key-file", API_KEY_PATH]
    for p in probemod.probes(cfg):
        args += [PROMPT_FLAGS[p.name], f"{plan.root}/{PROMPT_PATHS[p.name]}"]
    if cfg["smoke_probe"]:
        args += ["--probe-tokens", str(cfg["smoke_probe_tokens"])]
    if probe_only:
        args += ["--probe-only"]
    return "python3 " + q(*args)


def _good(plan: HostPlan, action: str) -> str:
    return q(bin_path(plan, "vf-good"), action, plan.root, ENV_DIR, GOOD_DIR, UNIT_PATH)


def golden(plan: HostPlan) -> dict | None:
    """The golden probes every instance is compared with, {Probe: golden record} (None:
    smoke_probe off, or this run records them)."""
    cfg = plan.cfg
    if not cfg["smoke_probe"] or run_context().record_probe:
        return None
    return {p: probemod.load(plan.model_files[0].sha256, p.prompt, p.tokens) for p in probemod.probes(cfg)}


def probe_verdicts(report: dict, gold: dict | None, tolerance: float) -> list[str]:
    """Every instance's probes (short and long) against the golden ones: the failures, []
    when all match. The first divergence is kept in report["probe_diverged"] for the outcome
    record."""
    if gold is None:
        return []
    fails, whys = [], []
    for m in report["instances"]:
        if "error" in m:
            continue
        for spec, ref in gold.items():
            why = probemod.check(ref, m.get(spec.name), tolerance, spec)
            if why:
                whys.append(why)
                fails.append(f"instance {m['instance']} (port {m['port']}): quality probe diverged: {why}")
    report["probe_diverged"] = whys[0] if whys else None
    return fails


def _client(host, plan: HostPlan, probe_only: bool = False) -> dict:
    ok, out = sh(host, client_command(plan, probe_only))
    if not ok:
        raise RuntimeError(f"the smoke client failed: {(out.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _smoke(host, plan: HostPlan, gold: dict | None) -> tuple[dict, list[str]]:
    """Run the client on the host; (report, failures)."""
    report = _client(host, plan)
    probe_fails = probe_verdicts(report, gold, plan.cfg["smoke_probe_tolerance"])
    fails = smokemod.verdict(report, plan.cfg) + probe_fails + gpu_check(host, plan, report)
    report["probe_only_failures"] = bool(probe_fails) and len(probe_fails) == len(fails)
    judged, notes = {}, []
    for m in report["instances"]:
        if "error" not in m:
            single, figures, note = smokemod.single_stream(m)
            judged[str(m["instance"])] = {"single_tps": single, **{f"{k}_tps": v for k, v in figures.items()}}
            notes += [f"instance {m['instance']}: {note}"] if note else []
    report.update(judged=judged, disagreements=notes)
    return report, fails


def _figures(report: dict) -> dict:
    inst = [m for m in report.get("instances", []) if "error" not in m]
    if not inst:
        return {}
    judged = report.get("judged", {})
    n_way = [smokemod.ttft_summary(m) for m in inst]
    worst = lambda key: max((t[key] for t in n_way if t[key] is not None), default=None)  # noqa: E731
    return {"ttft_ms": max(m["ttft_ms"] for m in inst), "ttft_p50_ms": worst("p50"), "ttft_p99_ms": worst("p99"),
            "single_tps": min(judged.get(str(m["instance"]), {}).get("single_tps", 0) for m in inst),
            "aggregate_tps": min(m.get("aggregate_tps") or 0 for m in inst)}


def _write(plan: HostPlan, name: str, report: dict) -> None:
    RunDir(report_dir(plan.cfg)).write("smoke", name, {**report, "run": run_context().run}, indent=2)


class Failed(Exception):
    def __init__(self, phase: str, reason: str):
        super().__init__(reason)
        self.phase, self.reason = phase, reason


def _journal(host, index: int) -> list[str]:
    # -t: the server's own lines only (systemd's "Failed to start" says nothing of the cause)
    ok, out = sh(host, f"journalctl -u llama-server@{index}.service -t llama-server -o cat --no-pager -n 60")
    return out.stdout.splitlines() if ok else []


def _restart(state, host, plan: HostPlan, index: int, timings: dict) -> int:
    """Drain (confirmed) then restart one instance; the streams a drain had to cut. `timings`
    gets the seconds of each (the plan's drain and restart constants are calibrated from them)."""
    t0 = time.monotonic()
    cut = drain(state, host.name, index, drain_timeout(plan.cfg)) if gateway_hosts(state) else 0
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


def _after_pass(state, host, plan: HostPlan, report: dict) -> None:
    cfg = plan.cfg
    ok, out = sh(host, _good(plan, "record"))
    if not ok:
        raise Failed("smoke", f"could not record the good snapshot: {out.stderr.strip()[:200]}")
    keep = [f.dest for f in plan.model_files]
    sh(host, q(bin_path(plan, "vf-prune-models"), cfg["model_dir"], *keep))
    _textfile(host, plan, report)
    ready(state, host.name, [i.index for i in plan.instances])


def _textfile(host, plan: HostPlan, report: dict) -> None:
    """voltafleet.prom for node_exporter, after a pass and after a failure alike (the
    alerts read voltafleet_smoke_passed and the GPU gauges)."""
    cfg = plan.cfg
    if cfg["smoke_textfile_dir"]:
        prom = smokemod.textfile(host.name, report, report.get("fingerprint"))
        sh(host, f"mkdir -p {shlex.quote(cfg['smoke_textfile_dir'])} && "
                 + q(bin_path(plan, "vf-atomic"), "file", f"{cfg['smoke_textfile_dir']}/voltafleet.prom")
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


def _roll_back(state, host, plan: HostPlan, failure: rollback.Failure, report: dict) -> tuple[str, str]:
    """Carry out rollback.decide's steps; (status, reason) for the record."""
    cfg = plan.cfg
    has_good, _ = sh(host, q(bin_path(plan, "vf-good"), "has", plan.root, GOOD_DIR))
    facts = rollback.Facts(has_good=has_good, rollback=cfg["smoke_rollback"],
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
                again = _client(host, plan)
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


def _activate(state, host, plan: HostPlan, todo: list[int]) -> bool:
    """Restart `todo` (drained), smoke, and on any failure roll back; write the outcome."""
    cfg = plan.cfg
    restarted, cut, report = [], 0, {"instances": []}
    timings = {"drain_s": [], "restart_s": [], "smoke_s": None}  # seconds, for the plan's calibration
    failure = gold = None
    try:
        gold = golden(plan)
        for i in todo:
            restarted.append(i)  # drained and restarted, or tried: the rollback restarts it (drained)
            cut += _restart(state, host, plan, i, timings)
        if cfg["smoke_enabled"]:
            t0 = time.monotonic()
            report, fails = _smoke(host, plan, gold)
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
                  thresholds={k: cfg[k] for k in ("smoke_max_ttft_ms", "smoke_min_single_tps",
                                                  "smoke_min_aggregate_tps")})
    common = dict(flags=report["flags"], model_sha256=plan.model_files[0].sha256, restarted=restarted,
                  streams_cut=cut, **_figures(report))
    if report["instances"]:
        print("\n" + smokemod.table(host.name, report), flush=True)
    if failure is None:
        try:
            probe = "recorded" if run_context().record_probe and cfg["smoke_probe"] else None
            if probe:
                _record_golden(plan, report)
            report.update(passed=True, failures=[])
            _after_pass(state, host, plan, report)
        except Exception as e:
            reason = e.reason if isinstance(e, Failed) else f"{type(e).__name__}: {e}"
            record(cfg, host.name, "failed", f"after its smoke test passed: {reason}", release=release, **common)
            host.log_styled(f"smoke passed, then: {reason}", fg="red", log_func=logger.error)
            return False
        _write(plan, host.name, report)
        if not cfg["smoke_enabled"]:  # restarted and serving, but nothing was measured or probed
            record(cfg, host.name, "unmeasured", "not measured: smoke_enabled is false", release=release,
                   probe="not run" if cfg["smoke_probe"] else None, **common)
            print(f"{host.name}: smoke not run (smoke_enabled: false): UNMEASURED", flush=True)
            return True
        record(cfg, host.name, "passed", "", release=release, probe=probe or ("match" if gold is not None else None),
               **common)
        print(f"{host.name}: smoke PASSED", flush=True)
        return True
    status, reason = _roll_back(state, host, plan, failure, report)
    report.update(passed=False, failures=[failure.reason], rolled_back=status == "rolled_back")
    _write(plan, host.name, report)
    try:
        _textfile(host, plan, report)
    except Exception as e:  # the record below says what failed; the textfile is a bonus
        logger.warning(f"{host.name}: textfile not written: {e}")
    probe = f"diverged: {report['probe_diverged']}" if report.get("probe_diverged") else None
    record(cfg, host.name, status, reason, release=_current_release(host, plan), probe=probe, **common)
    host.log_styled(f"{host.name}: smoke FAILED ({status}): {reason}", fg="red", log_func=logger.error)
    return False


def _record_golden(plan: HostPlan, report: dict) -> None:
    """Every probe of the first instance, once all instances agree (and a long probe's prompt
    reached its minimum length), saved as the golden probes."""
    cfg = plan.cfg
    for spec in probemod.probes(cfg):
        probes = [m.get(spec.name) for m in report["instances"] if "error" not in m]
        first = probes[0] if probes else None
        for p in probes[1:]:
            why = probemod.check(first, p, cfg["smoke_probe_tolerance"], spec)
            if why:
                raise Failed("probe", f"instances disagree, golden probe not recorded: {why}")
        short = probemod.check(first, first, 0, spec) if first else None
        if short:
            raise Failed("probe", f"golden probe not recorded: {short}")
        path = probemod.save(plan.model_files[0].sha256, spec.prompt, spec.tokens, first or {},
                             source=f"{host.name} release {report.get('fingerprint')}")
        logger.info(f"{host.name}: golden probe recorded in {path}: commit it beside the model's pin")


class ProbeOnly(FactBase):
    """The quality probe of every instance of a converged host (no restart): the smoke
    client's JSON with --probe-only; {"error": ...} when it could not run."""

    @staticmethod
    def default():
        return {"error": "no output"}

    def command(self, client: str) -> str:
        return f"{client} 2>&1 || true"

    def process(self, output):
        try:
            return json.loads(output[-1])
        except (IndexError, ValueError):
            return {"error": (output[-1] if output else "no output")[:300]}


def _converged(plan: HostPlan):
    """Nothing restarts: probe every instance against the golden probe; record the outcome."""
    cfg = plan.cfg
    gold = golden(plan)
    idx = [i.index for i in plan.instances]
    common = dict(flags=plan.argv[idx[0]] if idx else [], model_sha256=plan.model_files[0].sha256, converged=True)
    if gold is not None:
        report = host.get_fact(ProbeOnly, client=client_command(plan, probe_only=True))
        fails = ([f"probe could not run: {report['error']}"] if "error" in report else
                 [f"{m['error']}" for m in report["instances"] if "error" in m]
                 + probe_verdicts(report, gold, cfg["smoke_probe_tolerance"]))
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
def activated(plan: HostPlan, env_ops: dict, everything_ops: tuple):
    """Restart (drained, one at a time), smoke and probe the instances that changed, with
    rollback on any failure; a converged host is only probed. Every instance restarts when
    one of `everything_ops` (unit, release, model, driver) changes the host, else those whose
    environment file changes, plus any that is not running.

    .. code:: python

        smoke.activated(plan, env_ops={0: env0}, everything_ops=(unit, switch, *model_ops))
    """
    live = host.get_fact(ServerInstances, env_dir=ENV_DIR)
    todo, _ = restart_set(sorted(env_ops), {i for i, op in env_ops.items() if changes(op)},
                          any(changes(op) for op in everything_ops), live)
    if todo or run_context().smoke_always:
        yield FunctionCommand(_activate, (plan, todo), {})
    else:
        yield from _converged(plan)


@deploy("Smoke test")
def smoke(plan: HostPlan, server_changes) -> None:
    """Restart what changed, measure and judge, roll back on failure; record the outcome.

    .. code:: python

        smoke(plan, server(plan, model_ops))
    """
    if plan.cfg["smoke_probe"]:
        synced(name="Quality probe prompts", files=prompt_files(plan))
    activated(name="Restart, smoke test (health, offload, TTFT, tok/s, probe), rollback on failure", plan=plan,
              env_ops=server_changes.env_ops, everything_ops=server_changes.everything_ops)
