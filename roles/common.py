"""Helpers shared by the roles: the current host's validated variables, and whether an
earlier operation changes (or changed) the host."""
from __future__ import annotations

from pyinfra import host

from voltafleet.config import SCHEMA


def config() -> dict:
    """This host's validated variables (the inventory loader checked them)."""
    return {key: host.data.get(key) for key in SCHEMA}


def changes(op) -> bool:
    """True when operation `op` changes the host: its result once it ran (execute phase),
    else whether it will (prepare phase). pyinfra's own will_change / did_change."""
    if op is None:
        return False
    return op.did_change() if op.is_complete() else op.will_change
