"""roles/speed.py: pyinfra's operation order and global arguments, computed faster, are
pyinfra's own, operation by operation of real runs (tests/ops/harness.py, CLI mode)."""
import importlib

import pytest

from roles import speed
from tests.ops.harness import deploy
from tests.ops.test_toolchain import R580_NOBLE_DPKG, host

operation = importlib.import_module("pyinfra.api.operation")


def test_applied_to_the_pinned_pyinfra():
    """requirements.txt pins the pyinfra whose functions the replacements were checked
    against: another version (another source) is left as it is, and this test says so."""
    assert speed.APPLIED == ["get_operation_order_from_stack", "all_global_arguments"]
    assert operation.get_operation_order_from_stack is speed.get_operation_order_from_stack


def test_global_arguments_are_pyinfras():
    assert speed.all_global_arguments() == speed.ORIGINAL["all_global_arguments"]()
    first = speed.all_global_arguments()
    first.clear()  # a caller's list is its own
    assert len(speed.all_global_arguments()) == len(speed.ORIGINAL["all_global_arguments"]())


@pytest.fixture
def both_orders(monkeypatch):
    """Every operation's order computed both ways, from the same frame and line."""
    seen = []

    def compare(state):
        # one line: the two calls see the same stack, this frame at the same line number
        ours, theirs = speed.get_operation_order_from_stack(state), speed.ORIGINAL["get_operation_order_from_stack"](state)
        seen.append((ours, theirs))
        return theirs

    monkeypatch.setattr(operation, "get_operation_order_from_stack", compare)
    return seen


@pytest.mark.parametrize("hosts", [
    [host("fresh")],  # a driver install: every toolchain operation, the reboot
    [host("fresh"), host("converged", extra=[[r"dpkg-query -W", R580_NOBLE_DPKG]]), host("h100", vars={"server_instances": 1})],
])
def test_operation_order_is_pyinfras(both_orders, hosts):
    rc, cmds, out = deploy(hosts)
    assert both_orders, out
    for ours, theirs in both_orders:
        assert ours == theirs
    assert len({tuple(t) for _, t in both_orders}) > 10  # distinct call sites, not one
