"""NVIDIA toolkit and driver on pyinfra's fake connector (NVIDIA's repository and a real
driver cannot be reached here): the exact commands per distro and GPU, and every refusal.

Each scenario is a pyinfra run of the real preflight and toolchain roles
(tests/ops/toolchain_deploy.py) on fake hosts: in process (tests/ops/harness.py, what
`pyinfra --debug -y` does, through pyinfra's API); the fake connector answers facts as the
scenario says and keeps every command it is sent. What a user sees from the CLI itself (its
exit codes, what it prints, that it agrees with the in-process runs) is tests/ops/test_cli.py's,
through cli_run_many.
"""
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ops.harness import deploy

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
CMD = re.compile(r"\[fake\] simulating command on ([^:]+): (.*)")

V100_SMI = "0, Tesla V100-SXM2-16GB, 7.0, 16384, 580.95.05\n1, Tesla V100-SXM2-16GB, 7.0, 16384, 580.95.05"
H100_SMI = "0, NVIDIA H100 80GB HBM3, 9.0, 81559, 580.95.05"
B200_SMI = "0, NVIDIA B200, 10.0, 183359, 580.95.05"
V100_LSPCI = ("pci: 0000:06:00.0 3D controller [0302]: NVIDIA Corporation GV100GL [Tesla V100 SXM2 16GB] [10de:1db1] (rev a1)\n"
              "pci: 0000:07:00.0 3D controller [0302]: NVIDIA Corporation GV100GL [Tesla V100 SXM2 16GB] [10de:1db1] (rev a1)")
NVCC_13 = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.48"
KEYRING = "https://developer.download.nvidia.com/compute/cuda/repos/{}/x86_64/cuda-keyring_1.1-1_all.deb"
APT_INSTALL = 'DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" ' \
              '-o Dpkg::Options::="--force-confold" install '


# What dpkg-query (roles/driver_facts.py NvidiaPackages) answers on a converged R580 host, and
# the loaded kernel module's line in /proc/driver/nvidia/version.
R580_NOBLE_DPKG = "\n".join(f"pkg|{st}|{p}|{v}" for st, p, v in (
    ("hi ", "cuda-drivers-580", "580.95.05-0ubuntu1"), ("hi ", "nvidia-dkms-580", "580.95.05-0ubuntu1"),
    ("hi ", "nvidia-driver-pinning-580", "580.95.05-1"), ("ii ", "nvidia-driver-580", "580.95.05-0ubuntu1"),
    ("ii ", "libnvidia-compute-580", "580.95.05-0ubuntu1"), ("ii ", "nvidia-container-toolkit", "1.17.8-1")))
# The GpuHealth fact's answer (tests/ops/inventory.py): two healthy boards of tests/gpu_fixtures.py
GPU_HEALTH = '@gpu:{"n": 2}'
LOADED = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {}  Tue Sep 23 09:52:45 UTC 2025"


def run(name, os_id="ubuntu-24.04", smi=V100_SMI, nvcc=None, vars=None, extra=()):
    rc, cmds, out = run_many([host(name, os_id, smi, nvcc, vars, extra)])
    return rc, cmds[f"@fake/{name}"], out


def host(name, os_id="ubuntu-24.04", smi=V100_SMI, nvcc=None, vars=None, extra=()):
    """One fake host: the scenario's own answers first (the first match wins), then defaults."""
    responses = [
        *extra,
        ["/etc/os-release", f"os={os_id}\ncpus=80\nmem_kib=527000000\nsystemd=255\ncxx=13.2.0 x86_64-linux-gnu"],
        ["nvidia-smi --query-gpu", smi],
        ["nvidia-smi -q", GPU_HEALTH],
        ["df -PB1", "2049 900000000000"],
        [r"cut -d\. -f1 /proc/uptime", "5"],
    ]
    if nvcc:
        responses.append([r"^for n in nvcc /usr/local/cuda/bin/nvcc", nvcc])
    return {"name": name, "responses": responses, "vars": vars or {}}


def run_many(hosts):
    """Run preflight + toolchain on several fake hosts at once, in process:
    (rc, {host: commands}, output), as cli_run_many answers for the same hosts."""
    return deploy(hosts)


def cli_run_many(hosts):
    """The same run through the real CLI (`pyinfra --debug -y`) in a subprocess: its exit code,
    the commands scraped from its `[fake] simulating command` debug lines (a command's first
    line), and everything it printed."""
    proc = subprocess.run([PYINFRA, "--debug", "-y", "tests/ops/inventory.py", "tests/ops/toolchain_deploy.py"],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "VOLTAFLEET_FAKE": json.dumps({"hosts": hosts})})
    out = proc.stdout + proc.stderr
    cmds = {f"@fake/{h['name']}": [] for h in hosts}
    for m in CMD.finditer(out):
        cmds.setdefault(m.group(1), []).append(m.group(2))
    return proc.returncode, cmds, out


