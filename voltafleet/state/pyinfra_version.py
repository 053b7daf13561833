"""The pyinfra version roles/speed.py's replacements were checked against, and the driver's
word on the controller when the installed one differs (the driver imports no role: it reads
the installed version from the package metadata, without importing pyinfra).

    >>> mismatch("3.10.0") is None
    True
"""
from __future__ import annotations

import os

CHECKED_VERSION = "3.10.0"

# what pyinfra left as it is costs, and the fix: the driver's word (mismatch) and every run's (roles/speed.why_not)
COST_AND_FIX = ("runs are correct but the controller spends about 4x the CPU a host (bench/RESULTS.md), or ~40 ms "
                f"more a remote command (no TCP_NODELAY). Fix: pin pyinfra=={CHECKED_VERSION} (requirements.txt), or "
                "check the replacements against this version (tests/ops/test_speed.py) and update roles/speed.py's CHECKED")


def installed() -> str:
    """The installed pyinfra's version, or "?" when there is none."""
    try:
        from importlib.metadata import version
        return version("pyinfra")
    except Exception:  # noqa: BLE001
        return "?"


def mismatch(version: str | None = None) -> str | None:
    """One line when pyinfra is not the checked version (roles/speed.py then leaves it as it is);
    None when it is, or when VOLTAFLEET_PYINFRA_AS_IS asks for pyinfra as it is."""
    if os.environ.get("VOLTAFLEET_PYINFRA_AS_IS"):
        return None
    version = installed() if version is None else version
    if version == CHECKED_VERSION:
        return None
    return f"pyinfra {version} is not the checked {CHECKED_VERSION}: roles/speed.py leaves it as it is; {COST_AND_FIX}"

