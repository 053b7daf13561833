"""pyinfra's fixture style, in process: a fact is command output in, parsed value out;
an operation is facts in, commands out. No connector, no SSH: milliseconds a test."""
from __future__ import annotations

from types import SimpleNamespace

from pyinfra.context import ctx_host, ctx_inventory, ctx_state

from tests.fixture_vars import PINNED_COMMIT

# What tests/ops/inventory.py sets on every fake host, over group_vars.
FAKE_OVERRIDES = {
    "model_sha256": "a" * 64,
    "model_url": "http://127.0.0.1:9/models/Qwen3.6-27B-Q4_K_S.gguf",
    # no model mirror here: the driver scenarios serve the group's -c/-np unplanned
    # (test_vram_refusal.py serves a real header and plans)
    "vram_plan_required": False,
    # no llama-server answers here: no golden probe to compare with (tests/lab probes)
    "smoke_probe": False,
    # no API key file in these scenarios: the servers' network is taken as closed
    "server_allow_unauthenticated": True,
    "gateway_allow_unauthenticated": True,
    # a 40-hex commit resolves without `git ls-remote` (no network here), and voltafleet ships its
    # --help: the pin before b11434 (group_vars' tag is resolved on the lab's git daemon: tests/lab/test_pin)
    "llama_cpp_ref": PINNED_COMMIT,
}


class FakeHost:
    """A host whose facts come from a dict: {FactClass: value} or {FactClass: {kwargs-tuple: value}}."""

    def __init__(self, facts: dict, name: str = "gpu-01", executing: bool = True, data: dict | None = None):
        self.facts, self.name, self.data = facts, name, FakeData(data or {})
        self.state = SimpleNamespace(is_executing=executing, inventory=[], active_hosts=set())
        self.groups = []

    def get_fact(self, cls, *args, **kwargs):
        value = self.facts[cls]
        if isinstance(value, dict) and kwargs and tuple(sorted(kwargs.items())) in value:
            return value[tuple(sorted(kwargs.items()))]
        return value


class FakeData(dict):
    """host.data: attribute and .get access."""

    def __getattr__(self, key):
        return self.get(key)


class FakeInventory:
    def get_override_data(self):
        return {}


class FakeOp:
    """An earlier operation's result, as pyinfra's OperationMeta answers it."""

    def __init__(self, changed: bool, complete: bool = True):
        self.changed_, self.complete = changed, complete

    def is_complete(self):
        return self.complete

    def did_change(self):
        return self.changed_

    @property
    def will_change(self):
        return self.changed_


def commands(op, fake: FakeHost, *args, **kwargs) -> list[str]:
    """The commands an operation yields on this fake host, as strings."""
    with ctx_host.use(fake), ctx_state.use(fake.state), ctx_inventory.use(FakeInventory()):
        return [c.shell if hasattr(c, "shell") else str(c) if not hasattr(c, "function")
                else f"<function {c.function.__name__}>" for c in op._inner(*args, **kwargs)]
