"""Facts of the NVIDIA driver, shared by the toolchain role and the plan role (roles never import
each other): installed driver packages, the loaded kernel module, what apt would install, the PCI bus,
nvidia-smi's bus ids, and why a driver sees no GPU.

Each is read afresh when an operation executes (after the reboot, for instance).
`driver_plan` decides the driver's change from them (the toolchain role, and the plan)."""
from __future__ import annotations

from pyinfra.api import FactBase

from roles.factcache import host_fact
from voltafleet.gpu import nvidia

# Package name globs handed to dpkg-query; voltafleet.gpu.nvidia.driver_set keeps the driver ones.
DRIVER_GLOBS = ("nvidia-*", "libnvidia-*", "cuda-drivers*", "libcuda1", "libnvcuvid*", "libnvoptix*",
                "xserver-xorg-video-nvidia*", "libxnvctrl*", "firmware-nvidia-*", "linux-modules-nvidia-*",
                "linux-objects-nvidia-*", "linux-signatures-nvidia-*")


class NvidiaPackages(FactBase):
    """NVIDIA packages dpkg knows: [{"name", "version", "status"}] (status: dpkg's db:Status-Abbrev,
    "ii " installed, "hi " installed and held, "rc " only config files left).

    .. code:: python

        host.get_fact(NvidiaPackages)  # [{"name": "cuda-drivers-580", "version": "580.95.05-0ubuntu1", "status": "hi "}]
    """

    @staticmethod
    def default():
        return []

    def command(self) -> str:
        globs = " ".join(f"'{g}'" for g in DRIVER_GLOBS)
        return f"dpkg-query -W -f='pkg|${{db:Status-Abbrev}}|${{Package}}|${{Version}}\\n' {globs} 2>/dev/null || true"

    def process(self, output):
        out = []
        for line in output:
            parts = line.split("|")
            if len(parts) == 4 and parts[0] == "pkg" and parts[3]:
                out.append({"status": parts[1], "name": parts[2], "version": parts[3]})
        return out


class LoadedDriver(FactBase):
    """Version of the NVIDIA kernel module running now (/proc/driver/nvidia/version), None if none."""

    def command(self) -> str:
        return "cat /proc/driver/nvidia/version 2>/dev/null || true"

    def process(self, output):
        for line in output:
            # NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 ...
            if line.startswith("NVRM version:") and "Kernel Module" in line:
                parts = line.split("Kernel Module", 1)[1].split()
                return parts[0] if parts else None
        return None


class AptCandidate(FactBase):
    """The version `apt-get install PACKAGE` would install now (apt-cache policy), None if unknown."""

    def command(self, package: str) -> str:
        return f"apt-cache policy {package} 2>/dev/null || true"

    def process(self, output):
        for line in output:
            line = line.strip()
            if line.startswith("Candidate:"):
                value = line.split(":", 1)[1].strip()
                return None if value in ("", "(none)") else value
        return None


class NvidiaPci(FactBase):
    """NVIDIA functions on the PCI bus, `lspci -Dnn -d 10de:` lines (GPUs, NVSwitches, audio)."""

    @staticmethod
    def default():
        return []

    def command(self) -> str:
        return "lspci -Dnn -d 10de: 2>/dev/null || true"

    def process(self, output):
        return [line for line in output if "[10de:" in line]


class SmiBusIds(FactBase):
    """PCI bus ids of the GPUs nvidia-smi lists ("00000000:06:00.0"); [] when it answers nothing."""

    @staticmethod
    def default():
        return []

    def command(self) -> str:
        return "nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader 2>/dev/null || true"

    def process(self, output):
        return [line.strip() for line in output if line.strip().count(":") == 2]


class DriverDiagnostics(FactBase):
    """What to look at when the driver sees no GPU: DKMS, Secure Boot, nouveau, nvidia-smi's error."""

    @staticmethod
    def default():
        return {}

    def command(self) -> str:
        return ("echo \"dkms=$(dkms status 2>&1 | grep -i nvidia | tr '\\n' ';')\"; "
                "echo \"secureboot=$(mokutil --sb-state 2>&1 | head -n1)\"; "
                "echo \"nouveau=$(lsmod 2>/dev/null | grep -w nouveau | awk '{print $1}' | head -n1)\"; "
                "echo \"nvidia_smi=$(nvidia-smi -L 2>&1 | head -n1)\"")

    def process(self, output):
        out = {}
        for line in output:
            key, _, val = line.partition("=")
            if key in ("dkms", "secureboot", "nouveau", "nvidia_smi"):
                out[key] = val.strip().rstrip(";")
        return out


def driver_plan(h, os_id: str, source: str, branch: int, flavour: str, target: str | None, nvswitch: bool) -> dict:
    """voltafleet.gpu.nvidia.driver_plan from host h's live facts (packages, loaded module, and the
    candidate apt would install when the target is "latest")."""
    key = nvidia.driver_packages(os_id, source, branch, flavour)["install"][0]
    candidate = h.get_fact(AptCandidate, package=key) if target == "latest" else None
    return nvidia.driver_plan(os_id, source, branch, flavour, target, host_fact(h, NvidiaPackages),
                              loaded=host_fact(h, LoadedDriver), candidate=candidate, nvswitch=nvswitch)
