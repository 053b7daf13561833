"""NVIDIA stack decisions for Volta fleets: repository, package names, and refusals.

Facts this rests on (see ../shared/DOMAIN.md):
- CUDA 13 dropped Maxwell, Pascal and Volta: sm_70 needs CUDA 12.x (12.9 is the last).
- R580 is the last driver branch that supports Volta (LTS, EOL June 2028).
- NVIDIA's open kernel modules are Turing+ only; Blackwell needs them.

    >>> driver_packages("ubuntu-24.04", "nvidia_repo", 580, "proprietary")
    {'pin': 'nvidia-driver-pinning-580', 'install': ['cuda-drivers-580', 'nvidia-dkms-580'], ...}
"""
from __future__ import annotations

NVIDIA_REPO = "https://developer.download.nvidia.com/compute/cuda/repos"
KEYRING_DEB = "cuda-keyring_1.1-1_all.deb"
REPO_DISTRO = {"debian-12": "debian12", "ubuntu-22.04": "ubuntu2204", "ubuntu-24.04": "ubuntu2404"}
LAST_VOLTA_BRANCH = 580
TURING = 7.5
BLACKWELL = 10.0
# PCI device ids of Volta boards, for hosts with no driver yet (lspci instead of nvidia-smi).
VOLTA_PCI_IDS = {"1db1": "Tesla V100-SXM2-16GB", "1db4": "Tesla V100-PCIE-16GB",
                 "1db5": "Tesla V100-SXM2-32GB", "1db6": "Tesla V100-PCIE-32GB",
                 "1db7": "Tesla V100 DGXS 32GB", "1db8": "Tesla V100-SXM3-32GB",
                 "1df5": "Tesla V100-SXM2-16GB", "1df6": "Tesla V100S-PCIE-32GB", "1db0": "Quadro GV100 32GB"}


def keyring_url(os_id: str) -> str:
    return f"{NVIDIA_REPO}/{REPO_DISTRO[os_id]}/x86_64/{KEYRING_DEB}"


def toolkit_package(version: str) -> str:
    """cuda-toolkit-12-9 for "12.9": a pinned series, never the bare `cuda`/`cuda-toolkit`
    metapackages, which move to 13."""
    return "cuda-toolkit-" + version.replace(".", "-")


def toolkit_nvcc(version: str) -> str:
    return f"/usr/local/cuda-{version}/bin/nvcc"


def driver_packages(os_id: str, source: str, branch: int, flavour: str) -> dict:
    """Package names of the driver branch, by repository: NVIDIA's and Ubuntu's differ.

    pin: a package that locks apt to the branch (None where the name carries the branch);
    install: what to install; hold: what `apt-mark hold` keeps from moving.
    """
    open_ = flavour == "open"
    if source == "nvidia_repo":
        if os_id.startswith("ubuntu"):
            install = [f"cuda-drivers-{branch}", f"nvidia-dkms-{branch}{'-open' if open_ else ''}"]
        else:  # Debian: NVIDIA's packages carry no branch in the name; the pinning package locks it
            install = ["cuda-drivers", "nvidia-open-kernel-dkms" if open_ else "nvidia-kernel-dkms"]
        return {"pin": f"nvidia-driver-pinning-{branch}", "install": install,
                "hold": install + [f"nvidia-driver-pinning-{branch}"]}
    if source == "distro":
        if not os_id.startswith("ubuntu"):
            raise ValueError(f"{os_id} ships no R{branch} driver in its own archive: "
                             "use nvidia_driver_source: nvidia_repo")
        suffix = "-open" if open_ else ""
        install = [f"nvidia-headless-{branch}-server{suffix}", f"nvidia-utils-{branch}-server"]
        return {"pin": None, "install": install, "hold": install}
    raise ValueError(f"unknown driver source {source!r}")


def compute_caps(gpus: list[dict]) -> list[float]:
    """The known compute capabilities (a GPU seen only on the PCI bus may have none)."""
    return [float(g["compute_cap"]) for g in gpus if g.get("compute_cap") not in (None, "", "unknown")]


