"""Smoke test: measure and judge a host's instances. Health, all layers offloaded, time to
first token, single-stream (judged on the lowest of client, server and /metrics figures) and
N-way tok/s against thresholds, and every instance's quality probe against the golden one
kept in the repository (probes/). The smoke client (voltafleet/hostside/smoke_client.py) runs on the
host; the verdict (voltafleet/measure/smoke.py) on the controller.

The role installs the probes' prompts and returns a Judge; the activation role (restart,
drain, ready, rollback) calls it after each restart. A converged host is probed only.
"""
from __future__ import annotations

import json
import shlex

from pyinfra import logger
from pyinfra.api import FactBase, deploy

from roles.facts import GpuHealth
from roles.filesync import Wanted, synced
from roles.run import report_dir, run_context
from roles.shell import SMOKE_CLIENT, bin_path, q, sh
from voltafleet.gpu import gpuhealth
from voltafleet.models import probe as probemod
from voltafleet.measure import smoke as smokemod
from voltafleet.planning.hostplan import API_KEY_PATH, HostPlan, connect_host
from voltafleet.state.records import Smoke
from voltafleet.state.rollback import StepFailed
from voltafleet.state.runctx import RunDir

PROMPT_PATHS = {"probe": "smoke-probe-prompt.txt", "probe_long": "smoke-probe-long-prompt.txt"}  # under voltafleet_root
PROMPT_FLAGS = {"probe": "--probe-prompt-file", "probe_long": "--probe-long-prompt-file"}


def prompt_files(plan: HostPlan) -> list[Wanted]:
    """The quality probes' prompts, where the smoke client reads them."""
    return [Wanted(f"{plan.root}/{PROMPT_PATHS[p.name]}", "644", text=p.prompt) for p in probemod.probes(plan.settings)]


def client_command(plan: HostPlan, probe_only: bool = False) -> str:
    cfg = plan.settings
    args = [bin_path(plan, SMOKE_CLIENT)]
    for inst in plan.instances:
        args += ["--port", str(inst.port)]
    if connect_host(cfg) != "127.0.0.1":  # servers bound to one address of the host
        args += ["--host", connect_host(cfg)]
    args += ["--tokens", str(cfg.smoke.tokens), "--parallel", str(cfg.smoke.parallel or plan.slots),
             "--health-timeout", str(cfg.smoke.health_timeout_s), "--unit-prefix", "llama-server@",
             "--gpu-sample-interval", str(cfg.smoke.gpu_sample_s if plan.cuda else 0)]
    if cfg.server.api_key_file:
        args += ["--api-key-file", API_KEY_PATH]
    for p in probemod.probes(cfg):
        args += [PROMPT_FLAGS[p.name], f"{plan.root}/{PROMPT_PATHS[p.name]}"]
    if cfg.smoke.probe:
        args += ["--probe-tokens", str(cfg.smoke.probe_tokens)]
    if probe_only:
        args += ["--probe-only"]
    return "python3 " + q(*args)


def golden(plan: HostPlan) -> dict | None:
    """The golden probes every instance is compared with, {Probe: golden record} (None:
    smoke_probe off, or this run records them)."""
    cfg = plan.settings
    if not cfg.smoke.probe or run_context().record_probe:
        return None
    return {p: probemod.load(plan.model_files[0].sha256, p.prompt, p.tokens) for p in probemod.probes(cfg)}


def probe_verdicts(report: dict, gold: dict | None, tolerance: float, speculative: bool = False) -> list[str]:
    """Every instance's probes (short and long) against the golden ones: the failures, []
    when all match (a speculating server's drafted steps by their tokens alone: probe.compare).
    The first divergence is kept in report["probe_diverged"] for the outcome record."""
    if gold is None:
        return []
    fails, whys = [], []
    for m in report["instances"]:
        if "error" in m:
            continue
        for spec, ref in gold.items():
            why = probemod.check(ref, m.get(spec.name), tolerance, spec, speculative)
            if why:
                whys.append(why)
                fails.append(f"instance {m['instance']} (port {m['port']}): quality probe diverged: {why}")
    report["probe_diverged"] = whys[0] if whys else None
    return fails


def gpu_check(host, plan: HostPlan, report: dict) -> list[str]:
    """On a CUDA host, the boards' health read now (GpuHealth, judged as preflight does),
    kept in the report for the textfile; its refusals fail the smoke test."""
    if not plan.cuda:
        return []
    health = gpuhealth.summary(host.name, plan.settings, host.get_fact(GpuHealth))
    report["gpu_health"] = health
    for line in health["warnings"]:
        print(f"warning: {line}", flush=True)
    return health["refusals"]


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


