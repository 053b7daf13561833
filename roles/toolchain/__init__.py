"""Toolchain: what every building host needs (compiler, CMake, git, ccache, python3 for the
smoke client) and, on CUDA hosts, the CUDA 12.x toolkit and the R580 driver."""
from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import apt

BUILD_PACKAGES = ["build-essential", "cmake", "git", "ccache", "python3", "curl", "ca-certificates"]


@deploy("Toolchain")
def toolchain(ctx: dict) -> None:
    """Build dependencies from the distro, then the NVIDIA stack on CUDA hosts.

    .. code:: python

        toolchain(ctx)
    """
    apt.packages(
        name="Install build dependencies",
        packages=BUILD_PACKAGES,
        update=True,
        cache_time=24 * 3600,
        no_recommends=True,
    )
