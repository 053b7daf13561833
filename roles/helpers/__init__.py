"""Helper scripts: the shell that the roles run on a host lives in files (each role's
files/ folder, shellchecked in CI) installed into <voltafleet_root>/bin, and is called
with quoted arguments. One operation puts them all in place (roles/filesync: as a
files.directory and one files.put each would, reading one fact for all of them)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pyinfra.api import deploy

from roles.shell import bin_path, SMOKE_CLIENT, WORKLOAD_CLIENT
from roles.filesync import Wanted, synced
from voltafleet.planning.hostplan import HostPlan

ROLES = Path(__file__).resolve().parents[1]
REPO = ROLES.parent


def scripts() -> dict[str, Path]:
    """{installed name: source}: every roles/*/files/NAME.sh as NAME, plus the smoke and workload clients."""
    return dict(_scripts())


@lru_cache(maxsize=1)
def _scripts() -> tuple[tuple[str, Path], ...]:  # looked up once per run, not once per host
    found = {p.stem: p for p in sorted(ROLES.glob("*/files/*.sh"))}
    found[SMOKE_CLIENT] = REPO / "voltafleet" / "hostside" / "smoke_client.py"
    found[WORKLOAD_CLIENT] = REPO / "voltafleet" / "hostside" / "workload.py"  # the tune's workload (python -m rollout --tune)
    return tuple(found.items())


def wanted(plan: HostPlan) -> tuple[list[Wanted], list[tuple[str, str]]]:
    """(the scripts as installed, the bin directory): what the operation puts in place."""
    return ([Wanted(bin_path(plan, name), "755", path=str(src)) for name, src in scripts().items()],
            [(f"{plan.root}/bin", "755")])


@deploy("Helper scripts")
def helpers(plan: HostPlan) -> None:
    """Install voltafleet's helper scripts on the host.

    .. code:: python

        helpers(plan)
    """
    files, directories = wanted(plan)
    synced(name=f"{len(files)} helper scripts in {plan.root}/bin", files=files, directories=directories)
