"""roles/speed.py: pyinfra's operation order and global arguments, computed faster, are
pyinfra's own, operation by operation of real runs (tests/ops/harness.py, CLI mode)."""
import importlib

import pytest

from roles import speed
from tests.ops.harness import deploy
from tests.ops.test_toolchain import R580_NOBLE_DPKG, host

operation = importlib.import_module("pyinfra.api.operation")
CALLERS = [importlib.import_module(f"pyinfra.api.{m}") for m in ("arguments", "facts", "operation", "deploy")]


def test_applied_to_the_pinned_pyinfra():
    """requirements.txt pins the pyinfra whose functions the replacements were checked
    against: another version (another source) is left as it is, and this test says so."""
    assert speed.applied() == speed.ALL and speed.why_not() is None
    assert operation.get_operation_order_from_stack is speed.get_operation_order_from_stack
    assert all(m.pop_global_arguments is speed.pop_global_arguments for m in CALLERS)
    assert importlib.import_module("pyinfra.connectors.ssh").SSHConnector._connect is speed._connect


class _Client:
    """A paramiko client's surface that nodelay reads: get_transport().sock."""
    def __init__(self, sock):
        self.transport = type("T", (), {"sock": sock})()

    def get_transport(self):
        return self.transport


def test_the_connection_gets_tcp_nodelay_after_pyinfras_own_connect(monkeypatch):
    """Replacement 4: pyinfra's _connect runs as it is, then its client's TCP socket has Nagle's
    algorithm off (a remote command no longer waits ~40 ms for the remote's delayed ACK); a
    connection through a jump host (a paramiko channel, no socket) is left as it is."""
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    sock = socket.create_connection(server.getsockname())
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0  # the kernel's default: Nagle on
        calls = []

        def pyinfras_connect(self):
            calls.append(self)
            self.client = _Client(sock)

        monkeypatch.setitem(speed.ORIGINAL, "SSHConnector._connect", pyinfras_connect)
        connector = type("Connector", (), {"client": None})()
        speed._connect(connector)
        assert calls == [connector] and sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert speed.nodelay(_Client(object())) is False and speed.nodelay(None) is False
    finally:
        sock.close()
        server.close()


def test_applied_sets_tcp_nodelay_on_the_connection_the_running_host_already_has():
    """pyinfra's CLI connects before it loads deploy.py: applied(), deploy.py's first line, sets it
    on the connection of the host whose deploy file runs (where the measured effect comes from)."""
    import socket

    from pyinfra import context

    server = socket.create_server(("127.0.0.1", 0))
    sock = socket.create_connection(server.getsockname())
    host = type("Host", (), {"connector": type("Connector", (), {"client": _Client(sock)})()})()
    try:
        with context.ctx_host.use(host):
            speed.applied()
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        sock.close()
        server.close()


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


@pytest.fixture
def both_arguments(monkeypatch):
    """Every pop_global_arguments call (operations, facts, deploys) made both ways on copies
    of its keyword arguments: the same arguments, keys found and keyword arguments left."""
    seen = []

    def compare(state, host, kwargs):
        mine, theirs = dict(kwargs), dict(kwargs)
        ours = speed.pop_global_arguments(state, host, mine)
        original = speed.ORIGINAL["pop_global_arguments"](state, host, theirs)
        seen.append(((dict(ours[0]), ours[1]), (dict(original[0]), original[1]), mine, theirs))  # as returned: pyinfra pops from it later
        kwargs.clear()
        kwargs.update(theirs)
        return original

    for module in CALLERS:
        monkeypatch.setattr(module, "pop_global_arguments", compare)
    return seen


def test_global_arguments_and_host_defaults_are_pyinfras(both_arguments):
    # host data with connector arguments (as inventory/prod.py's _sudo) and without
    rc, cmds, out = deploy([host("sudo", vars={"_sudo": True, "_sudo_user": "root", "_timeout": 7}),
                            host("plain")])
    assert len(both_arguments) > 50, out
    for ours, original, mine, theirs in both_arguments:
        assert ours == original and mine == theirs
    assert any(o[0][0]["_sudo"] for o in both_arguments) and not all(o[0][0]["_sudo"] for o in both_arguments)


def test_every_data_layer_in_pyinfras_order():
    """Override data (--data), host data, groups' data (the last group wins), the inventory's
    and none: each argument's default where pyinfra's HostData finds it."""
    from pyinfra.api import Config, Inventory, State

    inventory = Inventory((["a", ("b", {"_sudo_user": "host-b", "_timeout": 3})], {"_timeout": 9, "_env": {"A": "1"}}),
                          override_data={"_retries": 2},
                          g1=(["a"], {"_sudo": True, "_shell_executable": "bash"}),
                          g2=(["a", "b"], {"_sudo": False, "_chdir": "/x", "_env": {"B": "2"}}))
    state = State(inventory, Config())
    for h in inventory:
        for kwargs in ({}, {"_sudo": True, "name": "x"}, {"_timeout": 5, "path": "/p"}):
            mine, theirs = dict(kwargs), dict(kwargs)
            ours = speed.pop_global_arguments(state, h, mine)
            assert ours == speed.ORIGINAL["pop_global_arguments"](state, h, theirs) and mine == theirs
    assert speed.pop_global_arguments(state, inventory.get_host("b"), {})[0]["_timeout"] == 3


def test_another_pyinfra_is_left_as_it_is_with_a_warning(monkeypatch):
    """A pyinfra whose source differs: nothing replaced, one warning naming the fix."""
    monkeypatch.setattr(speed, "APPLIED", [])
    monkeypatch.setattr(speed, "_WARNED", [])
    monkeypatch.setitem(speed.CHECKED, "all_global_arguments", "0" * 16)
    monkeypatch.setitem(speed.CHECKED, "get_operation_order_from_stack", "0" * 16)
    monkeypatch.setitem(speed.CHECKED, "pop_global_arguments", "0" * 16)
    monkeypatch.setitem(speed.CHECKED, "SSHConnector._connect", "0" * 16)
    said = []
    assert speed.applied(warn=said.append) == [] and speed.applied(warn=said.append) == []
    assert len(said) == 1 and "left pyinfra" in said[0] and "Fix: pin pyinfra==3.10.0" in said[0]
    monkeypatch.setenv("VOLTAFLEET_PYINFRA_AS_IS", "1")
    assert speed.why_not() is None  # asked for: no warning


def test_the_patches_offered_to_pyinfra_are_the_replacements_in_use():
    """docs/pyinfra-patches.md is each replacement as a whole-function diff against the installed
    pyinfra's source, as speed.patches() writes it now: the doc never drifts from the code."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "pyinfra-patches.md").read_text()
    assert doc == speed.patches()
    assert doc.count("```diff") == 4 and "TCP_NODELAY, 1)" in doc and "+    stack_items = list(reversed(inspect.getouterframes(sys._getframe(1), 0)))" in doc
