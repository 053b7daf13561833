"""A group's variables as a host of it gets them, for the GPU runs' argv (bench/gpu/gpu_proof.py,
bench/gpu/tune29.py): all.yml, then group_vars/<group>.yml."""
from __future__ import annotations

from pathlib import Path

import yaml

from voltafleet.inputs.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def group_cfg(group: str) -> Settings:
    """all.yml + the group's file, bound to 127.0.0.1 (what a host of the group gets)."""
    cfg = yaml.safe_load((REPO / "group_vars/all.yml").read_text())
    cfg.update(yaml.safe_load((REPO / f"group_vars/{group}.yml").read_text()) or {})
    cfg.update(server_host="127.0.0.1")
    return Settings.of(cfg)
