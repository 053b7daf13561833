"""Preflight: read the host's facts, make its plan (voltafleet.hostplan.make_plan) and
refuse, before anything changes, a host that cannot serve."""
from __future__ import annotations

from functools import lru_cache

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import PyinfraError

from roles.common import config, sources
from roles.facts import FileState, FreeDisk, GpuHealth, Gpus, HostBasics, NvccVersion
from roles.llama_cpp import resolve_ref
from voltafleet import gguf_header
from voltafleet.hostplan import HostFacts, HostPlan, make_plan, model_files
from voltafleet.modelmeta import remote_size


class PreflightError(PyinfraError):
    pass


@lru_cache(maxsize=None)
def _model_size(url: str) -> int | None:
    return remote_size(url)


@lru_cache(maxsize=None)
def model_header(url: str):
    """The model's GGUF header, read once per rollout over HTTP Range; an error text if not."""
    try:
        return gguf_header.read_url(url)
    except Exception as e:  # reported by the plan with the fix
        return f"{type(e).__name__}: {e}"


def host_facts(cfg: dict) -> HostFacts:
    """The facts the plan needs, read from the current host."""
    basics = host.get_fact(HostBasics)
    cuda = cfg["voltafleet_backend"] == "cuda"
    model = model_files(cfg)[0].dest
    present = host.get_fact(FileState, path=model, sidecar=model + ".verified")
    free_model = host.get_fact(FreeDisk, path=cfg["model_dir"])
    free_root = host.get_fact(FreeDisk, path=cfg["voltafleet_root"])
    gpus = host.get_fact(Gpus) if cuda else []
    driver = bool(gpus) and not any(g.get("pci_only") for g in gpus)  # no driver yet: the smoke test judges the boards
    return HostFacts(
        os=basics["os"], gpus=gpus, gpu_health=host.get_fact(GpuHealth) if driver else None,
        nvcc=host.get_fact(NvccVersion) if cuda else None,
        free_model=free_model["free"], free_root=free_root["free"], same_fs=free_model["dev"] == free_root["dev"],
        model_present=bool(present and present.get("sidecar")),
        model_bytes=None if present else _model_size(cfg["model_url"]),
        systemd=basics["systemd"],
    )


@deploy("Preflight")
def preflight() -> HostPlan:
    """Facts, checks and the host's plan. Raises PreflightError (nothing changed) on a bad host.

    .. code:: python

        plan = preflight()   # a voltafleet.hostplan.HostPlan
    """
    cfg = config()
    commit = resolve_ref(cfg["llama_cpp_repo"], cfg["llama_cpp_ref"])  # a bad ref stops everything here
    facts = host_facts(cfg)
    header = model_header(cfg["model_url"]) if cfg["voltafleet_backend"] == "cuda" else None
    plan = make_plan(host.name, cfg, facts, header, commit, sources())
    if plan.refusals:
        raise PreflightError("preflight refused the rollout, nothing was changed:\n  "
                             + "\n  ".join(plan.refusals))
    for line in plan.warnings:
        logger.warning(f"warning: {line}")
    if plan.vram_note:
        logger.info(f"{host.name}: VRAM plan: {plan.vram_note}")
    return plan
