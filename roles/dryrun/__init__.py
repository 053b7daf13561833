"""Dry run (`python -m rollout INVENTORY --plan`, VOLTAFLEET_PHASE=plan): what a batch would change
on this host. The facts a batch reads (release, environment files, unit, model files, driver
packages, running instances) are compared with the host plan (voltafleet.planning.hostplan) by
voltafleet.state.dryrun; the
record goes to the controller (reports/rollout-<id>/plan-<host>.json). Nothing is changed:
this role reads facts and runs no operation.
"""
from __future__ import annotations

from pyinfra import host
from pyinfra.facts.files import Sha1File

from roles.factcache import host_fingerprint, model_size

from roles.run import report_dir, run_context
from roles.facts import EnvFiles, FileState, HostBasics, NvccVersion, Releases, ServerInstances
from roles.driver_facts import NvidiaPci, driver_plan
from voltafleet.state import dryrun
from voltafleet.gpu import nvidia
from voltafleet.planning.hostplan import ENV_DIR, UNIT_PATH, HostPlan
from voltafleet.models.modelstate import is_verified
from voltafleet.planning.unitfile import plan_unit


def _toolkit(plan: HostPlan) -> bool | None:
    """The pinned CUDA toolkit's nvcc answers (None on the cpu backend)."""
    if not plan.cuda or plan.build is None or not plan.build.cuda_bin:
        return None
    return host.get_fact(NvccVersion, path=f"{plan.build.cuda_bin}/nvcc") is not None


def _driver(plan: HostPlan) -> dict | None:
    """voltafleet.gpu.nvidia.driver_plan of this host (None: cpu, or a driver managed elsewhere)."""
    cfg = plan.settings
    if not plan.cuda or not cfg.toolchain.manage_driver:
        return None
    nvswitch = bool(nvidia.nvswitches(host.get_fact(NvidiaPci)))
    return driver_plan(host, plan.facts.os, cfg.toolchain.nvidia_driver_source, cfg.toolchain.nvidia_driver_branch,
                       cfg.toolchain.nvidia_driver_flavour, cfg.toolchain.nvidia_driver_version, nvswitch)


def observed(plan: HostPlan) -> dryrun.Observed:
    """What this host has now, read with the facts the roles of a batch read."""
    compiler = bool(host.get_fact(HostBasics)["cxx"])
    toolkit = _toolkit(plan)
    fp = host_fingerprint(host, plan.build) if plan.build is not None and compiler and toolkit is not False else None
    releases = host.get_fact(Releases, root=plan.root)
    models = {f.dest: host.get_fact(FileState, path=f.dest, sidecar=f.dest + ".verified") for f in plan.model_files}
    sizes = {f.url: model_size(f.url) for f in plan.model_files if not is_verified(models[f.dest], f.sha256)}
    return dryrun.Observed(
        compiler=compiler, toolkit=toolkit, fingerprint=fp, current=releases["current"],
        releases=tuple(releases["releases"]), env=host.get_fact(EnvFiles, env_dir=ENV_DIR),
        unit_sha1=host.get_fact(Sha1File, path=UNIT_PATH), models=models, model_bytes=sizes,
        live=host.get_fact(ServerInstances, env_dir=ENV_DIR), driver=_driver(plan))


def dry_run(plan: HostPlan) -> dryrun.HostChange:
    """Record what a batch would change on this host (or why preflight refuses it).

    .. code:: python

        dry_run(preflight())   # in deploy.py, when VOLTAFLEET_PHASE=plan
    """
    if plan.refusals:
        change = dryrun.refused(host.name, list(plan.refusals), plan.resource_lines())
    else:
        change = dryrun.host_change(plan, observed(plan), plan_unit(plan))
    change.run = run_context().run
    dryrun.write(report_dir(plan.settings), change)
    return change


__all__ = ["dry_run", "observed"]
