"""Preflight: read the host's facts, make its plan (voltafleet.planning.hostplan.make_plan) and
refuse, before anything changes, a host that cannot serve."""
from __future__ import annotations

from dataclasses import replace

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import PyinfraError

from roles.factcache import host_fact, host_fingerprint, model_header, model_size, resolve_ref

from roles.gateway_api import is_gateway, missing_gateways

from roles.run import config, hold_fleet_lock, report_dir, run_context, sources
from roles.facts import FileState, FreeDisk, GpuHealth, Gpus, HostBasics, NvccVersion
from voltafleet.planning import hostcpu
from voltafleet.models import probe as probemod
from voltafleet.planning.hostplan import HostFacts, HostPlan, make_plan, model_files
from voltafleet.state.records import Preflight
from voltafleet.state.runctx import RunDir


class PreflightError(PyinfraError):
    pass


def host_facts(cfg: dict) -> HostFacts:
    """The facts the plan needs, read from the current host."""
    basics = host_fact(host, HostBasics)
    cuda = cfg.preflight.backend == "cuda"
    model = model_files(cfg)[0].dest
    present = host.get_fact(FileState, path=model, sidecar=model + ".verified")
    free_model = host.get_fact(FreeDisk, path=cfg.model.dir)
    free_root = host.get_fact(FreeDisk, path=cfg.preflight.root, releases=f"{cfg.preflight.root}/releases")
    gpus = host_fact(host, Gpus) if cuda else []
    driver = bool(gpus) and not any(g.get("pci_only") for g in gpus)  # no driver yet: the smoke test judges the boards
    health = host.get_fact(GpuHealth) if driver else None
    return HostFacts(
        os=basics["os"], gpus=gpus, gpu_health=health,
        nvcc=host_fact(host, NvccVersion) if cuda else None,
        free_model=free_model["free"], free_root=free_root["free"], same_fs=free_model["dev"] == free_root["dev"],
        model_present=bool(present and present.get("sidecar")),
        model_bytes=None if present else model_size(cfg.model.url),
        systemd=basics["systemd"], releases=free_root.get("releases"),
        **resource_facts(basics, health),
    )


def resource_facts(basics: dict, health: dict | None) -> dict:
    """HostFacts' memory, CPU and NUMA fields from HostBasics (None where it did not say)."""
    kib = lambda key: basics[key] * 1024 if basics.get(key) is not None else None  # noqa: E731
    addresses = {g["index"]: g["pci"] for g in (health or {}).get("gpus", []) if g.get("pci")}
    return dict(mem_total=kib("mem_total_kib"), mem_available=kib("mem_available_kib"), cpus=basics.get("cpus"),
                numa_nodes=basics.get("nodes") or None,
                gpu_numa=hostcpu.gpu_nodes(basics["gpu_numa"], addresses) if basics.get("gpu_numa") else None)


def run_refusals(cfg: dict) -> list[str]:
    """Reasons this run may not touch the host that are not the host's own: no golden
    probe to compare with; a gateway this run cannot reach (no drain is possible)."""
    errors = []
    if cfg.smoke.enabled and cfg.smoke.probe and not run_context().record_probe:
        sha = model_files(cfg)[0].sha256
        for p in probemod.probes(cfg):
            try:
                probemod.load(sha, p.prompt, p.tokens)
            except probemod.ProbeError as e:
                errors.append(f"{host.name}: {'smoke_probe_long' if p.min_prompt_tokens else 'smoke_probe'}: {e}")
    missing = missing_gateways(host.state)
    if missing and run_context().phase in ("all", "batch", "plan", "tune") and not run_context().no_gateway:
        errors.append(f"{host.name}: gateway {', '.join(missing)} is not reachable in this run: no instance could "
                      "be drained before its restart. Fix: bring the gateway back (or include it in --limit); "
                      "to restart without a drain, run with --no-gateway (VOLTAFLEET_NO_GATEWAY=1)")
    return errors


def preflight_record(plan: HostPlan, refusals: list[str] = ()) -> None:
    """What the rolling driver needs from this host: its instances and ports, its slots, its
    release fingerprint when its compiler is known; or why preflight refused it (`refusals`:
    the driver learns a refusal from this record, never from pyinfra's output)."""
    cfg = plan.settings
    fp = host_fingerprint(host, plan.build) if plan.build and not refusals else None
    RunDir(report_dir(cfg)).write(Preflight(
        host=host.name, run=run_context().run,
        address=cfg.server.address or host.data.get("ssh_hostname") or host.name,
        ports=tuple(i.port for i in plan.instances), slots=plan.slots, tier=cfg.server.tier,
        fingerprint=fp, refusals=tuple(refusals)))


@deploy("Preflight")
def preflight() -> HostPlan:
    """Facts, checks and the host's plan. Raises PreflightError (nothing changed) on a bad host;
    in the plan phase (`python -m rollout --plan`) returns the plan with its refusals instead,
    for the plan role to record.

    .. code:: python

        plan = preflight()   # a voltafleet.planning.hostplan.HostPlan
    """
    hold_fleet_lock(host.state)
    cfg = config()
    commit = resolve_ref(cfg.build.repo, cfg.build.ref)  # a bad ref stops everything here
    facts = host_facts(cfg)
    header = model_header(cfg.model.url)  # the VRAM plan (CUDA) and the host memory plan (both backends)
    plan = make_plan(host.name, cfg, facts, header, commit, sources())
    refusals = list(plan.refusals) + run_refusals(plan.settings)
    if refusals and run_context().phase == "plan":
        return replace(plan, refusals=tuple(refusals))  # recorded by the plan role, per host
    if refusals:
        if run_context().phase != "all":  # the driver's run (a plain run prints them: nobody reads a record)
            preflight_record(plan, refusals)
        raise PreflightError("preflight refused the rollout, nothing was changed:\n  " + "\n  ".join(refusals))
    for line in plan.warnings:
        logger.warning(f"warning: {line}")
    if plan.vram_note:
        logger.info(f"{host.name}: VRAM plan: {plan.vram_note}")
    if run_context().phase in ("all", "preflight"):  # once a rollout: the later phases plan the same again
        for line in plan.resource_lines():
            logger.info(f"{host.name}: {line}")
    if run_context().phase == "preflight":
        preflight_record(plan)
    return plan


__all__ = ["PreflightError", "is_gateway", "preflight"]
