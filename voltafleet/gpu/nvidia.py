"""NVIDIA stack decisions for Volta fleets: repository, package names, and refusals.

Facts this rests on (docs/domain.md, with their sources):
- CUDA 13 dropped Maxwell, Pascal and Volta: sm_70 needs CUDA 12.x (12.9 is the last).
- R580 is the last driver branch that supports Volta (LTS, EOL June 2028).
- NVIDIA's open kernel modules are Turing+ only; Blackwell needs them.

    >>> driver_packages("ubuntu-24.04", "nvidia_repo", 580, "proprietary")
    {'pin': 'nvidia-driver-pinning-580', 'install': ['cuda-drivers-580', 'nvidia-dkms-580'], ...}
"""
from __future__ import annotations

from voltafleet.inputs.settings import Settings

import re

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


def refusals(host: str, cfg: Settings, gpus: list[dict], installed_nvcc: str | None,
             installed_driver: str | None) -> list[str]:
    """Why the NVIDIA stack this config asks for cannot serve these GPUs, each with its fix."""
    out = []
    caps = compute_caps(gpus)
    low, high = (min(caps), max(caps)) if caps else (None, None)
    names = ", ".join(sorted({g["name"] for g in gpus})) or "no GPU"
    pre_turing = low is not None and low < TURING
    if pre_turing and major(cfg.toolchain.cuda_toolkit_version) >= 13:
        out.append(f"{host}: cuda_toolkit_version is {cfg.toolchain.cuda_toolkit_version}, but the host has "
                   f"{names} (compute capability {low}): CUDA 13 removed Volta support and nvcc 13 cannot "
                   'build sm_70. Fix: set cuda_toolkit_version: "12.8"')
    if pre_turing and installed_nvcc and major(installed_nvcc) >= 13:
        out.append(f"{host}: the installed CUDA toolkit is {installed_nvcc} (nvcc on PATH or /usr/local/cuda), "
                   f"but the host has {names} (compute capability {low}): CUDA 13 cannot build sm_70. "
                   "Fix: remove CUDA 13 or point /usr/local/cuda at 12.x; voltafleet installs "
                   f"{toolkit_package(cfg.toolchain.cuda_toolkit_version)}")
    if pre_turing and cfg.toolchain.nvidia_driver_branch > LAST_VOLTA_BRANCH:
        out.append(f"{host}: nvidia_driver_branch is {cfg.toolchain.nvidia_driver_branch}, but R{LAST_VOLTA_BRANCH} is "
                   f"the last branch that supports {names}. Fix: set nvidia_driver_branch: {LAST_VOLTA_BRANCH}")
    if pre_turing and cfg.toolchain.nvidia_driver_flavour == "open":
        out.append(f"{host}: nvidia_driver_flavour is open, but NVIDIA's open kernel modules support "
                   f"Turing and newer only, not {names}. Fix: set nvidia_driver_flavour: proprietary")
    if high is not None and high >= BLACKWELL and cfg.toolchain.nvidia_driver_flavour == "proprietary":
        out.append(f"{host}: {names} (compute capability {high}) needs NVIDIA's open kernel modules. "
                   "Fix: set nvidia_driver_flavour: open for this group")
    if installed_driver and pre_turing and major(installed_driver) > LAST_VOLTA_BRANCH:
        out.append(f"{host}: the installed driver is {installed_driver}, newer than R{LAST_VOLTA_BRANCH}, the last "
                   f"branch for {names}. Fix: install R{LAST_VOLTA_BRANCH} (manage_driver: true) and hold it")
    if installed_driver and not cfg.toolchain.manage_driver and major(installed_driver) != cfg.toolchain.nvidia_driver_branch:
        out.append(f"{host}: manage_driver is false and the installed driver is {installed_driver}, not branch "
                   f"R{cfg.toolchain.nvidia_driver_branch}. Fix: align nvidia_driver_branch with the driver managed "
                   "elsewhere, or set manage_driver: true")
    return out + version_refusals(host, cfg)


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


