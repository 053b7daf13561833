from pathlib import Path

import pytest
import yaml

from voltafleet.groupvars import GROUP_VARS

FIXTURES = Path(__file__).resolve().parent / "fixtures"

# The values the tests reason about, pinned here so that an operator's edit of
# group_vars/all.yml (a checksum, a port, a path) never breaks a test.
PINNED = {
    "voltafleet_backend": "cuda", "voltafleet_root": "/opt/voltafleet",
    "preflight_build_disk_gb": 6, "preflight_supported_os": ["debian-12", "ubuntu-22.04", "ubuntu-24.04"],
    "cuda_toolkit_version": "12.9", "manage_driver": True, "nvidia_driver_branch": 580,
    "nvidia_driver_flavour": "proprietary", "nvidia_driver_source": "nvidia_repo",
    "llama_cpp_cuda_archs": None, "llama_cpp_cmake_extra": [], "llama_cpp_targets": ["llama-server", "llama-bench"],
    "model_url": "https://huggingface.co/unsloth/Qwen3.6-27B-GGUF/resolve/main/Qwen3.6-27B-Q4_K_S.gguf",
    "model_sha256": "a" * 64, "model_allow_unverified": False, "model_dir": "/var/lib/voltafleet/models",
    "model_draft_url": None, "model_draft_sha256": None,
    "server_instances": None, "server_port_base": 8080, "server_host": "0.0.0.0",
    "server_ctx": 8192, "server_parallel": 4,  # what the VRAM plan resolves for a V100 16 GB
    "server_cache_type_k": "q8_0", "server_cache_type_v": "q8_0", "server_flash_attn": "on",
    "server_gpu_layers": "all", "server_allow_partial_offload": False, "server_threads": 8,
    "server_api_key_file": None, "server_extra_flags": [], "server_user": "llama",
}


@pytest.fixture
def cfg():
    """A valid prod host config: every key of group_vars/all.yml, with the values tests
    depend on pinned."""
    data = yaml.safe_load((GROUP_VARS / "all.yml").read_text())
    data.update(PINNED)
    return data


@pytest.fixture
def help_text():
    """`llama-server --help` of the pinned llama.cpp (commit 0c1e570), as built in the lab."""
    return (FIXTURES / "llama-server-help-0c1e570.txt").read_text()
