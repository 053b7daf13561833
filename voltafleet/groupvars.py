"""Load group_vars/*.yml for the inventories (pyinfra reads no YAML group data itself),
merge them per host and validate the result before pyinfra connects anywhere.

    from voltafleet.groupvars import build_inventory
    groups = build_inventory({"v100_16gb": ["gpu-01", "gpu-02"]}, origin="inventory/prod.py")
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from voltafleet.config import ConfigError, Sourced, validate

REPO = Path(__file__).resolve().parent.parent
GROUP_VARS = REPO / "group_vars"
# Host data keys that belong to pyinfra (connection), not to voltafleet.
CONNECTOR_PREFIXES = ("ssh_", "_", "fake_")
# A YAML file of variables applied last, to every host of the run.
EXTRA_VARS_ENV = "VOLTAFLEET_VARS"


def read_yaml(path: Path) -> dict:
    rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    if not path.exists():
        raise ConfigError(f"{rel}: no such file. Fix: create it or correct the path.")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{rel}: not valid YAML: {e}. Fix: correct the syntax at the line shown.")
    if not isinstance(data, dict):
        raise ConfigError(f"{rel}: must be a mapping of key: value. Fix: write one `key: value` a line.")
    return data


def host_vars(groups: list[str], host_data: dict, origin: str, group_vars: Path = GROUP_VARS) -> Sourced:
    merged = Sourced()
    merged.update(read_yaml(group_vars / "all.yml"), "group_vars/all.yml")
    for g in groups:
        path = group_vars / f"{g}.yml"
        if path.exists():
            merged.update(read_yaml(path), f"group_vars/{g}.yml")
    merged.update(host_data, origin)
    return merged


def build_inventory(groups: dict[str, list], origin: str, overrides: dict | None = None,
                    group_vars: Path = GROUP_VARS) -> dict[str, list[tuple[str, dict]]]:
    """Return pyinfra inventory groups: {group: [(host, data), ...]}.

    Each host entry is a name or (name, data); data may hold voltafleet variables and
    pyinfra's ssh_* connection keys. `overrides` apply to every host (after groups).
    """
    memberships: dict[str, list[str]] = {}
    own: dict[str, dict] = {}
    for group, hosts in groups.items():
        for entry in hosts:
            name, data = (entry, {}) if isinstance(entry, str) else entry
            memberships.setdefault(name, []).append(group)
            own.setdefault(name, {}).update(data)
    out: dict[str, list[tuple[str, dict]]] = {g: [] for g in groups}
    for name, member_of in memberships.items():
        data = own[name]
        connect = {k: v for k, v in data.items() if k.startswith(CONNECTOR_PREFIXES)}
        ours = {k: v for k, v in data.items() if not k.startswith(CONNECTOR_PREFIXES)}
        merged = host_vars(member_of, {}, origin, group_vars)
        merged.update(overrides or {}, origin)
        merged.update(ours, f"{origin} (host {name})")
        if os.environ.get(EXTRA_VARS_ENV):  # one-off overrides for a run, e.g. a canary ref
            extra = Path(os.environ[EXTRA_VARS_ENV])
            merged.update(read_yaml(extra), f"{extra} ({EXTRA_VARS_ENV})")
        values = validate(name, merged)
        values["voltafleet_groups"] = member_of
        for g in member_of:
            out[g].append((name, {**connect, **values}))
    return out


def load_or_exit(*args: Any, **kw: Any) -> dict[str, list[tuple[str, dict]]]:
    """build_inventory for inventory files: a bad value stops pyinfra with one clear line."""
    import sys

    try:
        return build_inventory(*args, **kw)
    except ConfigError as e:
        print(f"voltafleet: configuration error: {e}", file=sys.stderr)
        raise SystemExit(2)
