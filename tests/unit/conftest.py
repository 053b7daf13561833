from pathlib import Path

import pytest

from tests.unit.fixture_vars import prod_host_vars

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def cfg():
    """A valid prod host config (all.yml's keys, the values tests rely on pinned), with a
    checksum and the -c/-np the VRAM plan resolves for a V100 16 GB."""
    return prod_host_vars()


@pytest.fixture
def help_text():
    """`llama-server --help` of the pinned llama.cpp (commit 0c1e570), as built in the lab."""
    return (FIXTURES / "llama-server-help-0c1e570.txt").read_text()