def changes(commands):
    """The commands that change a host (not fact reads)."""
    verbs = ("apt-get", "dpkg --force", "apt-mark hold", "update-initramfs", "reboot", "systemctl",
             "mv /tmp", "mkdir", "chmod", "curl -sSLf")
    return [c for c in commands if c.startswith(verbs) or "reboot" in c]


def installs(commands):
    """Package installs (not `install -f`, which pyinfra's apt.deb runs after dpkg -i)."""
    return [c[len(APT_INSTALL):] for c in commands if c.startswith(APT_INSTALL) and c != APT_INSTALL + "-f"]


def test_v100_ubuntu_2404_from_nvidia_repo():
    rc, cmds, out = run("v100-noble")
    assert rc == 0, out
    assert any(KEYRING.format("ubuntu2404") in c for c in cmds)
    assert installs(cmds) == [
        "--no-install-recommends build-essential cmake git ccache python3 curl ca-certificates",
        "--no-install-recommends cuda-toolkit-12-8",
        "nvidia-driver-pinning-580",
        "cuda-drivers-580 nvidia-dkms-580",
    ]
    assert "apt-mark hold cuda-drivers-580 nvidia-dkms-580 nvidia-driver-pinning-580" in cmds
    assert "update-initramfs -u" in cmds
    assert any("reboot" in c for c in cmds)
    assert "systemctl enable nvidia-persistenced.service" in cmds
    assert "systemctl start nvidia-persistenced.service" in cmds
    # never the bare metapackages that move to CUDA 13, never open modules on Volta
    assert not [c for c in installs(cmds) if re.search(r"(^| )(cuda|cuda-toolkit)( |$)|-open", c)]
    # the reboot comes after the driver and the hold, the persistence daemon after the reboot
    order = [next(i for i, c in enumerate(cmds) if key in c)
             for key in ("cuda-drivers-580 nvidia-dkms-580", "apt-mark hold", "reboot", "nvidia-persistenced")]
    assert order == sorted(order)


def test_v100_ubuntu_2204_keyring_url():
    rc, cmds, out = run("v100-jammy", os_id="ubuntu-22.04")
    assert rc == 0, out
    assert any(KEYRING.format("ubuntu2204") in c for c in cmds)


def test_v100_debian_12_from_nvidia_repo():
    rc, cmds, out = run("v100-bookworm", os_id="debian-12")
    assert rc == 0, out
    assert any(KEYRING.format("debian12") in c for c in cmds)
    assert installs(cmds)[2:] == ["nvidia-driver-pinning-580", "cuda-drivers nvidia-kernel-dkms"]
    assert "apt-mark hold cuda-drivers nvidia-kernel-dkms nvidia-driver-pinning-580" in cmds


def test_v100_ubuntu_distro_packages():
    rc, cmds, out = run("v100-distro", vars={"nvidia_driver_source": "distro"})
    assert rc == 0, out
    assert installs(cmds)[2:] == ["nvidia-headless-580-server nvidia-utils-580-server"]
    assert "apt-mark hold nvidia-headless-580-server nvidia-utils-580-server" in cmds


def test_debian_has_no_r580_in_its_own_archive():
    rc, cmds, out = run("v100-bookworm-distro", os_id="debian-12", vars={"nvidia_driver_source": "distro"})
    assert rc != 0
    assert "debian-12 ships no R580 driver in its own archive: use nvidia_driver_source: nvidia_repo" in out
    assert changes(cmds) == []


def test_newer_gpu_gets_open_modules_when_asked():
    rc, cmds, out = run("h100", smi=H100_SMI, vars={"nvidia_driver_flavour": "open", "llama_cpp_cuda_archs": None})
    assert rc == 0, out
    assert installs(cmds)[3] == "cuda-drivers-580 nvidia-dkms-580-open"


def test_blackwell_needs_open_modules():
    rc, cmds, out = run("b200", smi=B200_SMI, vars={"llama_cpp_cuda_archs": None})
    assert rc != 0 and "needs NVIDIA's open kernel modules. Fix: set nvidia_driver_flavour: open" in out
    assert changes(cmds) == []