# --- Driver upgrades, branch moves and NVSwitch hosts ------------------------------------------
#
# Package names and sources this rests on:
# - NVIDIA's repository (docs.nvidia.com/datacenter/tesla/driver-installation-guide, "Recent
#   updates" and "Version locking"): `nvidia-driver-pinning-<branch>` locks apt to a branch and
#   is installed before the driver; on Ubuntu the R580 packages carry the branch in their name
#   (cuda-drivers-580, nvidia-dkms-580, libnvidia-compute-580, nvidia-fabricmanager-580); from
#   590 they drop it. On Debian NVIDIA's packages carry no branch (cuda-drivers, nvidia-driver,
#   nvidia-kernel-dkms, libcuda1, nvidia-fabricmanager): only the version says the branch
#   (forums.developer.nvidia.com/t/353805: cuda-drivers-580 depends on "nvidia-driver (>= 580...)").
#   NVIDIA's versions end in a plain Debian revision: 580.95.05-1, 580.95.05-0ubuntu1.
# - Ubuntu's archive: nvidia-headless-<b>-server, nvidia-utils-<b>-server, nvidia-dkms-<b>-server,
#   linux-modules-nvidia-<b>-server-*, nvidia-fabricmanager-<b>, libnvidia-nscq-<b> (as used by
#   NVIDIA/ansible-role-nvidia-driver defaults/main.yml); its versions carry "0ubuntu0.<release>"
#   (535.183.01-0ubuntu0.22.04.1). Debian's own archive (bookworm: 535) carries "~deb12u".
# - The Ubuntu archive keeps only the newest release of a branch, so an exact version can only be
#   asked of NVIDIA's repository (which keeps every release).
# - NVSwitch: an NVIDIA PCI function of class 0680 "Bridge: other" (NCCL's topology code,
#   src/include/nvlink.h ncclDeviceType: class 0x068000 = NVSwitch); fabric manager must be of
#   exactly the driver's version and running, or CUDA does not initialise on those hosts
#   (NVIDIA Fabric Manager user guide; Talos' nvidia-fabricmanager guide: "has to match with the
#   NVIDIA driver version in use").


NVSWITCH_CLASS = "0680"
# NVSwitch device ids known from pci.ids (GA100 [A100 NVSwitch]); the class decides, the id names it.
NVSWITCH_PCI_IDS = {"1af1": "A100 NVSwitch"}
STOP_SERVERS = "systemctl stop 'llama-server@*'"
DRIVER_PREFERENCES = "/etc/apt/preferences.d/voltafleet-nvidia-driver"
# Driver-set packages: the names NVIDIA and the distros ship the kernel module, its libraries and
# tools under. Not driver: the container toolkit, Ubuntu's own CUDA toolkit (nvidia-cuda-*),
# nvidia-settings and nvidia-prime (versioned apart from the driver), NVIDIA's CUDA toolkit.
_DRIVER_NAME = re.compile(r"^(nvidia-|libnvidia-|cuda-drivers|libcuda1|libnvcuvid|libnvoptix|libnvidia|"
                           r"xserver-xorg-video-nvidia|libxnvctrl|firmware-nvidia|linux-(modules|objects|"
                           r"signatures)-nvidia-|lib(egl|glx|gles|gl1)-nvidia)")
_NOT_DRIVER = re.compile(r"^(nvidia-container|libnvidia-container|nvidia-cuda-|nvidia-settings|nvidia-prime|"
                          r"nvidia-docker|nvidia-driver-assistant|nvidia-gds|nvidia-fs|nvidia-profiler|"
                          r"nvidia-visual-profiler|nvidia-opencl-dev|nvidia-openjdk|nvidia-nsight|nvidia-l4t)")
VERSION = re.compile(r"^\d{3}\.\d+(\.\d+)?$")


