"""Per-host decisions, made once from data: instances and ports, CUDA archs, paths,
and the preflight verdict. No pyinfra import: every rule is unit-tested alone.
"""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from urllib.parse import urlparse

GIB = 1024 ** 3


@dataclass(frozen=True)
class Instance:
    index: int  # also the GPU index on CUDA hosts (CUDA_VISIBLE_DEVICES)
    port: int

    @property
    def unit(self) -> str:
        return f"llama-server@{self.index}.service"


def instances(cfg: dict, gpus: list[dict]) -> list[Instance]:
    """One server per GPU (or server_instances of them); on the CPU backend, server_instances."""
    if cfg["voltafleet_backend"] == "cuda":
        count = len(gpus) if cfg["server_instances"] is None else min(cfg["server_instances"], len(gpus))
    else:
        count = cfg["server_instances"]
    return [Instance(i, cfg["server_port_base"] + i) for i in range(count)]


def cuda_archs(cfg: dict, gpus: list[dict]) -> list[int]:
    """The configured archs, else each GPU's own compute capability ("7.0" -> 70)."""
    if cfg["llama_cpp_cuda_archs"]:
        return sorted(set(cfg["llama_cpp_cuda_archs"]))
    return sorted({int(g["compute_cap"].replace(".", "")) for g in gpus})


def model_filename(url: str) -> str:
    name = posixpath.basename(urlparse(url).path)
    if not name.endswith(".gguf"):
        raise ValueError(f"model_url {url!r} does not name a .gguf file")
    return name


def draft_path(cfg: dict) -> str | None:
    url = cfg["model_draft_url"]
    return posixpath.join(cfg["model_dir"], model_filename(url)) if url else None


SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


def model_files(cfg: dict) -> list[tuple[str, str, str | None]]:
    """(url, dest, sha256) of every file to fetch: each part of a split GGUF
    (`-00001-of-00003.gguf`; llama-server is given the first and finds the rest), then
    the draft model. model_sha256 is one checksum, or a list with one per part."""
    url, shas = cfg["model_url"], cfg["model_sha256"]
    m = SPLIT.search(url)
    urls = [url] if not m else [url[:m.start()] + f"-{i:05d}-of-{m.group(2)}.gguf"
                                for i in range(1, int(m.group(2)) + 1)]
    if shas is None:
        shas = [None] * len(urls)  # model_allow_unverified
    elif isinstance(shas, str):
        if len(urls) > 1:
            raise ValueError(f"model_url is a split GGUF of {len(urls)} parts: model_sha256 must list "
                             "one checksum per part")
        shas = [shas]
    elif len(shas) != len(urls):
        raise ValueError(f"model_sha256 lists {len(shas)} checksums for {len(urls)} file(s)")
    out = [(u, posixpath.join(cfg["model_dir"], model_filename(u)), s) for u, s in zip(urls, shas)]
    if cfg["model_draft_url"]:
        out.append((cfg["model_draft_url"], draft_path(cfg), cfg["model_draft_sha256"]))
    return out


def preflight_errors(host: str, cfg: dict, facts: dict) -> list[str]:
    """Every reason not to touch this host, each naming the host and the number.

    facts: os ("debian-12"), gpus (list), nvcc ("12.9.86" or None), free_model (bytes),
    free_root (bytes), model_bytes (int or None), model_present (bool).
    """
    errors = []
    if facts["os"] not in cfg["preflight_supported_os"]:
        errors.append(f"{host}: OS {facts['os']} is not one of {', '.join(cfg['preflight_supported_os'])} "
                      "(preflight_supported_os)")
    gpus = facts["gpus"]
    if cfg["voltafleet_backend"] == "cuda":
        if not gpus:
            errors.append(f"{host}: is in a CUDA group but nvidia-smi lists 0 GPUs "
                          "(no driver yet? set manage_driver: true; or move the host to a cpu group)")
        if cfg["server_instances"] and gpus and cfg["server_instances"] > len(gpus):
            errors.append(f"{host}: server_instances is {cfg['server_instances']} but the host has "
                          f"{len(gpus)} GPU(s)")
    need_model = 0 if facts["model_present"] else int((facts["model_bytes"] or 0) * 1.02)  # 2 % margin
    need_build = int(cfg["preflight_build_disk_gb"] * GIB)
    free_model, free_root = facts["free_model"], facts["free_root"]
    if free_model is not None and free_root is not None and facts["same_fs"]:
        if free_model < need_model + need_build:
            errors.append(f"{host}: {free_model / GIB:.1f} GiB free for model ({need_model / GIB:.1f} GiB) "
                          f"plus build ({need_build / GIB:.1f} GiB)")
    else:
        if free_model is not None and free_model < need_model:
            errors.append(f"{host}: {free_model / GIB:.1f} GiB free in {cfg['model_dir']}, "
                          f"the model needs {need_model / GIB:.1f} GiB")
        if free_root is not None and free_root < need_build:
            errors.append(f"{host}: {free_root / GIB:.1f} GiB free in {cfg['voltafleet_root']}, "
                          f"a build needs {need_build / GIB:.1f} GiB (preflight_build_disk_gb)")
    return errors
