"""HAProxy's runtime API as shell commands: the admin socket and the command that talks to it.
Shared by the gateway's backends (voltafleet/front/gateway.py) and the teams' maps (voltafleet/front/teams.py),
which therefore need not import each other."""
from __future__ import annotations

import re

ADMIN_SOCKET = "/run/haproxy/admin.sock"


def admin(socket: str = ADMIN_SOCKET) -> str:
    """The shell command that talks to HAProxy's admin socket: runtime-API commands on its stdin.
    `-t 30`: after its stdin ends, socat waits for HAProxy to answer and close (default 0.5 s);
    a busy gateway could otherwise see the connection gone before its last command ran."""
    return f"socat -t 30 stdio UNIX-CONNECT:{socket}"


def runtime(command: str, socket: str = ADMIN_SOCKET) -> str:
    """A shell command that sends one runtime-API command to HAProxy's admin socket."""
    if not re.fullmatch(r"[A-Za-z0-9 ._/@:-]+", command):
        raise ValueError(f"unexpected characters in HAProxy runtime command {command!r}")
    return f"echo '{command}' | {admin(socket)}"
