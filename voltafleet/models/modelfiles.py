"""The model's files on a host: every part of a split GGUF and the draft model, each with its
checksum and where it lives (keyed by its content, so a new checksum is a new file and the last
good one stays for a rollback). The model role fetches them, the mirrors serve them, the
settings' check and the host plan read them: one rule.

    >>> model_files(cfg)[0].dest
    '/var/lib/voltafleet/models/1462d0911d4a7a47/Qwen3.6-27B-Q4_K_S.gguf'
"""
from __future__ import annotations

import posixpath
from dataclasses import dataclass
from urllib.parse import urlparse

from voltafleet.inputs.settings import Settings
from voltafleet.inputs import checks


@dataclass(frozen=True)
class ModelFile:
    url: str
    dest: str
    sha256: str | None  # None only with model_allow_unverified


def model_filename(url: str) -> str:
    name = posixpath.basename(urlparse(url).path)
    if not name.endswith(".gguf"):
        raise ValueError(f"model_url {url!r} does not name a .gguf file")
    return name


def draft_path(cfg: Settings) -> str | None:
    url = cfg.model.draft_url
    return model_dest(cfg.model.dir, url, cfg.model.draft_sha256) if url else None


def model_files(cfg: Settings) -> list[ModelFile]:
    """Every file to fetch: each part of a split GGUF (`-00001-of-00003.gguf`; llama-server
    is given the first and finds the rest: voltafleet.inputs.checks.model_parts, the rule the
    settings' check applies too), then the draft model."""
    parts = checks.model_parts(cfg.model.url, cfg.model.sha256)
    # every part of a split GGUF in one directory (llama-server finds them by name), keyed by the first part
    out = [ModelFile(u, model_dest(cfg.model.dir, u, parts[0][1]), s) for u, s in parts]
    if cfg.model.draft_url:
        out.append(ModelFile(cfg.model.draft_url, draft_path(cfg), cfg.model.draft_sha256))
    return out


def model_dest(model_dir: str, url: str, sha256: str | None) -> str:
    """Where a model file lives on a host: keyed by its content (the sha256's first 16 hex
    digits), so a new checksum under the same file name is a new file and the last good one
    stays for a rollback until the next pass; unverified files under `unverified/`."""
    return posixpath.join(model_dir, sha256[:16] if sha256 else "unverified", model_filename(url))
