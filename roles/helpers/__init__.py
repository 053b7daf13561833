"""Helper scripts: the shell that the roles run on a host lives in files (each role's
files/ folder, shellchecked in CI) installed into <voltafleet_root>/bin, and is called
with quoted arguments. pyinfra's files.put tracks whether each one changed."""
from __future__ import annotations

from pathlib import Path

from pyinfra.api import deploy
from pyinfra.operations import files

from roles.common import SMOKE_CLIENT, bin_path
from voltafleet.hostplan import HostPlan

ROLES = Path(__file__).resolve().parents[1]
REPO = ROLES.parent


def scripts() -> dict[str, Path]:
    """{installed name: source}: every roles/*/files/NAME.sh as NAME, plus the smoke client."""
    found = {p.stem: p for p in sorted(ROLES.glob("*/files/*.sh"))}
    found[SMOKE_CLIENT] = REPO / "voltafleet" / "smoke.py"
    return found


@deploy("Helper scripts")
def helpers(plan: HostPlan) -> None:
    """Install voltafleet's helper scripts on the host.

    .. code:: python

        helpers(plan)
    """
    files.directory(name="voltafleet bin directory", path=f"{plan.root}/bin", mode="755")
    for name, src in scripts().items():
        files.put(name=f"Helper {name}", src=str(src), dest=bin_path(plan, name), mode="755")
