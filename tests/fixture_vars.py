"""A valid prod host's variables for unit tests: group_vars/all.yml for the key set, with
every value the tests rely on pinned here, so a user editing all.yml (setting model_sha256,
another port or model) does not change what the tests see."""
from __future__ import annotations

import yaml

from voltafleet.inputs.groupvars import GROUP_VARS
from voltafleet.inputs.settings import Settings

PINNED_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
FIXED = {
    "voltafleet_backend": "cuda",
    "voltafleet_root": "/opt/voltafleet",
    "llama_cpp_repo": "https://github.com/ggml-org/llama.cpp.git",
    "llama_cpp_ref": PINNED_COMMIT,
    "llama_cpp_cmake_extra": [],
    "preflight_build_disk_gb": 6,
    "preflight_supported_os": ["debian-12", "ubuntu-22.04", "ubuntu-24.04"],
    "cuda_toolkit_version": "12.9",
    "manage_driver": True,
    "nvidia_driver_branch": 580,
    "nvidia_driver_flavour": "proprietary",
    "nvidia_driver_source": "nvidia_repo",
    "llama_cpp_cuda_archs": None,
    "llama_cpp_targets": ["llama-server", "llama-bench"],
    "model_url": "https://huggingface.co/unsloth/Qwen3.6-27B-GGUF/resolve/main/Qwen3.6-27B-Q4_K_S.gguf",
    "model_sha256": None,
    "model_allow_unverified": False,
    "model_dir": "/var/lib/voltafleet/models",
    "model_draft_url": None,
    "model_draft_sha256": None,
    "server_instances": None,
    "server_port_base": 8080,
    "server_host": "0.0.0.0",
    "server_allow_unauthenticated": True,  # the tests that check the refusal set it false
    "gateway_allow_unauthenticated": True,  # likewise
    "server_slots_endpoint": False,
    "server_ctx": None,
    "server_parallel": None,
    "server_cache_type_k": "q8_0",
    "server_cache_type_v": "q8_0",
    "server_flash_attn": "on",
    "server_gpu_layers": "all",
    "server_allow_partial_offload": False,
    "server_threads": 8,
    "server_api_key_file": None,
    "server_extra_flags": [],
    "server_user": "llama",
}


def all_yml_vars() -> dict:
    """all.yml's keys and values, with FIXED over them (no checksum: a test sets it)."""
    data = yaml.safe_load((GROUP_VARS / "all.yml").read_text())
    data.update(FIXED)
    return data


def prod_host_vars() -> dict:
    """A valid V100 16 GB host: a checksum, and the ctx/slots the VRAM plan resolves."""
    return {**all_yml_vars(), "model_sha256": "a" * 64, "server_ctx": 8192, "server_parallel": 4}


def all_yml_settings(**over) -> Settings:
    """all_yml_vars() with `over` (group_vars keys), typed."""
    return Settings.of({**all_yml_vars(), **over})