def major(version: str | None) -> int | None:
    return int(version.split(".")[0]) if version else None


def refusals(host: str, cfg: dict, gpus: list[dict], installed_nvcc: str | None,
             installed_driver: str | None) -> list[str]:
    """Why the NVIDIA stack this config asks for cannot serve these GPUs, each with its fix."""
    out = []
    caps = compute_caps(gpus)
    low, high = (min(caps), max(caps)) if caps else (None, None)
    names = ", ".join(sorted({g["name"] for g in gpus})) or "no GPU"
    pre_turing = low is not None and low < TURING
    if pre_turing and major(cfg["cuda_toolkit_version"]) >= 13:
        out.append(f"{host}: cuda_toolkit_version is {cfg['cuda_toolkit_version']}, but the host has "
                   f"{names} (compute capability {low}): CUDA 13 removed Volta support and nvcc 13 cannot "
                   'build sm_70. Fix: set cuda_toolkit_version: "12.9"')
    if pre_turing and installed_nvcc and major(installed_nvcc) >= 13:
        out.append(f"{host}: the installed CUDA toolkit is {installed_nvcc} (nvcc on PATH or /usr/local/cuda), "
                   f"but the host has {names} (compute capability {low}): CUDA 13 cannot build sm_70. "
                   "Fix: remove CUDA 13 or point /usr/local/cuda at 12.x; voltafleet installs "
                   f"{toolkit_package(cfg['cuda_toolkit_version'])}")
    if pre_turing and cfg["nvidia_driver_branch"] > LAST_VOLTA_BRANCH:
        out.append(f"{host}: nvidia_driver_branch is {cfg['nvidia_driver_branch']}, but R{LAST_VOLTA_BRANCH} is "
                   f"the last branch that supports {names}. Fix: set nvidia_driver_branch: {LAST_VOLTA_BRANCH}")
    if pre_turing and cfg["nvidia_driver_flavour"] == "open":
        out.append(f"{host}: nvidia_driver_flavour is open, but NVIDIA's open kernel modules support "
                   f"Turing and newer only, not {names}. Fix: set nvidia_driver_flavour: proprietary")
    if high is not None and high >= BLACKWELL and cfg["nvidia_driver_flavour"] == "proprietary":
        out.append(f"{host}: {names} (compute capability {high}) needs NVIDIA's open kernel modules. "
                   "Fix: set nvidia_driver_flavour: open for this group")
    if installed_driver and pre_turing and major(installed_driver) > LAST_VOLTA_BRANCH:
        out.append(f"{host}: the installed driver is {installed_driver}, newer than R{LAST_VOLTA_BRANCH}, the last "
                   f"branch for {names}. Fix: install R{LAST_VOLTA_BRANCH} (manage_driver: true) and hold it")
    if installed_driver and not cfg["manage_driver"] and major(installed_driver) != cfg["nvidia_driver_branch"]:
        out.append(f"{host}: manage_driver is false and the installed driver is {installed_driver}, not branch "
                   f"R{cfg['nvidia_driver_branch']}. Fix: align nvidia_driver_branch with the driver managed "
                   "elsewhere, or set manage_driver: true")
    return out


def gpus_from_lspci(lines: list[str]) -> list[dict]:
    """NVIDIA GPUs seen on the PCI bus (`lspci -Dnn -d 10de:`) when no driver answers yet."""
    gpus = []
    for line in lines:
        if "[10de:" not in line or not any(c in line for c in ("[0300]", "[0302]")):
            continue
        dev = line.split("[10de:", 1)[1][:4].lower()
        name = VOLTA_PCI_IDS.get(dev, f"NVIDIA [10de:{dev}]")
        memory = 32768 if "32GB" in name else 16384 if "16GB" in name else 0
        gpus.append({"index": len(gpus), "name": name, "compute_cap": "7.0" if dev in VOLTA_PCI_IDS else "unknown",
                     "memory_mib": memory, "driver_version": None, "pci_only": True})
    return gpus
