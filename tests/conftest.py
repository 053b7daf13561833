import pytest

from tests.fixture_vars import prod_host_vars
from voltafleet.inputs.settings import Settings
from voltafleet.planning.flags import pinned_help


@pytest.fixture
def cfg():
    """A valid prod host config (all.yml's keys, the values tests rely on pinned, so an
    operator's edit of group_vars/all.yml never breaks a test), with a checksum and the
    -c/-np the VRAM plan resolves for a V100 16 GB."""
    return Settings.of(prod_host_vars())


@pytest.fixture
def help_text():
    """`llama-server --help` of the pinned llama.cpp (commit 0c1e570), as built in the lab."""
    return pinned_help("0c1e57098bba43ac29e6e3b677cdceebdd22334f")
