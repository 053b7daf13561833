"""Toolchain: what every building host needs (compiler, CMake, git, ccache, python3 for the
smoke client) and, on CUDA hosts, NVIDIA's CUDA 12.x toolkit and the R580 driver with
proprietary kernel modules, held at its branch.

The driver steps, in order (docs/UPGRADE.md tells the user's side):
  1. decide from the installed packages (roles/driver_facts.py, voltafleet.gpu.nvidia.driver_plan)
     whether the driver changes: another branch or source to purge, packages missing, a newer
     release ("latest") or another exact release (nvidia_driver_version) to move to;
  2. only then: stop the host's llama-server instances (the rolling driver drains the host in
     HAProxy before), unhold, purge the other branch/source, install the branch lock and the
     driver (and fabric manager on NVSwitch hosts), hold again;
  3. reboot (only when the driver or the nouveau blacklist changed, or an older module is loaded);
  4. nvidia-smi must answer with the branch, the pinned release and every GPU on the PCI bus,
     or the host stops with what to check (DKMS, Secure Boot, nouveau, the missing GPU).
The build fingerprint (nvcc version, not the driver) then decides whether llama.cpp is rebuilt.
"""
from __future__ import annotations

from io import StringIO

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, OperationError, deploy, operation
from pyinfra.operations.util import any_changed
from pyinfra.operations import apt, files, server, systemd

from roles.factcache import host_fact
from roles.filesync import Wanted, synced
from roles.facts import Gpus
from roles.driver_facts import DriverDiagnostics, NvidiaPci, SmiBusIds, driver_plan
from voltafleet.gpu import nvidia
from voltafleet.planning.hostplan import HostPlan

BUILD_PACKAGES = ["build-essential", "cmake", "git", "ccache", "python3", "curl", "ca-certificates"]
NOUVEAU_BLACKLIST = "/etc/modprobe.d/voltafleet-blacklist-nouveau.conf"
APT = 'DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" -o Dpkg::Options::="--force-confold"'

@operation()
def driver_converged(os_id: str, source: str, branch: int, flavour: str, target: str | None,
                     nvswitch: bool = False, before_stop=None):
    """Bring the driver packages to the branch, source and release asked for, and nothing else.

    Yields nothing on a converged host (a missing hold alone is `driver_held`'s). Otherwise:
    stop the servers, unhold, purge the packages of another branch or source, install the
    branch lock, install (or upgrade, or move back to the pinned release) the driver set,
    hold it again. A change of this operation means a reboot (`server.reboot`'s _if).

    + before_stop: called as before_stop(state, host) right before the servers stop, only when
      the driver changes: the rolling rollout's hook to drain the host's instances in HAProxy

    .. code:: python

        driver_converged(os_id="ubuntu-24.04", source="nvidia_repo", branch=580,
                         flavour="proprietary", target="latest", nvswitch=False)
    """
    plan = driver_plan(host, os_id, source, branch, flavour, target, nvswitch)
    if not plan["reboot"]:
        return
    if host.state.is_executing:
        logger.info(f"{host.name}: NVIDIA driver: {plan['why']}")
    # The hook point of the rollout: drain, then the host's servers stop before the driver
    # changes under them (the reboot would kill them anyway; this stops them cleanly first).
    if before_stop is not None:
        yield FunctionCommand(before_stop, (), {})
    yield nvidia.STOP_SERVERS
    if plan["unhold"]:
        yield "apt-mark unhold " + " ".join(plan["unhold"])
    if plan["purge"]:
        yield f"{APT} purge " + " ".join(plan["purge"])
    if plan["pin"]:
        yield f"{APT} install {plan['pin']}"
    if plan["install"]:
        yield f"{APT} install {'--allow-downgrades ' if plan['downgrade'] else ''}" + " ".join(plan["install"])
    if plan["hold"]:
        yield "apt-mark hold " + " ".join(plan["hold"])


@operation()
def driver_held(os_id: str, source: str, branch: int, flavour: str, target: str | None, nvswitch: bool = False):
    """`apt-mark hold` the driver set where a hold is missing (no reboot for that alone).

    .. code:: python

        driver_held(os_id="ubuntu-24.04", source="nvidia_repo", branch=580, flavour="proprietary", target=None)
    """
    plan = driver_plan(host, os_id, source, branch, flavour, target, nvswitch)
    if not plan["reboot"] and plan["hold"]:
        yield "apt-mark hold " + " ".join(plan["hold"])


