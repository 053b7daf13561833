"""Load group_vars/*.yml for the inventories (pyinfra reads no YAML group data itself),
merge them per host and validate the result before pyinfra connects anywhere.

    from voltafleet.inputs.groupvars import build_inventory
    groups = build_inventory({"v100_16gb": ["gpu-01", "gpu-02"]}, origin="inventory/prod.py")
"""
from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml

from voltafleet.front import teams, tiers
from voltafleet.ground.errors import Problem
from voltafleet.inputs import pairvars
from voltafleet.inputs.config import ConfigError, Sourced, validate
from voltafleet.state.runctx import ENV

# Host data keys voltafleet adds beside the variables: the groups of the host, and
# {variable: the file that set it} so refusals in the roles can name the file.
GROUPS_KEY = "voltafleet_groups"
SOURCES_KEY = "voltafleet_sources"

REPO = Path(__file__).resolve().parents[2]
GROUP_VARS = REPO / "group_vars"
# Host data keys that belong to pyinfra (connection), not to voltafleet.
CONNECTOR_PREFIXES = ("ssh_", "_", "fake_")
# A YAML file of variables applied last, to every host of the run.
EXTRA_VARS_ENV = ENV["vars_file"]  # VOLTAFLEET_VARS (voltafleet/state/runctx.py: the run contract)
TUNED_SUFFIX = ".tuned.yml"  # group_vars/<group>.tuned.yml (voltafleet/measure/tune.py)


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key, first: int, again: int):
        super().__init__(f"{key!r} on line {first} and again on line {again}")
        self.key, self.first, self.again = key, first, again


class StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (YAML's last-wins
    would silently drop the first value)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                line = seen.get(key)
            except TypeError:  # an unhashable key: the base class reports it
                break
            if line is not None:
                raise DuplicateKey(key, line, key_node.start_mark.line + 1)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


# (path, mtime_ns, size) -> the parsed file: each group_vars file is parsed once per process,
# not once per host of the inventory (callers get their own copy).
_PARSED: dict[tuple, dict] = {}


def read_yaml(path: Path) -> dict:
    try:
        st = path.stat()
    except OSError:
        st = None
    key = (str(path), st.st_mtime_ns, st.st_size) if st else None
    if key not in _PARSED:
        data = _parse_yaml(path)
        if key is None:
            return data
        _PARSED[key] = data
    return copy.deepcopy(_PARSED[key])


def _parse_yaml(path: Path) -> dict:
    rel = str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)
    if not path.exists():
        raise ConfigError("no such file", "create it or correct the path", rel)
    try:
        data = yaml.load(path.read_text(), Loader=StrictLoader) or {}
    except DuplicateKey as e:
        raise ConfigError(f"set twice, on line {e.first} and on line {e.again} (YAML would keep only the last)",
                          f"keep one {e.key}: line", rel, str(e.key))
    except yaml.YAMLError as e:
        raise ConfigError(f"not valid YAML: {e}", "correct the syntax at the line shown", rel)
    if not isinstance(data, dict):
        raise ConfigError("must be a mapping of key: value", "write one `key: value` a line", rel)
    return data


def host_vars(groups: list[str], host_data: dict, origin: str, group_vars: Path = GROUP_VARS) -> Sourced:
    merged = Sourced()
    merged.update(read_yaml(group_vars / "all.yml"), "group_vars/all.yml")
    for g in groups:
        path = group_vars / f"{g}.yml"
        if path.exists():
            merged.update(read_yaml(path), f"group_vars/{g}.yml")
        tuned = group_vars / f"{g}{TUNED_SUFFIX}"  # python -m rollout --tune's winner, reviewed and committed
        if tuned.exists():
            rel = f"group_vars/{g}{TUNED_SUFFIX}"
            doc = read_yaml(tuned)
            if not isinstance(doc.get("values", {}), dict):
                raise ConfigError("`values` is not a mapping", "write the tune's values as `key: value` lines under "
                                  "`values:`, or delete the file to return to the shipped values", rel, "values")
            merged.update(doc.get("values") or {}, rel)
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
    loaded, ssh_hostnames = [], {}
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
        values[GROUPS_KEY] = member_of
        values[SOURCES_KEY] = {k: merged.source[k] for k in values if k in merged.source}
        for g in member_of:
            out[g].append((name, {**connect, **values}))
        loaded.append((name, values, member_of))
        ssh_hostnames[name] = connect.get("ssh_hostname")
    tier_refusal(loaded)
    pair_refusal(loaded, ssh_hostnames)
    return out


def tier_refusal(hosts: list[tuple[str, dict, list[str]]]) -> None:
    """Each gateway's teams against the tiers the inventory's server hosts serve (issue 41): a
    team sent to (or allowed) a tier no server host serves refuses the inventory, naming the
    gateway, the file and the key. An inventory without server hosts has nothing to check."""
    served = tiers.served_tiers(hosts)
    for name, values, groups in hosts:
        if tiers.GATEWAY_GROUP not in groups:
            continue
        problems = tiers.fleet_problems(teams.parse(values["gateway_teams"]), served,
                                        values[SOURCES_KEY].get("gateway_teams"))
        if problems:
            raise ConfigError(problems, host=name)


def pair_refusal(hosts: list[tuple[str, dict, list[str]]], ssh_hostnames: dict) -> None:
    """Two gateways or more must work as one address (voltafleet/inputs/pairvars.py): else the inventory
    is refused, naming each gateway, the file and the key."""
    gateways = [(name, values, ssh_hostnames.get(name)) for name, values, groups in hosts
                if tiers.GATEWAY_GROUP in groups]
    found = pairvars.problems(gateways)
    if found:
        sources = {name: values[SOURCES_KEY] for name, values, _ in gateways}
        host = found[0][0]
        raise ConfigError([Problem(what, fix, sources[name].get(key), key) for name, key, what, fix in found
                           if name == host], host=host)


def load_or_exit(*args: Any, **kw: Any) -> dict[str, list[tuple[str, dict]]]:
    """build_inventory for inventory files: a bad value stops pyinfra with one clear line."""
    import sys

    try:
        return build_inventory(*args, **kw)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        raise SystemExit(2)
