"""Shell helpers of the roles: commands on a host with its connector arguments, quoting, live
output for long commands, the helper scripts' paths and the restart command."""

from __future__ import annotations

import shlex

from pyinfra import logger
from pyinfra.api import FunctionCommand
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS


SMOKE_CLIENT = "voltafleet-smoke"
WORKLOAD_CLIENT = "voltafleet-workload"




class LiveCommand(FunctionCommand):
    """A shell command whose output is printed as it comes (`.shell` is the command)."""

    def __init__(self, shell: str):
        self.shell = shell
        super().__init__(self._run, (), {})

    def _run(self, state, host) -> bool:
        ok, out = sh(host, self.shell, print_output=True)
        if not ok:  # the output's tail as the error, not a Python traceback
            host.log_styled("\n".join(out.stderr_lines[-40:]) or f"`{self.shell[:120]}` failed", fg="red",
                            log_func=logger.error)
        return ok

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


def q(*args: str) -> str:
    return " ".join(shlex.quote(str(a)) for a in args)


def bin_path(plan, name: str) -> str:
    """Where a helper script is installed on the host."""
    return f"{plan.root}/bin/{name}"




def restart_command(index: int) -> str:
    """Enable and restart one instance; `active` only once /health answers (ExecStartPost)."""
    unit = f"llama-server@{index}.service"
    # reset-failed: a unit that crash-looped into its start limit would refuse the restart
    return f"systemctl reset-failed {unit} 2>/dev/null; systemctl enable {unit} && systemctl restart {unit}"
