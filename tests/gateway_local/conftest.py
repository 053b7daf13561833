import pytest

from tests.gateway_local import harness


@pytest.fixture(scope="module")
def local_gateway(tmp_path_factory):
    """llama-server and the gateway on this machine (a missing piece fails the tests)."""
    harness.require()
    g = harness.Local(tmp_path_factory.mktemp("gateway"), {"web": "key-web", "batch": "key-batch"})
    try:
        yield g.start()
    finally:
        g.stop()