@pytest.mark.parametrize("vars,nvcc,message", [
    ({"cuda_toolkit_version": "13.0"}, None,
     "cuda_toolkit_version is 13.0, but the host has Tesla V100-SXM2-16GB (compute capability 7.0): CUDA 13 "
     "removed Volta support and nvcc 13 cannot build sm_70. Fix: set cuda_toolkit_version: \"12.8\""),
    ({}, NVCC_13, "the installed CUDA toolkit is 13.0.48 (nvcc on PATH or /usr/local/cuda), but the host has "
                  "Tesla V100-SXM2-16GB (compute capability 7.0): CUDA 13 cannot build sm_70"),
    ({"nvidia_driver_branch": 590}, None,
     "nvidia_driver_branch is 590, but R580 is the last branch that supports Tesla V100-SXM2-16GB. "
     "Fix: set nvidia_driver_branch: 580"),
    ({"nvidia_driver_flavour": "open"}, None,
     "nvidia_driver_flavour is open, but NVIDIA's open kernel modules support Turing and newer only, not "
     "Tesla V100-SXM2-16GB. Fix: set nvidia_driver_flavour: proprietary"),
])
def test_volta_refusals_change_nothing(vars, nvcc, message):
    rc, cmds, out = run("v100-refused", vars=vars, nvcc=nvcc)
    assert rc != 0
    assert "preflight refused the rollout, nothing was changed" in out
    assert f"@fake/v100-refused: {message}" in out
    assert changes(cmds) == []


def test_newer_gpu_with_cuda_13_is_not_refused():
    rc, cmds, out = run("h100-cuda13", smi=H100_SMI, nvcc=NVCC_13,
                        vars={"cuda_toolkit_version": "13.0", "llama_cpp_cuda_archs": None})
    assert rc == 0, out
    assert "--no-install-recommends cuda-toolkit-13-0" in installs(cmds)


def test_unmanaged_driver_is_left_alone_but_checked():
    rc, cmds, out = run("v100-unmanaged", vars={"manage_driver": False})
    assert rc == 0, out
    assert installs(cmds)[1:] == ["--no-install-recommends cuda-toolkit-12-8"]
    assert not [c for c in cmds if "reboot" in c or "apt-mark hold" in c or "nouveau" in c]


def test_unmanaged_driver_of_another_branch_is_refused():
    smi = V100_SMI.replace("580.95.05", "575.57.08")
    rc, cmds, out = run("v100-unmanaged-575", smi=smi, vars={"manage_driver": False})
    assert rc != 0
    assert "manage_driver is false and the installed driver is 575.57.08, not branch R580" in out
    assert changes(cmds) == []


def test_no_driver_yet_gpus_come_from_lspci_and_nvidia_smi_is_checked_after_reboot():
    # nvidia-smi never answers in this scenario: the rollout installs the driver, reboots,
    # then stops with the check's message rather than going on to build.
    rc, cmds, out = run("v100-bare", smi=V100_LSPCI)  # the Gpus fact falls back to lspci
    assert rc != 0
    assert installs(cmds)[3] == "cuda-drivers-580 nvidia-dkms-580"
    assert any("reboot" in c for c in cmds)
    assert "nvidia-smi lists no GPU after the driver install" in out


def test_converged_host_is_not_rebooted():
    dpkg = "\n".join(f"ii  {p}  580.95.05-1  amd64  x" for p in (
        "build-essential", "cmake", "git", "ccache", "python3", "curl", "ca-certificates", "cuda-keyring",
        "cuda-toolkit-12-8", "nvidia-driver-pinning-580", "cuda-drivers-580", "nvidia-dkms-580"))
    blacklist_sha1 = hashlib.sha1(b"blacklist nouveau\noptions nouveau modeset=0\n").hexdigest()
    rc, cmds, out = run("v100-converged", extra=[
        ["dpkg-query -W", R580_NOBLE_DPKG],
        ["/proc/driver/nvidia/version", LOADED.format("580.95.05")],
        ["dpkg -l", dpkg],
        ["apt-mark showhold", "cuda-drivers-580\nnvidia-dkms-580\nnvidia-driver-pinning-580"],
        # the blacklist and its directory in place: roles/filesync's one fact
        [r"^for p in /etc/modprobe\.d /etc/modprobe\.d/voltafleet-blacklist-nouveau\.conf; ", f"dir 755\nfile 644 {blacklist_sha1}"],
        ["systemctl show", "nvidia-persistenced.service=running"],
        [r"update-success-stamp", "user=root group=root mode=-rw-r--r-- atime=9999999999 mtime=9999999999 "
                                  "ctime=0 size=0 '/var/lib/apt/periodic/update-success-stamp'"],
    ])
    assert rc == 0, out
    assert installs(cmds) == []
    assert not [c for c in cmds if "reboot" in c or "apt-mark hold" in c or "update-initramfs" in c]
