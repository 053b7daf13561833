"""Helpers shared by the roles: the validated config of the current host."""
from __future__ import annotations

from pyinfra import host

from voltafleet.config import SCHEMA


def config() -> dict:
    """This host's validated variables (the inventory loader checked them)."""
    return {key: host.data.get(key) for key in SCHEMA}
