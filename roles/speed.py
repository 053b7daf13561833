"""pyinfra's own cost per operation and per fact, cut without changing what it computes
(bench/controller/scale.py: half the controller's CPU per host was here, at 100 hosts).

+ An operation's place in the run (pyinfra.api.util.get_operation_order_from_stack) is the
  line numbers of its call stack. pyinfra reads them with inspect.stack(), which also reads
  the source line of every frame (linecache, and inspect.getmodule scanning sys.modules for
  a deploy file that is no module): ~40 % of a converged run's CPU. Here the same frames give
  the same file names and line numbers, with no source line read (inspect's context=0).
+ The global arguments an operation or a fact takes (pyinfra.api.arguments.all_global_arguments)
  are the type hints of a fixed TypedDict, evaluated again by typing.get_type_hints for every
  operation and every fact: evaluated once here.
+ Each of those 32 arguments has a default in the host's data (pop_global_arguments): each
  lookup (pyinfra.api.host.HostData) evaluated the host's five data layers again, merging
  its groups' data into a new dict, for every argument of every operation and fact. Here the
  layers are evaluated once per call, then looked up in the same order.
+ Latency, not CPU: pyinfra's SSH connection (paramiko) leaves Nagle's algorithm on, so a
  command's small writes wait for the remote's delayed ACK: ~40 ms a remote command, on any
  network (48 ms -> 6 ms for `true` to a lab host). The connection's socket gets TCP_NODELAY,
  as OpenSSH's own client sets for interactive sessions. pyinfra's CLI connects every host
  before it loads deploy.py, so the effect comes from applied() (each host's existing
  connection, as its deploy file runs); the _connect wrapper covers a connection made after
  that (pyinfra's API), and is the shape of the upstream change.

Nothing happens on import: deploy.py calls `applied()` by name, first thing (and the driver,
`python -m rollout`, says on the controller when it would not apply). It applies only to the
pyinfra these replacements were checked against: the source of each replaced function must be
the one whose digest is below (tests/ops/test_speed.py compares the results with pyinfra's
own). Another pyinfra is left as it is, with a warning that says so (the controller is then
about 4x slower at 100 hosts: bench/RESULTS.md). VOLTAFLEET_PYINFRA_AS_IS=1 leaves it as it is
too (to compare), silently. The same changes, as patches to offer pyinfra: docs/pyinfra-patches.md.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import socket
import sys
from copy import copy

import pyinfra

from voltafleet.state.pyinfra_version import CHECKED_VERSION, COST_AND_FIX, installed

_util = importlib.import_module("pyinfra.api.util")
_operation = importlib.import_module("pyinfra.api.operation")
_arguments = importlib.import_module("pyinfra.api.arguments")
_facts = importlib.import_module("pyinfra.api.facts")
_deploy = importlib.import_module("pyinfra.api.deploy")
_host = importlib.import_module("pyinfra.api.host")
_ssh = importlib.import_module("pyinfra.connectors.ssh")

# sha256 of inspect.getsource() of the pyinfra function each replacement stands in for (3.10.0)
CHECKED = {
    "get_operation_order_from_stack": "f4807f61585570e0",
    "all_global_arguments": "f7afbc472d78c5d2",
    "pop_global_arguments": "a12a311539ff5068",
    "HostData.__getattr__": "87152f64f2a65e53",  # what pop_global_arguments' host lookups do
    "extract_callable_datas": "5f05d834948d82be",
    "SSHConnector._connect": "762639d6ffc6c5a9",  # sets self.client, the connected paramiko client
}

ORIGINAL = {"get_operation_order_from_stack": _util.get_operation_order_from_stack,
            "all_global_arguments": _arguments.all_global_arguments,
            "pop_global_arguments": _arguments.pop_global_arguments,
            "HostData.__getattr__": _host.HostData.__getattr__,
            "extract_callable_datas": _host.extract_callable_datas,
            "SSHConnector._connect": _ssh.SSHConnector._connect}
APPLIED: list[str] = []


def get_operation_order_from_stack(state) -> list[int]:
    """pyinfra.api.util.get_operation_order_from_stack, reading no source line: the frames
    from its caller (pyinfra's solve_operation_consistency) outwards, as inspect.stack() in
    the original lists them from its own frame (a pyinfra frame too, skipped either way)."""
    stack_items = list(reversed(inspect.getouterframes(sys._getframe(1), 0)))

    i = 0
    # Find the *first* occurrence of our deploy file in the reversed stack
    if state.current_deploy_filename:
        for i, stack_item in enumerate(stack_items):
            if stack_item.filename == state.current_deploy_filename:
                break

    # Now generate a list of line numbers *following that file*
    line_numbers = []

    if pyinfra.is_cli:
        line_numbers.append(state.current_op_file_number)

    for stack_item in stack_items[i:]:
        if stack_item.filename.startswith(_util.PYINFRA_INSTALL_DIR):
            continue

        line_numbers.append(stack_item.lineno)

    del stack_items

    return line_numbers


_GLOBAL_ARGUMENTS: list[tuple[str, type]] = []


def all_global_arguments() -> list[tuple[str, type]]:
    """pyinfra.api.arguments.all_global_arguments, evaluated once (a new list each call)."""
    if not _GLOBAL_ARGUMENTS:
        _GLOBAL_ARGUMENTS.extend(ORIGINAL["all_global_arguments"]())
    return list(_GLOBAL_ARGUMENTS)


def _host_defaults(host):
    """getattr(host.data, key, default_sentinel) for any key, as pyinfra.api.host.HostData
    answers it (the first data layer that has the key, a shallow copy of its value), with
    the layers (the override, host, groups, inventory and deploy data) evaluated once."""
    data, sentinel = host.data, _arguments.default_sentinel
    datas = data.__dict__.get("datas") if type(data) is _host.HostData else None
    if datas is None:
        return lambda key: getattr(data, key, sentinel)
    layers = list(_host.extract_callable_datas(datas))

    def lookup(key):
        for layer in layers:
            try:
                return copy(layer[key])
            except KeyError:
                pass
        return sentinel
    return lookup


def pop_global_arguments(state, host, kwargs):
    """pyinfra.api.arguments.pop_global_arguments, the host's data layers evaluated once a
    call (_host_defaults) instead of once an argument; the rest is pyinfra's, line for line."""
    config = state.config
    if _arguments.ctx_config.isset():
        config = _arguments.ctx_config.get()
        assert config is not None

    cdkwargs = host.current_deploy_kwargs
    meta_kwargs = cdkwargs or {}

    arguments = {}
    found_keys = []
    host_default_of = _host_defaults(host)

    for key, type_ in _arguments.all_global_arguments():
        argument_meta = _arguments.all_argument_meta[key]
        handler = argument_meta.handler
        default = argument_meta.default(config)

        host_default = host_default_of(key)
        if host_default is not _arguments.default_sentinel:
            default = host_default

        if key in kwargs:
            found_keys.append(key)
            value = kwargs.pop(key)
        else:
            value = meta_kwargs.get(key, default)

        if handler:
            value = handler(config, value)

        if value != default:
            _arguments.raise_if_bad_type(
                value,
                type_,
                _arguments.ArgumentTypeError,
                f"Invalid argument `{key}`:",
            )

        arguments[key] = value
    return arguments, found_keys


def nodelay(client) -> bool:
    """TCP_NODELAY on a paramiko client's TCP socket (not through a jump host's channel, which
    has none); whether it was set."""
    transport = client.get_transport() if hasattr(client, "get_transport") else None
    sock = getattr(transport, "sock", None)
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return True


def _connect(self) -> None:
    """pyinfra.connectors.ssh.SSHConnector._connect, then TCP_NODELAY on the connection (nodelay)."""
    ORIGINAL["SSHConnector._connect"](self)
    nodelay(self.client)


def _nodelay_this_host() -> None:
    """pyinfra's CLI connects before it loads deploy.py (where applied() is called): the host
    whose deploy file runs now gets TCP_NODELAY on the connection it already has."""
    ctx = importlib.import_module("pyinfra.context")
    if ctx.ctx_host.isset():
        nodelay(getattr(getattr(ctx.host, "connector", None), "client", None))  # a test's fake host has none


def _digest(fn) -> str | None:
    try:
        return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()[:16]
    except (OSError, TypeError):
        return None


def apply() -> list[str]:
    """Put the replacements in place where pyinfra's source is the checked one; the names replaced."""
    if APPLIED or os.environ.get("VOLTAFLEET_PYINFRA_AS_IS"):
        return APPLIED
    if _digest(ORIGINAL["get_operation_order_from_stack"]) == CHECKED["get_operation_order_from_stack"] \
            and _operation.get_operation_order_from_stack is ORIGINAL["get_operation_order_from_stack"]:
        _operation.get_operation_order_from_stack = get_operation_order_from_stack  # where it is called
        APPLIED.append("get_operation_order_from_stack")
    if _digest(ORIGINAL["all_global_arguments"]) == CHECKED["all_global_arguments"]:
        _arguments.all_global_arguments = all_global_arguments  # pop_global_arguments calls it by module name
        APPLIED.append("all_global_arguments")
    names = ("pop_global_arguments", "HostData.__getattr__", "extract_callable_datas")
    if all(_digest(ORIGINAL[n]) == CHECKED[n] for n in names) \
            and all(m.pop_global_arguments is ORIGINAL["pop_global_arguments"] for m in (_facts, _operation, _deploy)):
        for module in (_arguments, _facts, _operation, _deploy):  # each calls it by its own name
            module.pop_global_arguments = pop_global_arguments
        APPLIED.append("pop_global_arguments")
    if _digest(ORIGINAL["SSHConnector._connect"]) == CHECKED["SSHConnector._connect"] \
            and _ssh.SSHConnector._connect is ORIGINAL["SSHConnector._connect"]:
        _ssh.SSHConnector._connect = _connect
        APPLIED.append("SSHConnector._connect")
    return APPLIED

DIFFED = ["get_operation_order_from_stack", "all_global_arguments", "pop_global_arguments"]
ALL = [*DIFFED, "SSHConnector._connect"]
_WARNED: list[str] = []


def why_not() -> str | None:
    """Why the replacements are not (all) applied, in one line; None when they are, or when
    VOLTAFLEET_PYINFRA_AS_IS asked for pyinfra as it is."""
    if os.environ.get("VOLTAFLEET_PYINFRA_AS_IS"):
        return None
    missing = [n for n in ALL if n not in apply()]
    if not missing:
        return None
    version = getattr(pyinfra, "__version__", None) or installed()
    return (f"roles/speed.py left pyinfra {version} as it is ({', '.join(missing)}: source differs from the "
            f"checked pyinfra {CHECKED_VERSION}); {COST_AND_FIX}")


def applied(warn=None) -> list[str]:
    """apply(), and once per process a warning through `warn` (pyinfra's logger by default)
    when pyinfra is left as it is. deploy.py's first line."""
    names = apply()
    if "SSHConnector._connect" in names:
        _nodelay_this_host()
    reason = why_not()
    if reason and not _WARNED:
        _WARNED.append(reason)
        if warn is None:
            from pyinfra import logger
            warn = logger.warning
        warn(f"voltafleet: warning: {reason}")
    return names


PATCHES_INTRO = '# pyinfra patches: what roles/speed.py replaces, ready to offer upstream\n\nvoltafleet applies four replacements to pyinfra 3.10.0 at run time (`roles/speed.py`, called by\nname from `deploy.py`; the driver and every run warn when the installed pyinfra is not the checked one,\nand `VOLTAFLEET_PYINFRA_AS_IS=1` turns them off to compare). Each computes what pyinfra computes from\nthe same inputs; `tests/ops/test_speed.py` compares them with pyinfra\'s own on real runs. Below, each as\na unified diff of the function\'s source (pyinfra 3.10.0, as installed by requirements.txt), the\nform an upstream pull request would take (there the new body replaces the old one in place).\n\n## Measured effect (bench/controller/scale.py, bench/RESULTS.md "The controller\'s cost per host, second pass")\n\nA converged fleet, CPU seconds of the pyinfra process, medians of 3 (this change together with\nvoltafleet\'s own operation merges of the same issue):\n\n| hosts | before | after |\n|---|---|---|\n| 10 | 4.1 s | 1.5 s |\n| 100 | 20.1 s | 4.9 s |\n\ncProfile at 100 hosts (profiled seconds): an operation\'s place in the run 31.6 -> 1.0 (patch 1);\nglobal arguments of each operation and fact 26.7 -> 1.4 (patches 2 and 3: get_type_hints of a\nfixed TypedDict 11.4 -> 0.1; the host\'s data layers merged again for each of 32 arguments 11.7 -> 0.5).\nThe marginal controller cost of a host fell from 178 ms to 38 ms.\n\n## 1. `pyinfra.api.util.get_operation_order_from_stack`: no source line read\n\n`inspect.stack()` reads the source line of every frame (linecache, and `inspect.getmodule` scanning\n`sys.modules` for a deploy file that is no module); the order needs only file names and line numbers.\n\n```diff\n{0}```\n\n## 2. `pyinfra.api.arguments.all_global_arguments`: the type hints evaluated once\n\n```diff\n{1}```\n\n## 3. `pyinfra.api.arguments.pop_global_arguments`: a host\'s data layers evaluated once per call\n\nEach of the 32 global arguments\' defaults was looked up through `HostData.__getattr__`, which merges the\nhost\'s five data layers into a new dict every time.\n\n```diff\n{2}```\n\n## 4. `pyinfra.connectors.ssh.SSHConnector._connect`: TCP_NODELAY on the connection\n\nLatency, not CPU. paramiko leaves Nagle\'s algorithm on, so a remote command\'s small writes wait for\nthe remote\'s delayed ACK: about 40 ms a command on any network. Measured to a lab host (loopback,\n20 commands): `true` took 48 ms a command, 5.6 ms with TCP_NODELAY. pyinfra\'s CLI connects every host before\nit loads `deploy.py`, so voltafleet sets it in `applied()`, `deploy.py`\'s first line, on the connection of\nthe host whose deploy file runs; it also wraps the function (`roles.speed._connect`: pyinfra\'s own, then\n`nodelay(self.client)`) for a connection made later. Upstream it is three lines where the client connects\n(and `import socket`):\n\n```diff\n--- a/src/pyinfra/connectors/ssh.py\n+++ b/src/pyinfra/connectors/ssh.py\n@@ def _connect(self) -> None:\n         self.client = SSHClient()\n \n         try:\n             self.client.connect(hostname, **kwargs)\n+            sock = self.client.get_transport().sock\n+            if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):\n+                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n         except AuthenticationException as e:\n```\n'
_PATHS = {"get_operation_order_from_stack": "src/pyinfra/api/util.py",
          "all_global_arguments": "src/pyinfra/api/arguments.py",
          "pop_global_arguments": "src/pyinfra/api/arguments.py"}


def patches() -> str:
    """docs/pyinfra-patches.md: each replacement as a whole-function diff against pyinfra's own
    source (python -c 'from roles import speed; print(speed.patches(), end="")' > docs/pyinfra-patches.md)."""
    import difflib

    def diff(name):
        a = inspect.getsource(ORIGINAL[name]).splitlines(keepends=True)
        b = inspect.getsource(globals()[name]).splitlines(keepends=True)
        return "".join(difflib.unified_diff(a, b, f"a/{_PATHS[name]}", f"b/{_PATHS[name]}", n=len(a) + len(b)))

    return PATCHES_INTRO.format(*(diff(n) for n in DIFFED))
