"""Preflight: read the host's facts and refuse, before anything changes, a host that
cannot serve (no GPU in a CUDA group, unsupported OS, too little disk)."""
from __future__ import annotations

from functools import lru_cache

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import PyinfraError

from roles.common import config
from roles.facts import FileState, FreeDisk, Gpus, HostBasics, NvccVersion
from voltafleet import gguf_header, nvidia, plan, vram
from voltafleet.modelmeta import remote_size


class PreflightError(PyinfraError):
    pass


@lru_cache(maxsize=None)
def _model_size(url: str) -> int | None:
    return remote_size(url)


@lru_cache(maxsize=None)
def _header(url: str):
    """The model's GGUF header, read once per rollout over HTTP Range; an error text if not."""
    try:
        return gguf_header.read_url(url)
    except Exception as e:  # reported by the caller with the fix
        return f"{type(e).__name__}: {e}"


def vram_plan(cfg: dict, gpus: list[dict]) -> tuple[dict, str | None, str | None]:
    """(cfg with -c/-np resolved, the plan's description, an error or None) for the smallest GPU."""
    header = _header(cfg["model_url"])
    if isinstance(header, str):
        if cfg["server_ctx"] and cfg["server_parallel"]:
            return cfg, f"not planned: could not read the GGUF header ({header})", None
        return cfg, None, (f"cannot read the GGUF header of model_url to plan VRAM ({header}). Fix: make "
                           "model_url reachable from the controller, or set server_ctx and server_parallel")
    gpu_mib = min(g["memory_mib"] for g in gpus)
    p = vram.choose(vram.ModelShape.from_header(header), cfg["server_ctx"], cfg["server_parallel"],
                    cfg["server_cache_type_k"], cfg["server_cache_type_v"], gpu_mib,
                    cfg["vram_headroom_mib"], cfg["vram_cuda_overhead_mib"])
    resolved = {**cfg, "server_ctx": p.ctx, "server_parallel": p.parallel}
    if p.fits:
        return resolved, p.describe(), None
    return resolved, p.describe(), (f"the model does not fit one GPU: {p.describe()}. Fix: lower server_ctx "
                                    "or server_parallel, use q8_0 KV (server_cache_type_k/v), or a smaller quant")


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
    files = plan.model_files(cfg)
    model = files[0][1]  # llama-server's -m: the model, or the first part of a split GGUF
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
    vram_text = None
    if cuda and gpus:
        cfg, vram_text, vram_error = vram_plan(cfg, gpus)
        if vram_error:
            errors.append(f"{host.name}: {vram_error}")
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
    if vram_text:
        logger.info(f"{host.name}: VRAM plan: {vram_text}")
    return {
        "cfg": cfg,
        "model_files": files,
        "draft_path": plan.draft_path(cfg),
        "gpus": gpus,
        "basics": basics,
        "instances": plan.instances(cfg, gpus),
        "cuda_archs": plan.cuda_archs(cfg, gpus) if cuda else [],
        "model_path": model,
    }