def upstream(version: str | None) -> str | None:
    """"580.95.05" of "580.95.05-0ubuntu1" (and of "1:580.95.05-1")."""
    if not version:
        return None
    return version.split(":", 1)[-1].split("-", 1)[0]


def package_branch(name: str, version: str) -> int | None:
    """The driver branch of a package: from its name where it carries one, else its version."""
    m = re.search(r"-(\d{3})(?=[-.]|$)", name)
    if m and int(m.group(1)) >= 300:
        return int(m.group(1))
    v = upstream(version) or ""
    head = v.split(".")[0]
    return int(head) if head.isdigit() and 300 <= int(head) < 1000 else None


def package_source(name: str, version: str) -> str:
    """nvidia_repo or distro (Ubuntu's or Debian's own archive), from the name and the version."""
    if "-server" in name or re.match(r"^linux-(modules|objects|signatures)-nvidia-", name):
        return "distro"
    revision = version.split("-", 1)[1] if "-" in version else ""
    if re.fullmatch(r"\d+|0ubuntu1", revision):
        return "nvidia_repo"
    return "distro"  # 0ubuntu0.22.04.1, 1~deb12u1, ...


def driver_set(installed: list[dict]) -> list[dict]:
    """The installed NVIDIA driver packages, each with its branch and source.

    installed: [{"name", "version", "status" (dpkg's db:Status-Abbrev, e.g. "ii ", "hi ")}]
    """
    out = []
    for p in installed:
        status = p.get("status", "ii")
        if len(status) < 2 or status[1] not in "iuUhHtTW":  # not installed ("rc": config files only)
            continue
        if not _DRIVER_NAME.match(p["name"]) or _NOT_DRIVER.match(p["name"]):
            continue
        branch = package_branch(p["name"], p["version"])
        if branch is None:
            continue
        out.append({**p, "branch": branch, "source": package_source(p["name"], p["version"]),
                    "held": status[0] == "h"})
    return out


def fabricmanager_packages(os_id: str, source: str, branch: int) -> list[str]:
    """Fabric manager (and NSCQ where the archive splits it out) for the driver branch."""
    if source == "distro":
        return [f"nvidia-fabricmanager-{branch}", f"libnvidia-nscq-{branch}"]
    if os_id.startswith("ubuntu") and branch < 590:
        return [f"nvidia-fabricmanager-{branch}"]
    return ["nvidia-fabricmanager"]  # Debian, and Ubuntu from 590: no branch in the name


def nvswitches(pci_lines: list[str]) -> list[str]:
    """PCI addresses of NVSwitches in `lspci -Dnn -d 10de:` output."""
    out = []
    for line in pci_lines:
        if "[10de:" in line and f"[{NVSWITCH_CLASS}]" in line:
            out.append(line.split()[0])
    return out