class Judge:
    """How this host's instances are measured and judged (the activation role calls it between
    a restart and its verdict): the smoke client's run, its verdict against the thresholds and
    the golden probes, the report, the textfile, a converged host's probe-only check."""

    def __init__(self, plan: HostPlan):
        self.plan = plan

    def golden(self) -> dict | None:
        return golden(self.plan)

    def client(self, host) -> dict:
        ok, out = sh(host, client_command(self.plan))
        if not ok:
            raise RuntimeError(f"the smoke client failed: {(out.stderr.strip().splitlines() or ['no output'])[-1]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    def measure(self, host, gold: dict | None) -> tuple[dict, list[str]]:
        """Run the client on the host; (report, failures)."""
        report = self.client(host)
        probe_fails = probe_verdicts(report, gold, self.plan.settings.smoke.probe_tolerance,
                                     probemod.speculates(self.plan.settings))
        fails = smokemod.verdict(report, self.plan.settings) + probe_fails + gpu_check(host, self.plan, report)
        report["probe_only_failures"] = bool(probe_fails) and len(probe_fails) == len(fails)
        judged, notes = {}, []
        for m in report["instances"]:
            if "error" not in m:
                single, figures, note = smokemod.single_stream(m)
                judged[str(m["instance"])] = {"single_tps": single, **{f"{k}_tps": v for k, v in figures.items()}}
                notes += [f"instance {m['instance']}: {note}"] if note else []
        report.update(judged=judged, disagreements=notes)
        return report, fails

    @staticmethod
    def figures(report: dict) -> dict:
        inst = [m for m in report.get("instances", []) if "error" not in m]
        if not inst:
            return {}
        judged = report.get("judged", {})
        n_way = [smokemod.ttft_summary(m) for m in inst]
        worst = lambda key: max((t[key] for t in n_way if t[key] is not None), default=None)  # noqa: E731
        return {"ttft_ms": max(m["ttft_ms"] for m in inst), "ttft_p50_ms": worst("p50"), "ttft_p99_ms": worst("p99"),
                "single_tps": min(judged.get(str(m["instance"]), {}).get("single_tps", 0) for m in inst),
                "aggregate_tps": min(m.get("aggregate_tps") or 0 for m in inst)}

    @staticmethod
    def table(name: str, report: dict) -> str:
        return smokemod.table(name, report)

    def write(self, name: str, report: dict) -> None:
        """smoke-<host>.json: the report as a typed record (voltafleet.state.records.Smoke)."""
        RunDir(report_dir(self.plan.settings)).write(Smoke.make({**report, "host": name, "run": run_context().run}))

    def textfile(self, host, report: dict) -> None:
        """voltafleet.prom for node_exporter, after a pass and after a failure alike (the
        alerts read voltafleet_smoke_passed and the GPU gauges)."""
        cfg = self.plan.settings
        if cfg.smoke.textfile_dir:
            prom = smokemod.textfile(host.name, report, report.get("fingerprint"))
            sh(host, f"mkdir -p {shlex.quote(cfg.smoke.textfile_dir)} && "
                     + q(bin_path(self.plan, "vf-atomic"), "file", f"{cfg.smoke.textfile_dir}/voltafleet.prom")
                     + f" <<'VOLTAFLEET_PROM'\n{prom}VOLTAFLEET_PROM")

    def record_golden(self, host, report: dict) -> None:
        """Every probe of the first instance, once all instances agree (and a long probe's prompt
        reached its minimum length), saved as the golden probes."""
        cfg = self.plan.settings
        for spec in probemod.probes(cfg):
            probes = [m.get(spec.name) for m in report["instances"] if "error" not in m]
            first = probes[0] if probes else None
            for p in probes[1:]:
                why = probemod.check(first, p, cfg.smoke.probe_tolerance, spec)
                if why:
                    raise StepFailed("probe", f"instances disagree, golden probe not recorded: {why}")
            short = probemod.check(first, first, 0, spec) if first else None
            if short:
                raise StepFailed("probe", f"golden probe not recorded: {short}")
            path = probemod.save(self.plan.model_files[0].sha256, spec.prompt, spec.tokens, first or {},
                                 source=f"{host.name} release {report.get('fingerprint')}")
            logger.info(f"{host.name}: golden probe recorded in {path}: commit it beside the model's pin")

    def probe_only(self, host, gold: dict) -> list[str]:
        """A converged host: every instance's probe against the golden one, no restart; the failures."""
        report = host.get_fact(ProbeOnly, client=client_command(self.plan, probe_only=True))
        if "error" in report:
            return [f"probe could not run: {report['error']}"]
        return ([f"{m['error']}" for m in report["instances"] if "error" in m]
                + probe_verdicts(report, gold, self.plan.settings.smoke.probe_tolerance, probemod.speculates(self.plan.settings)))


@deploy("Smoke test")
def smoke(plan: HostPlan) -> Judge:
    """The quality probes' prompts in place; how this host is measured and judged (the
    activation role restarts, then asks it).

    .. code:: python

        judge = smoke(plan)
    """
    if plan.settings.smoke.probe:
        synced(name="Quality probe prompts", files=prompt_files(plan))
    return Judge(plan)
