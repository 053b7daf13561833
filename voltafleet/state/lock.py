"""One rollout at a time per fleet: a lock file on the controller, held (flock) for the
whole rollout or plain deploy. A second one refuses at once, naming who holds the lock
since when; a lock whose process is gone (its flock died with it) is taken over with a
warning.

    >>> with FleetLock.for_hosts(["gpu-01", "gpu-02"], "python -m rollout inventory/prod.py"):
    ...     pass
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import time
from pathlib import Path

DIR = Path(__file__).resolve().parents[2] / ".voltafleet" / "locks"


class LockHeld(RuntimeError):
    """Another rollout holds the fleet's lock."""


def fleet_key(hosts: list[str]) -> str:
    """The fleet is its set of hosts, whichever inventory file names them."""
    return hashlib.sha256("\n".join(sorted(set(hosts))).encode()).hexdigest()[:16]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class FleetLock:
    def __init__(self, path: Path, command: str):
        self.path, self.command = Path(path), command
        self.fd: int | None = None
        self.warning: str | None = None   # set when a stale lock was taken over

    @classmethod
    def for_hosts(cls, hosts: list[str], command: str, directory: Path = DIR) -> "FleetLock":
        return cls(Path(directory) / f"fleet-{fleet_key(hosts)}.lock", command)

    def holder(self) -> dict:
        try:
            return json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}

    def acquire(self, allow_pid: int | None = None) -> "FleetLock":
        """Take the lock, or raise LockHeld. `allow_pid`: the driver whose child run this is
        (it holds the lock for the rollout: its batches may run)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            held = self.holder()
            if allow_pid is not None and held.get("pid") == allow_pid:
                return self  # our own driver holds it
            pid = held.get("pid")
            same_host = held.get("host") == socket.gethostname()
            if isinstance(pid, int) and same_host and not pid_alive(pid):
                # the driver's pyinfra runs inherit its lock descriptor: one of them still runs
                raise LockHeld(f"the fleet lock {self.path} is held by a pyinfra run that pid {pid} "
                               f"({held.get('command', '?')}, since {held.get('since', '?')}) started: that "
                               "driver is gone, its run still changes hosts. Fix: wait for it to end (it holds "
                               "the lock until then); nothing was changed by this run") from None
            raise LockHeld(f"another rollout holds the fleet lock {self.path}: pid {held.get('pid', '?')} on "
                           f"{held.get('host', '?')} since {held.get('since', '?')} ({held.get('command', '?')}). "
                           "Fix: wait for it to finish; nothing was changed by this run") from None
        old = self.holder()
        if old.get("pid") and old.get("pid") != os.getpid():
            gone = "" if not pid_alive(old["pid"]) else " (alive but no longer holding it)"
            self.warning = (f"taking over a stale fleet lock: pid {old['pid']} on {old.get('host', '?')} since "
                            f"{old.get('since', '?')} ({old.get('command', '?')}) is gone{gone}")
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
                                 "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