def driver_plan(os_id: str, source: str, branch: int, flavour: str, target: str | None,
                installed: list[dict], loaded: str | None = None, candidate: str | None = None,
                nvswitch: bool = False) -> dict:
    """What to do to the driver packages of one host, decided from what is installed.

    target: None (keep the installed release), "latest" (newest of the branch: `candidate`, the
    version apt would install), or an exact version "580.95.05".
    loaded: the running kernel module's version (/proc/driver/nvidia/version), None if none;
    a host whose installed driver is not the loaded one is rebooted (nothing else changes).

    Returns purge (packages of another branch or another source, purged first), unhold (held
    packages that will be purged or upgraded), pin (NVIDIA's branch-locking package or None),
    install (packages for `apt-get install`, kept ones included when they upgrade), hold (to
    `apt-mark hold` after: all of the driver's top packages after a change, else those not held),
    change (packages change: stop the servers, reboot), reboot (change, or a module older than
    the installed packages still loaded), downgrade (allow apt to go back to the pinned
    version) and why (a sentence for the log).
    """
    pkgs = driver_packages(os_id, source, branch, flavour)
    required = pkgs["install"] + (fabricmanager_packages(os_id, source, branch) if nvswitch else [])
    pin = pkgs["pin"]
    found = driver_set(installed)
    keep = [p for p in found if p["branch"] == branch and p["source"] == source]
    purge = [p for p in found if p not in keep]
    keep_names = {p["name"] for p in keep}
    missing = [n for n in required + ([pin] if pin else []) if n not in keep_names]
    versions = {p["name"]: upstream(p["version"]) for p in keep
                if p["name"] != pin and (upstream(p["version"]) or "").startswith(f"{branch}.")}
    current = next((versions[n] for n in required if n in versions), None)
    why = []
    if purge:
        moved = sorted({f"R{p['branch']} ({p['source']})" for p in purge})
        why.append(f"replace {', '.join(moved)} packages by R{branch} ({source})")
    if missing:
        why.append("install " + " ".join(missing))
    upgrade = False
    if target == "latest" and candidate and current and upstream(candidate) != current:
        upgrade = True
        why.append(f"upgrade {current} -> {upstream(candidate)} (latest of R{branch})")
    elif target not in (None, "latest"):
        stale = sorted({v for v in versions.values() if v != target})
        if stale:
            upgrade = True
            why.append(f"move {', '.join(stale)} -> {target} (pinned)")
    change = bool(purge or missing or upgrade)
    if change and (upgrade or purge):
        install = required + sorted(keep_names - set(required) - {pin})
    else:
        install = [n for n in required if n not in keep_names]
    installed_after = target if target not in (None, "latest") else \
        (upstream(candidate) if upgrade else current)
    # An older module still loaded, or none at all (a DKMS build fixed since the last run):
    # only a reboot loads the installed one.
    reboot = change or bool(installed_after and loaded != installed_after)
    if reboot and not change:
        why.append(f"the loaded module is {loaded or 'none'}, the installed driver {installed_after}: reboot")
    touched = {p["name"] for p in purge} | (set(install) if change else set())
    hold = required + ([pin] if pin else [])
    held = {p["name"] for p in keep if p["held"]}
    return {
        "purge": [p["name"] for p in purge],
        "unhold": sorted(p["name"] for p in found if p["held"] and p["name"] in touched),
        "pin": pin if pin in missing else None,
        "install": install if change else [],
        "hold": hold if change else [n for n in hold if n not in held],
        "change": change,
        "reboot": reboot,
        "downgrade": change and target not in (None, "latest"),
        "why": "; ".join(why),
        "current": current,
    }


def driver_preferences(branch: int, target: str | None) -> str | None:
    """An apt_preferences(5) file that makes apt install (and downgrade to) one exact release of
    the driver set; None unless a version is pinned. (NVIDIA's "Version locking" page: distro
    mechanisms lock a version; priority 1001 lets apt go back to it.)"""
    if target in (None, "latest"):
        return None
    return ("# voltafleet: nvidia_driver_version pins the NVIDIA driver set to one release\n"
            "Package: cuda-drivers* nvidia-* libnvidia-* libcuda1 libnvcuvid* libnvoptix* "
            "xserver-xorg-video-nvidia* libxnvctrl* firmware-nvidia-*\n"
            f"Pin: version {target}-*\nPin-Priority: 1001\n")


def version_refusals(host: str, cfg: Settings) -> list[str]:
    """Why nvidia_driver_version cannot be honoured, each with its fix."""
    target = cfg.toolchain.nvidia_driver_version
    if target in (None, "latest") or not cfg.toolchain.manage_driver:
        return []
    out = []
    if major(target) != cfg.toolchain.nvidia_driver_branch:
        out.append(f"{host}: nvidia_driver_version is {target}, not a release of branch "
                   f"R{cfg.toolchain.nvidia_driver_branch}. Fix: set a {cfg.toolchain.nvidia_driver_branch}.x version, or "
                   '"latest"')
    if cfg.toolchain.nvidia_driver_source == "distro":
        out.append(f"{host}: nvidia_driver_version is {target}, but Ubuntu's archive keeps only the newest "
                   "release of a branch. Fix: set nvidia_driver_version: latest, or nvidia_driver_source: "
                   "nvidia_repo")
    return out


