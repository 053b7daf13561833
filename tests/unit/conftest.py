from pathlib import Path

import pytest
import yaml

from voltafleet.groupvars import GROUP_VARS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def cfg():
    """group_vars/all.yml's defaults plus a checksum: a valid prod host config."""
    data = yaml.safe_load((GROUP_VARS / "all.yml").read_text())
    data["model_sha256"] = "a" * 64
    data.update(server_ctx=8192, server_parallel=4)  # what the VRAM plan resolves for a V100 16 GB
    return data


@pytest.fixture
def help_text():
    """`llama-server --help` of the pinned llama.cpp (commit 0c1e570), as built in the lab."""
    return (FIXTURES / "llama-server-help-0c1e570.txt").read_text()