@operation()
def driver_verified(branch: int, gpu_count: int, version: str | None = None, allow_degraded: bool = False):
    """Fail the host unless nvidia-smi answers with the expected branch (and release, when one
    is pinned) and every GPU the PCI bus has; on failure, say what to check.

    .. code:: python

        driver_verified(branch=580, gpu_count=8, version="580.95.05", allow_degraded=False)
    """
    if not host.state.is_executing:  # prepare phase: the driver may be installed by an earlier op
        return
    gpus = [g for g in host_fact(host, Gpus) if not g.get("pci_only")]
    if not gpus:
        raise OperationError(nvidia.no_gpu_error(host.name, host.get_fact(DriverDiagnostics)))
    versions = {g["driver_version"] for g in gpus}
    if {nvidia.major(v) for v in versions} != {branch}:
        raise OperationError(f"{host.name}: nvidia-smi reports driver {', '.join(sorted(versions))}, "
                             f"not branch R{branch}. Fix: check `apt-mark showhold` and "
                             "`dpkg -l | grep nvidia` for packages of another branch, then rerun")
    if version not in (None, "latest") and versions != {version}:
        raise OperationError(f"{host.name}: nvidia-smi reports driver {', '.join(sorted(versions))}, "
                             f"nvidia_driver_version pins {version}. Fix: check `apt-cache policy cuda-drivers` "
                             f"for {version} and `cat {nvidia.DRIVER_PREFERENCES}`, then rerun")
    pci = host_fact(host, NvidiaPci)
    if nvidia.gpu_addresses(pci):
        health = nvidia.gpu_health(host.name, pci, host_fact(host, SmiBusIds), allow_degraded)
        if health["error"]:
            raise OperationError(health["error"])
        if health["warning"]:
            logger.warning(health["warning"])
    elif len(gpus) < gpu_count:
        raise OperationError(f"{host.name}: nvidia-smi lists {len(gpus)} GPU(s), the host had {gpu_count} "
                             "before this run. Fix: check `nvidia-smi -q` and `dmesg | grep -i xid`")
    return
    yield  # an operation is a generator; this one only checks


def gpu_health(plan: HostPlan) -> dict:
    """GPUs on the PCI bus missing from nvidia-smi, read before the rollout (for the report)."""
    health = nvidia.gpu_health(host.name, host_fact(host, NvidiaPci), host_fact(host, SmiBusIds),
                               plan.settings.toolchain.allow_degraded_gpus)
    if health["warning"]:
        logger.warning(health["warning"])
    return health


def cuda_stack(plan: HostPlan, before_driver_change=None):
    cfg, os_id = plan.settings, plan.facts.os
    branch, target = cfg.toolchain.nvidia_driver_branch, cfg.toolchain.nvidia_driver_version
    keyring = apt.deb(name="NVIDIA CUDA repository keyring", src=nvidia.keyring_url(os_id))
    apt.update(name="Refresh apt after adding NVIDIA's repository", _if=keyring.did_change)
    apt.packages(name=f"CUDA toolkit {cfg.toolchain.cuda_toolkit_version} (pinned series)",
                 packages=[nvidia.toolkit_package(cfg.toolchain.cuda_toolkit_version)], no_recommends=True)
    gpu_health(plan)
    if not cfg.toolchain.manage_driver:
        # the release of a driver managed elsewhere is not ours to pin: branch and GPUs only
        driver_verified(name="Check the driver managed elsewhere", branch=branch, gpu_count=len(plan.facts.gpus),
                        allow_degraded=cfg.toolchain.allow_degraded_gpus)
        return None
    source, flavour = cfg.toolchain.nvidia_driver_source, cfg.toolchain.nvidia_driver_flavour
    nvswitch = bool(nvidia.nvswitches(host_fact(host, NvidiaPci)))
    if target == "latest":
        apt.update(name="Refresh apt to find the newest release of the branch", cache_time=3600)
    preferences = nvidia.driver_preferences(branch, target)
    if preferences:
        files.put(name=f"Pin apt to driver release {target}", src=StringIO(preferences),
                  dest=nvidia.DRIVER_PREFERENCES, mode="644")
    else:
        files.file(name="No pinned driver release", path=nvidia.DRIVER_PREFERENCES, present=False)
    blacklist = synced(name="Blacklist nouveau (the initramfs rebuilt when it changed)",
                       files=[Wanted(NOUVEAU_BLACKLIST, "644", text="blacklist nouveau\noptions nouveau modeset=0\n")],
                       then=["update-initramfs -u"])
    driver = driver_converged(
        name=f"NVIDIA driver R{branch} {target or 'as installed'} ({flavour} kernel modules"
             f"{', fabric manager' if nvswitch else ''})",
        os_id=os_id, source=source, branch=branch, flavour=flavour, target=target, nvswitch=nvswitch,
        before_stop=before_driver_change)
    driver_held(name="Hold the driver set", os_id=os_id, source=source, branch=branch, flavour=flavour,
                target=target, nvswitch=nvswitch)
    server.reboot(name="Reboot into the new driver (only when it changed)", reboot_timeout=900,
                  _if=any_changed(driver, blacklist))
    systemd.service(name="NVIDIA persistence daemon", service="nvidia-persistenced", running=True,
                    enabled=True)
    if nvswitch:
        systemd.service(name="NVIDIA fabric manager (NVSwitch host)", service="nvidia-fabricmanager",
                        running=True, enabled=True)
    driver_verified(name="nvidia-smi answers with the driver branch and every GPU", branch=branch,
                    gpu_count=len(plan.facts.gpus), version=target, allow_degraded=cfg.toolchain.allow_degraded_gpus)
    return driver


@deploy("Toolchain")
def toolchain(plan: HostPlan, before_driver_change=None):
    """Build dependencies from the distro, then the NVIDIA stack on CUDA hosts.

    + before_driver_change: a callable (state, host) run just before the host's servers stop
      for a driver change (never on a converged host): where the rolling rollout drains them

    Returns the driver operation (None without one): when it changed the host, every
    server restarts and is smoke-tested.

    .. code:: python

        driver_op = toolchain(plan, before_driver_change=lambda state, host: drain_all(state, host))
    """
    apt.packages(name="Install build dependencies", packages=BUILD_PACKAGES, update=True,
                 cache_time=24 * 3600, no_recommends=True)
    if plan.cuda:
        return cuda_stack(plan, before_driver_change)
    return None
