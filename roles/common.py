"""Helpers shared by the roles: the current host's validated variables, and whether an
earlier operation changes (or changed) the host."""
from __future__ import annotations

from pyinfra import host, inventory
from pyinfra.api import FunctionCommand, OperationError
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.api.exceptions import PyinfraError

from voltafleet.config import SCHEMA, ConfigError, cli_sources, validate_values
from voltafleet.groupvars import SOURCES_KEY


class ConfigRefused(PyinfraError):
    pass


def sources() -> dict:
    """{key: the file (or `pyinfra --data`) that set it} for the current host."""
    return cli_sources(host.data.get(SOURCES_KEY), inventory.get_override_data())


def host_config(h) -> dict:
    """Host h's voltafleet variables as its data holds them (another host: a builder, a server
    the gateway lists); the current host's validated ones are config()'s."""
    return {k: h.data.get(k) for k in SCHEMA}


def config() -> dict:
    """This host's variables, validated whatever their source: group_vars and the
    inventory (checked when it loaded) and pyinfra's own `--data key=value`."""
    try:
        return validate_values(host.name, host_config(host), sources())
    except ConfigError as e:
        raise ConfigRefused(str(e)) from None


def changes(op) -> bool:
    """True when operation `op` changes the host: its result once it ran (execute phase),
    else whether it will (prepare phase). pyinfra's own will_change / did_change."""
    if op is None:
        return False
    return op.did_change() if op.is_complete() else op.will_change


class LiveCommand(FunctionCommand):
    """A shell command whose output is printed as it comes (`.shell` is the command)."""

    def __init__(self, shell: str):
        self.shell = shell
        super().__init__(self._run, (), {})

    def _run(self, state, host):
        ok, out = sh(host, self.shell, print_output=True)
        if not ok:
            raise OperationError("\n".join(out.stderr_lines[-40:]) or f"`{self.shell[:120]}` failed")

    def __repr__(self):
        return f"LiveCommand({self.shell!r})"


def live(command: str) -> LiveCommand:
    """Run a long command (a compile, a 15 GB download) with its progress lines printed as
    they come, not minutes of silence; fail the host with the output's tail if it fails."""
    return LiveCommand(command)


def connector_args(h) -> dict:
    """Host h's own connector arguments (`_sudo`, `_sudo_user`, ...) from its inventory data:
    what a FunctionCommand's shell commands need, as pyinfra's own commands get them."""
    return {k: h.data.get(k) for k in CONNECTOR_ARGUMENT_KEYS if h.data.get(k) is not None}


def sh(h, command: str, **kwargs):
    """Run a shell command on host h (this one or another: a builder, a gateway) with its
    connector arguments, e.g. sudo on a prod host that connects as an ordinary user."""
    return h.run_shell_command(command, **connector_args(h), **kwargs)
