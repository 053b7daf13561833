"""Toolchain: what every building host needs (compiler, CMake, git, ccache, python3 for the
smoke client) and, on CUDA hosts, NVIDIA's CUDA 12.x toolkit and the R580 driver with
proprietary kernel modules, held at its branch."""
from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api import OperationError, deploy, operation
from pyinfra.operations import apt, files, server, systemd
from pyinfra.operations.util import any_changed

from roles.facts import AptHolds, Gpus
from voltafleet import nvidia
from voltafleet.hostplan import HostPlan

BUILD_PACKAGES = ["build-essential", "cmake", "git", "ccache", "python3", "curl", "ca-certificates"]
NOUVEAU_BLACKLIST = "/etc/modprobe.d/voltafleet-blacklist-nouveau.conf"


@operation()
def held(packages: list[str]):
    """Keep packages at their version: `apt-mark hold` those not held yet.

    .. code:: python

        held(packages=["cuda-drivers-580", "nvidia-dkms-580"])
    """
    missing = [p for p in packages if p not in host.get_fact(AptHolds)]
    if missing:
        yield "apt-mark hold " + " ".join(missing)


@operation()
def driver_verified(branch: int, gpu_count: int):
    """Fail the host unless nvidia-smi answers with the expected branch and every GPU.

    .. code:: python

        driver_verified(branch=580, gpu_count=8)
    """
    if not host.state.is_executing:  # prepare phase: the driver may be installed by an earlier op
        return
    gpus = [g for g in host.get_fact(Gpus) if not g.get("pci_only")]
    if not gpus:
        raise OperationError(f"{host.name}: nvidia-smi lists no GPU after the driver install; "
                             "check `dmesg | grep -i nvidia` (nouveau still loaded? Secure Boot?)")
    versions = {g["driver_version"] for g in gpus}
    if {nvidia.major(v) for v in versions} != {branch}:
        raise OperationError(f"{host.name}: nvidia-smi reports driver {', '.join(sorted(versions))}, "
                             f"not branch R{branch}")
    if len(gpus) < gpu_count:
        raise OperationError(f"{host.name}: nvidia-smi lists {len(gpus)} GPU(s), the host has {gpu_count}")
    return
    yield  # an operation is a generator; this one only checks


def cuda_stack(plan: HostPlan) -> None:
    cfg, os_id = plan.cfg, plan.facts.os
    keyring = apt.deb(name="NVIDIA CUDA repository keyring", src=nvidia.keyring_url(os_id))
    apt.update(name="Refresh apt after adding NVIDIA's repository", _if=keyring.did_change)
    apt.packages(name=f"CUDA toolkit {cfg['cuda_toolkit_version']} (pinned series)",
                 packages=[nvidia.toolkit_package(cfg["cuda_toolkit_version"])], no_recommends=True)
    if not cfg["manage_driver"]:
        driver_verified(name="Check the driver managed elsewhere", branch=cfg["nvidia_driver_branch"],
                        gpu_count=len(plan.facts.gpus))
        return
    pkgs = nvidia.driver_packages(os_id, cfg["nvidia_driver_source"], cfg["nvidia_driver_branch"],
                                  cfg["nvidia_driver_flavour"])
    if pkgs["pin"]:
        apt.packages(name=f"Lock apt to driver branch R{cfg['nvidia_driver_branch']}", packages=[pkgs["pin"]])
    blacklist = files.put(name="Blacklist nouveau", dest=NOUVEAU_BLACKLIST, mode="644",
                          src=StringIO("blacklist nouveau\noptions nouveau modeset=0\n"))
    server.shell(name="Rebuild the initramfs without nouveau", commands=["update-initramfs -u"],
                 _if=blacklist.did_change)
    driver = apt.packages(name=f"NVIDIA driver R{cfg['nvidia_driver_branch']} ({cfg['nvidia_driver_flavour']} "
                          "kernel modules)", packages=pkgs["install"])
    held(name="Hold the driver branch", packages=pkgs["hold"])
    server.reboot(name="Reboot into the new driver (only when it changed)", reboot_timeout=900,
                  _if=any_changed(driver, blacklist))
    systemd.service(name="NVIDIA persistence daemon", service="nvidia-persistenced", running=True,
                    enabled=True)
    driver_verified(name="nvidia-smi answers with the driver branch", branch=cfg["nvidia_driver_branch"],
                    gpu_count=len(plan.facts.gpus))


@deploy("Toolchain")
def toolchain(plan: HostPlan) -> None:
    """Build dependencies from the distro, then the NVIDIA stack on CUDA hosts.

    .. code:: python

        toolchain(plan)
    """
    apt.packages(name="Install build dependencies", packages=BUILD_PACKAGES, update=True,
                 cache_time=24 * 3600, no_recommends=True)
    if plan.cuda:
        cuda_stack(plan)
