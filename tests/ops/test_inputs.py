"""Bad inputs on the fake connector: refused when the inventory loads, exit code 2, one
block naming the file, key and fix, no traceback, no command run on the host, no canary file
on the controller. In process (tests/ops/harness.py: the hosts tests/ops/inventory.py makes
for the CLI, through the same load_or_exit); tests/ops/test_cli.py runs a bad value through
the real CLI."""
from pathlib import Path

import pytest

from tests.ops.test_toolchain import run

CANARY = Path("/tmp/vf-canary-ops")


@pytest.fixture(autouse=True)
def no_canary():
    CANARY.unlink(missing_ok=True)
    yield
    assert not CANARY.exists(), "a value ran as a command on the controller"


@pytest.mark.parametrize("vars, text", [
    ({"model_url": f"http://127.0.0.1:9/models/`touch {CANARY}`.gguf"}, "model_url: is"),
    ({"model_url": f"http://127.0.0.1:9/models/$(touch {CANARY}).gguf"}, "model_url: is"),
    ({"llama_cpp_repo": f"--upload-pack=touch {CANARY}"}, "llama_cpp_repo: is '--upload-pack="),
    ({"llama_cpp_ref": f"--upload-pack=touch {CANARY}"}, "llama_cpp_ref: is '--upload-pack="),
    ({"server_extra_flags": [f"--alias $(touch {CANARY})"]}, "server_extra_flags: has the item"),
    ({"server_extra_flags": ["-ngl 10"]}, "server_extra_flags: -ngl is set by voltafleet from server_gpu_layers"),
    ({"server_extra_flags": ["--draft-max 4"]}, "server_extra_flags: --draft-max: llama-server 0c1e57098bba says"),
    ({"server_api_key_file": "/nonexistent/voltafleet-key"}, "server_api_key_file: /nonexistent/voltafleet-key does not exist on the controller"),
    ({"server_instances": 8, "server_port_base": 65535}, "server_port_base: is 65535: ports 65535-65542"),
])
def test_refused_when_the_inventory_loads_before_any_command(vars, text):
    rc, cmds, out = run("bad-input", vars=vars)
    assert rc == 2, out
    assert "configuration refused, no host was touched" in out
    assert f"tests/ops/inventory.py (host @fake/bad-input): {text}" in out
    assert "\n  Fix: " in out and "Traceback" not in out
    assert cmds == []
