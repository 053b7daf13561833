"""Preflight: read the host's facts and refuse, before anything changes, a host that
cannot serve (no GPU in a CUDA group, unsupported OS, too little disk)."""
from __future__ import annotations

from functools import lru_cache

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.exceptions import PyinfraError

from roles.common import config
from roles.facts import FileState, FreeDisk, Gpus, HostBasics, NvccVersion
from voltafleet import nvidia, plan
from voltafleet.modelmeta import remote_size


class PreflightError(PyinfraError):
    pass


@lru_cache(maxsize=None)
def _model_size(url: str) -> int | None:
    return remote_size(url)


@deploy("Preflight")
def preflight() -> dict:
    """Facts, checks and the host's plan. Raises PreflightError (nothing changed) on a bad host.

    .. code:: python

        ctx = preflight()   # {"cfg": {...}, "gpus": [...], "instances": [...], ...}
    """
    cfg = config()
    basics = host.get_fact(HostBasics)
    cuda = cfg["voltafleet_backend"] == "cuda"
    gpus = host.get_fact(Gpus) if cuda else []
    model = plan.model_path(cfg)
    present = host.get_fact(FileState, path=model, sidecar=model + ".verified")
    free_model = host.get_fact(FreeDisk, path=cfg["model_dir"])
    free_root = host.get_fact(FreeDisk, path=cfg["voltafleet_root"])
    facts = {
        "os": basics["os"], "gpus": gpus,
        "nvcc": host.get_fact(NvccVersion) if cuda else None,
        "free_model": free_model["free"], "free_root": free_root["free"],
        "same_fs": free_model["dev"] == free_root["dev"],
        "model_present": bool(present and present.get("sidecar")),
        "model_bytes": None if present else _model_size(cfg["model_url"]),
    }
    errors = plan.preflight_errors(host.name, cfg, facts)
    if cuda:
        driver = next((g["driver_version"] for g in gpus if g.get("driver_version")), None)
        errors += nvidia.refusals(host.name, cfg, gpus, facts["nvcc"], driver)
        if cfg["manage_driver"]:
            try:
                nvidia.driver_packages(basics["os"], cfg["nvidia_driver_source"], cfg["nvidia_driver_branch"],
                                       cfg["nvidia_driver_flavour"])
            except ValueError as e:
                errors.append(f"{host.name}: {e}")
    if errors:
        raise PreflightError("preflight refused the rollout, nothing was changed:\n  "
                             + "\n  ".join(errors))
    return {
        "cfg": cfg,
        "gpus": gpus,
        "basics": basics,
        "instances": plan.instances(cfg, gpus),
        "cuda_archs": plan.cuda_archs(cfg, gpus) if cuda else [],
        "model_path": model,
    }