def pci_address(addr: str) -> str:
    """"0000:06:00.0" from lspci's "0000:06:00.0" or nvidia-smi's "00000000:06:00.0"."""
    addr = addr.strip().lower()
    parts = addr.split(":")
    if len(parts) == 3:
        return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
    return "0000:" + addr


def gpu_addresses(pci_lines: list[str]) -> list[str]:
    """PCI addresses of NVIDIA GPUs (class 0300 VGA or 0302 3D controller) in `lspci -Dnn -d 10de:`."""
    return [pci_address(line.split()[0]) for line in pci_lines
            if "[10de:" in line and ("[0300]" in line or "[0302]" in line)]


def missing_gpus(pci_lines: list[str], smi_bus_ids: list[str]) -> list[dict]:
    """GPUs on the PCI bus that nvidia-smi does not list: [{"pci", "position", "of"}], where
    position is the GPU's place in PCI order (nvidia-smi's index for it on a healthy host)."""
    on_bus = sorted(gpu_addresses(pci_lines))
    seen = {pci_address(b) for b in smi_bus_ids}
    return [{"pci": a, "position": i, "of": len(on_bus)} for i, a in enumerate(on_bus) if a not in seen]


def gpu_health(host: str, pci_lines: list[str], smi_bus_ids: list[str], allow_degraded: bool) -> dict:
    """Decide what a host with a GPU missing from nvidia-smi does: stop (the default), or serve on
    its healthy GPUs when allow_degraded_gpus is true. Returns {"missing", "error", "warning"}."""
    missing = missing_gpus(pci_lines, smi_bus_ids)
    if not missing:
        return {"missing": [], "error": None, "warning": None}
    total = missing[0]["of"]
    names = ", ".join(f"GPU {m['position']} at PCI {m['pci']}" for m in missing)
    what = (f"{host}: {len(missing)} of {total} GPUs on the PCI bus are missing from nvidia-smi: {names} "
            f"(nvidia-smi lists {total - len(missing)})")
    check = ("check `nvidia-smi -q`, `dmesg | grep -i -e xid -e 'fallen off'` and the GPU's seating/power; "
             "a reboot or `nvidia-smi -r` may bring it back")
    if allow_degraded:
        return {"missing": missing, "error": None,
                "warning": f"{what}; serving on the {total - len(missing)} healthy GPU(s) "
                           f"(allow_degraded_gpus: true). To fix: {check}"}
    return {"missing": missing, "warning": None,
            "error": f"{what}. The host is stopped before it serves. Fix: {check}; or set "
                     "allow_degraded_gpus: true for this host to serve on the healthy GPUs"}


def no_gpu_error(host: str, diagnostics: dict) -> str:
    """The error for a host whose driver sees no GPU after the install/reboot, with what to check."""
    diagnostics = diagnostics or {}
    lines = [f"{host}: nvidia-smi lists no GPU after the driver install and reboot; the rest of the "
             "fleet goes on, this host stops here. Check:"]
    lines.append(f"  dkms status: {diagnostics.get('dkms') or '(nothing: the kernel module was not built)'}"
                 " -> a failed DKMS build: install the headers of the running kernel (linux-headers-$(uname -r))"
                 " and rerun")
    lines.append(f"  mokutil --sb-state: {diagnostics.get('secureboot') or '(unknown)'}"
                 " -> with Secure Boot enabled the unsigned module is refused: enrol the DKMS MOK key or "
                 "disable Secure Boot")
    lines.append(f"  lsmod | grep nouveau: {diagnostics.get('nouveau') or '(not loaded)'}"
                 " -> nouveau holds the GPUs: check /etc/modprobe.d blacklist, update-initramfs -u, reboot")
    if diagnostics.get("nvidia_smi"):
        lines.append(f"  nvidia-smi says: {diagnostics['nvidia_smi']}")
    return "\n".join(lines)
