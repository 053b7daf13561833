"""A group's variables as a host of it gets them, for the GPU runs' argv (bench/gpu/gpu_proof.py,
bench/gpu/tune29.py): all.yml, then group_vars/<group>.yml, at the llama.cpp commit the GPU runs build
(RECORDS_REF: every record in bench/records was measured on it; pin_proof's second side passes its own)."""
from __future__ import annotations

from pathlib import Path

from voltafleet.inputs.groupvars import read_yaml
from voltafleet.inputs.settings import Settings

REPO = Path(__file__).resolve().parents[2]
RECORDS_REF = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"  # b11312: the commit gpu_proof builds (its COMMIT)


def group_cfg(group: str, ref: str = RECORDS_REF) -> Settings:
    """all.yml + the group's file, bound to 127.0.0.1 (what a host of the group gets), with llama_cpp_ref
    `ref` (the plans follow the ref's compute graph: voltafleet.planning.vram.graph_extra_bytes)."""
    cfg = read_yaml(REPO / "group_vars/all.yml")  # parsed once a process for each version of the file, a copy
    cfg.update(read_yaml(REPO / f"group_vars/{group}.yml") or {})
    cfg.update(server_host="127.0.0.1", llama_cpp_ref=ref)
    return Settings.of(cfg)
