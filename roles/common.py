"""Helpers shared by the roles: the current host's validated variables, and whether an
earlier operation changes (or changed) the host."""
from __future__ import annotations

from pyinfra import host, inventory
from pyinfra.api.exceptions import PyinfraError

from voltafleet.config import SCHEMA, ConfigError, cli_sources, validate_values
from voltafleet.groupvars import SOURCES_KEY


class ConfigRefused(PyinfraError):
    pass


def sources() -> dict:
    """{key: the file (or `pyinfra --data`) that set it} for the current host."""
    return cli_sources(host.data.get(SOURCES_KEY), inventory.get_override_data())


def config() -> dict:
    """This host's variables, validated whatever their source: group_vars and the
    inventory (checked when it loaded) and pyinfra's own `--data key=value`."""
    try:
        return validate_values(host.name, {k: host.data.get(k) for k in SCHEMA}, sources())
    except ConfigError as e:
        raise ConfigRefused(str(e)) from None


def changes(op) -> bool:
    """True when operation `op` changes the host: its result once it ran (execute phase),
    else whether it will (prepare phase). pyinfra's own will_change / did_change."""
    if op is None:
        return False
    return op.did_change() if op.is_complete() else op.will_change
