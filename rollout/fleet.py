"""The fleet as the driver sees it, and what a run of the driver starts from.

    fleet = Fleet.load("inventory/prod.py")
    fleet.servers, fleet.gateways, fleet.mirrors, fleet.canary("1")
    session = Session.start(fleet, report_dir="reports")   # run id, run directory, fleet plan

The inventory file is read as pyinfra reads it (every public list of hosts is a group; our
loader validates and fills every host's variables). What is resolved once a rollout, before
preflight (each llama.cpp ref's commit, each model's size, the mirrors), is the first fleet
plan; preflight's records then add every server host's instances (voltafleet.state.fleetplan).
"""
from __future__ import annotations

import os
import runpy
from dataclasses import dataclass, replace
from pathlib import Path

from voltafleet.inputs.settings import Settings
from voltafleet.state import fleetplan, refs, runctx
from voltafleet.models import mirror
from voltafleet.front.tiers import GATEWAY_GROUP, runs_llama_server
from voltafleet.models.modelmeta import remote_size

from rollout.runner import REPO

MIRROR_GROUP = mirror.GROUP  # nginx caching the model: like a gateway, not a server host


@dataclass(frozen=True)
class Fleet:
    inventory: str                    # the inventory file, as given
    groups: dict                      # {host: [groups]}, in inventory order
    data: dict                        # {host: its variables}

    @classmethod
    def load(cls, path: str) -> "Fleet":
        cwd = os.getcwd()
        os.chdir(REPO)
        try:
            attrs = runpy.run_path(str(REPO / path) if not os.path.isabs(path) else path)
        finally:
            os.chdir(cwd)
        groups: dict[str, list[str]] = {}
        data: dict[str, dict] = {}
        for group, value in attrs.items():
            if group.startswith("_") or not isinstance(value, (list, tuple)):
                continue
            for entry in value:
                name = entry[0] if isinstance(entry, tuple) else entry
                if isinstance(name, str):
                    groups.setdefault(name, []).append(group)
                    if isinstance(entry, tuple) and len(entry) > 1 and isinstance(entry[1], dict):
                        data.setdefault(name, {}).update(entry[1])
        return cls(path, groups, data)

    def members(self, group: str) -> list[str]:
        return [h for h, groups in self.groups.items() if group in groups]

    @property
    def gateways(self) -> list[str]:
        return self.members(GATEWAY_GROUP)

    @property
    def mirrors(self) -> list[str]:
        return self.members(MIRROR_GROUP)

    @property
    def servers(self) -> list[str]:
        return [h for h, groups in self.groups.items() if runs_llama_server(groups)]

    def canary(self, spec: str) -> list[str]:
        """--canary: a host count from the top, a group (its server hosts), or host names."""
        if spec.isdigit():
            return self.servers[:int(spec)]
        if any(spec in groups for groups in self.groups.values()):
            return [h for h in self.members(spec) if h in self.servers]
        return [c.strip() for c in spec.split(",") if c.strip()]

    def first_plan(self, rollout_id: str) -> fleetplan.FleetPlan:
        """What is resolved once, before preflight: each (repo, ref)'s commit, each model's size,
        the model mirrors (where each server host fetches the model). Raises refs.RefError."""
        commits, sizes = {}, {}
        for h in self.servers:
            cfg = Settings.of(self.data[h])
            repo, ref = cfg.build.repo, cfg.build.ref
            if repo and ref and fleetplan.commit_key(repo, ref) not in commits:
                commits[fleetplan.commit_key(repo, ref)] = refs.resolve(repo, ref)
            url = cfg.model.url
            if url and url not in sizes:
                sizes[url] = remote_size(url)
        return fleetplan.FleetPlan(rollout=rollout_id, commits=commits, model_bytes=sizes,
                                   mirrors=mirror.mirrors_of([(h, Settings.of(self.data[h]), self.data[h].get("ssh_hostname"))
                                                              for h in self.mirrors]))


def run_directory(report_dir: str, run_id: str, what: str = "rollout") -> tuple[Path, Path]:
    """(the report directory, this run's directory in it: <what>-<id>), made."""
    reports = (REPO / report_dir) if not os.path.isabs(report_dir) else Path(report_dir)
    run_dir = reports / f"{what}-{run_id}"
    run_dir.mkdir(parents=True, exist_ok=True)
    return reports, run_dir


@dataclass
class Session:
    """One run of the driver: its id, its directory, its fleet plan and the run context
    every pyinfra run of it starts from."""
    id: str
    report_dir: Path
    run_dir: Path
    plan: fleetplan.FleetPlan
    base: runctx.RunContext

    @property
    def plan_path(self) -> Path:
        return self.run_dir / runctx.RunDir.FLEET_PLAN

    @property
    def records(self) -> runctx.RunDir:
        return runctx.RunDir(self.run_dir)

    def save_plan(self, plan: fleetplan.FleetPlan) -> None:
        self.plan = plan
        self.plan_path.write_text(plan.to_json())

    def ctx(self, phase: str, **kw) -> runctx.RunContext:
        """The context of one pyinfra run of this session: a new run id."""
        return replace(self.base, phase=phase, run=runctx.new_id(), **kw)

    @classmethod
    def start(cls, fleet: Fleet, report_dir: str, no_gateway: bool = False) -> "Session":
        """A rollout's or a plan's start: the fleet plan resolved once and written to the run
        directory. Raises refs.RefError (a ref that does not resolve: nothing touched)."""
        rollout_id = runctx.new_id()
        reports, run_dir = run_directory(report_dir, rollout_id)
        plan = fleet.first_plan(rollout_id)
        own = runctx.RunContext.from_env()  # what the driver was started with (VOLTAFLEET_SMOKE=always, ...)
        base = replace(own, rollout=rollout_id, report_dir=str(run_dir),
                       fleet_plan=str(run_dir / runctx.RunDir.FLEET_PLAN), lock_owner=os.getpid(),
                       no_gateway=no_gateway or own.no_gateway)
        session = cls(rollout_id, reports, run_dir, plan, base)
        session.save_plan(plan)
        return session
