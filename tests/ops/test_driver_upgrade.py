"""Driver upgrades on the fake connector: branch moves from every usual starting point, upgrades
within R580, converged hosts, NVSwitch hosts, a host whose driver loses its GPUs, a missing GPU.

Each fleet is one pyinfra run of the real preflight and toolchain roles, in process
(tests/ops/harness.py); the fake hosts answer dpkg-query, nvidia-smi and
/proc/driver/nvidia/version as a real host would before and after its reboot
(tests/ops/fakefleet.py), and every command they are sent is checked. tests/ops/test_cli.py
runs both fleets through the real CLI too.
"""
import hashlib

import pytest

from tests.ops.test_toolchain import APT_INSTALL, LOADED, host, run_many

APT = APT_INSTALL[:-len("install ")]
STOP = "systemctl stop 'llama-server@*'"
REBOOT = "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &"
LSPCI2 = ("0000:06:00.0 3D controller [0302]: NVIDIA Corporation GV100GL [Tesla V100 SXM2 16GB] [10de:1db1] (rev a1)\n"
          "0000:07:00.0 3D controller [0302]: NVIDIA Corporation GV100GL [Tesla V100 SXM2 16GB] [10de:1db1] (rev a1)")
BUS2 = "00000000:06:00.0\n00000000:07:00.0"


BLACKLIST_SHA1 = hashlib.sha1(b"blacklist nouveau\noptions nouveau modeset=0\n").hexdigest()
BLACKLIST_PRESENT = [  # the nouveau blacklist and its directory are there from an earlier run (roles/filesync's one fact)
    [r"^for p in /etc/modprobe\.d /etc/modprobe\.d/voltafleet-blacklist-nouveau\.conf; ", f"dir 755\nfile 644 {BLACKLIST_SHA1}"],
]


def smi(version, n=2, name="Tesla V100-SXM2-16GB", mem=16384):
    return "\n".join(f"{i}, {name}, 7.0, {mem}, {version}" for i in range(n))


def dpkg(rows):
    return "\n".join(f"pkg|{'hi ' if held else 'ii '}|{name}|{version}" for name, version, held, _ in rows)


def driver_host(name, os_id, rows, before, after="580.95.05", vars=None, extra=(), pci=LSPCI2, bus=BUS2, n=2):
    """A host with `rows` installed (name, version, held, purged-by-the-move) running `before`;
    after its reboot it runs `after`."""
    # no driver yet (before=None): nvidia-smi fails and the Gpus fact reads the GPUs from lspci
    first = smi(before, n) if before else "\n".join("pci: " + line for line in pci.split("\n") if "[0302]" in line)
    return host(name, os_id, vars=vars, extra=[
        *extra,
        *BLACKLIST_PRESENT,
        ["apt-mark showhold", "\n".join(n for n, _, held, _ in rows if held)],
        ["pci.bus_id", {"before": bus if before else "", "after": bus}],
        ["nvidia-smi --query-gpu", {"before": first, "after": smi(after, n)}],
        ["dpkg-query -W", {"before": dpkg(rows), "after": ""}],
        ["/proc/driver/nvidia/version", {"before": LOADED.format(before), "after": LOADED.format(after)}],
        [r"^lspci -Dnn -d 10de: 2>/dev/null \|\| true", pci],
    ])


def driver_steps(cmds):
    """The commands that change the driver, in order: stop, unhold, purge, install, hold, reboot."""
    keys = (STOP, "apt-mark unhold", APT + "purge", "apt-mark hold", REBOOT)
    return [c for c in cmds if c.startswith(keys) or (c.startswith(APT_INSTALL) and
            any(k in c for k in ("nvidia", "cuda-drivers", "libnvidia")))]


# Starting points: what dpkg lists on a host of that branch and source. The fourth field says
# whether the move to R580 must purge it (True) or leave it (False: not a driver package).
def ubuntu_archive(branch, ver, rel):
    v = f"{ver}-0ubuntu0.{rel}.1"
    return [(f"libnvidia-compute-{branch}-server", v, False, True),
            (f"linux-modules-nvidia-{branch}-server-generic", "6.8.0-45.45", False, True),
            (f"nvidia-dkms-{branch}-server", v, False, True),
            (f"nvidia-headless-{branch}-server", v, True, True),
            (f"nvidia-kernel-common-{branch}-server", v, False, True),
            (f"nvidia-utils-{branch}-server", v, True, True),
            ("nvidia-container-toolkit", "1.17.8-1", False, False)]


def nvidia_repo_ubuntu(branch, ver):
    rows = [(f"cuda-drivers-{branch}", f"{ver}-1", True, True),
            (f"libnvidia-compute-{branch}", f"{ver}-0ubuntu1", False, True),
            (f"nvidia-dkms-{branch}", f"{ver}-0ubuntu1", True, True),
            (f"nvidia-driver-{branch}", f"{ver}-0ubuntu1", False, True),
            (f"nvidia-kernel-common-{branch}", f"{ver}-0ubuntu1", False, True),
            ("nvidia-settings", f"{ver}-0ubuntu1", False, False)]
    if branch >= 570:
        rows.append((f"nvidia-driver-pinning-{branch}", f"{ver}-1", True, True))
    return rows


def nvidia_repo_debian(ver):
    return [("cuda-drivers", f"{ver}-1", True, True), ("firmware-nvidia-gsp", f"{ver}-1", False, True),
            ("libcuda1", f"{ver}-1", False, True), ("nvidia-driver", f"{ver}-1", False, True),
            ("nvidia-kernel-dkms", f"{ver}-1", True, True), ("nvidia-smi", f"{ver}-1", False, True)]


def debian_archive(ver):
    return [("libcuda1", f"{ver}-1~deb12u1", False, True), ("nvidia-driver", f"{ver}-1~deb12u1", False, True),
            ("nvidia-kernel-common", "20151021+13", False, False),
            ("nvidia-kernel-dkms", f"{ver}-1~deb12u1", False, True)]


VERSIONS = {535: "535.230.02", 550: "550.163.01", 570: "570.172.08"}
REL = {"ubuntu-22.04": "22.04", "ubuntu-24.04": "24.04"}
TARGET = {  # (os, target source) -> (pin, driver packages installed)
    ("ubuntu", "nvidia_repo"): ("nvidia-driver-pinning-580", "cuda-drivers-580 nvidia-dkms-580"),
    ("ubuntu", "distro"): (None, "nvidia-headless-580-server nvidia-utils-580-server"),
    ("debian", "nvidia_repo"): ("nvidia-driver-pinning-580", "cuda-drivers nvidia-kernel-dkms"),
}
STARTS = (
    [(os_id, b, "distro", "nvidia_repo") for os_id in REL for b in VERSIONS]
    + [(os_id, b, "nvidia_repo", "nvidia_repo") for os_id in REL for b in VERSIONS]
    + [("debian-12", b, "nvidia_repo", "nvidia_repo") for b in VERSIONS]
    + [("debian-12", 535, "distro", "nvidia_repo"),  # bookworm's own 535
       ("ubuntu-24.04", 570, "nvidia_repo", "distro"),  # the other direction: NVIDIA's repo to Ubuntu's
       ("ubuntu-22.04", 535, "distro", "distro")]  # Ubuntu's archive, 535 to 580
)


def start_rows(os_id, branch, source):
    ver = VERSIONS[branch]
    if os_id == "debian-12":
        return nvidia_repo_debian(ver) if source == "nvidia_repo" else debian_archive(ver)
    return ubuntu_archive(branch, ver, REL[os_id]) if source == "distro" else nvidia_repo_ubuntu(branch, ver)


def name_of(os_id, branch, source, target):
    return f"{os_id}-{branch}-{source}-to-{target}".replace(".", "")


def branch_move_hosts():
    """A fake host at every starting point, to be moved to R580."""
    return [driver_host(name_of(*s), s[0], start_rows(*s[:3]), VERSIONS[s[1]],
                        vars={"nvidia_driver_source": s[3]}) for s in STARTS]


@pytest.fixture(scope="module")
def branch_moves():
    """Every starting point, moved to R580 in one run of a fleet of fake hosts."""
    return run_many(branch_move_hosts())


@pytest.mark.parametrize("os_id,branch,source,target", STARTS, ids=[name_of(*s) for s in STARTS])
def test_branch_move_to_r580(branch_moves, os_id, branch, source, target):
    rc, all_cmds, out = branch_moves
    cmds = all_cmds[f"@fake/{name_of(os_id, branch, source, target)}"]
    rows = start_rows(os_id, branch, source)
    pin, driver = TARGET[(os_id.split("-")[0], target)]
    held = sorted(n for n, _, h, purged in rows if h and purged)
    purged = [n for n, _, _, p in rows if p]
    hold = driver + (f" {pin}" if pin else "")
    expected = [STOP, *(["apt-mark unhold " + " ".join(held)] if held else []), APT + "purge " + " ".join(purged),
                *([APT_INSTALL + pin] if pin else []), APT_INSTALL + driver, "apt-mark hold " + hold, REBOOT]
    assert driver_steps(cmds) == expected, out[-3000:]
    # nothing of the old branch or the other source is installed again, and nvidia-smi was checked after the reboot
    assert not [c for c in cmds if c.startswith(APT_INSTALL) and str(branch) in c]
    assert cmds.index("systemctl start nvidia-persistenced.service") > cmds.index(REBOOT)
    assert not [c for c in cmds if "fabricmanager" in c]


def test_branch_moves_all_succeed(branch_moves):
    rc, cmds, out = branch_moves
    assert rc == 0, out[-3000:]
    assert len(cmds) == len(STARTS)


R580_ROWS = [("cuda-drivers-580", "{v}-0ubuntu1", True, False), ("libnvidia-compute-580", "{v}-0ubuntu1", False, False),
             ("nvidia-dkms-580", "{v}-0ubuntu1", True, False), ("nvidia-driver-580", "{v}-0ubuntu1", False, False),
             ("nvidia-driver-pinning-580", "{v}-1", True, False)]


def r580(v, held=True):
    return [(n, ver.format(v=v), h and held, p) for n, ver, h, p in R580_ROWS]


def candidate(version):
    return ["apt-cache policy cuda-drivers-580", f"cuda-drivers-580:\n  Installed: {version}\n  Candidate: {version}"]


def r580_hosts():
    """R580 hosts: converged (kept, latest, pinned), upgraded to latest, moved to a pinned release,
    a module older than the packages still loaded, an NVSwitch host, a host whose GPUs vanish
    after the reboot, a host missing a GPU (stopping, and serving degraded)."""
    lspci8 = "\n".join(f"0000:{b:02x}:00.0 3D controller [0302]: NVIDIA Corporation GV100GL [Tesla V100 SXM3 32GB] "
                       "[10de:1db8] (rev a1)" for b in (0x34, 0x36, 0x39, 0x3b, 0xb7, 0xb9, 0xbc, 0xbe))
    switches = "\n".join(f"0000:{b:02x}:00.0 Bridge [0680]: NVIDIA Corporation Device [10de:1ac2] (rev a1)"
                         for b in (0x5a, 0x5b, 0x5c, 0x5d, 0x5e, 0x5f))
    bus8 = "\n".join(f"00000000:{b:02X}:00.0" for b in (0x34, 0x36, 0x39, 0x3b, 0xb7, 0xb9, 0xbc, 0xbe))
    bus7 = "\n".join(bus8.split("\n")[:3] + bus8.split("\n")[4:])  # 0000:3b:00.0 gone
    hosts = [
        driver_host("kept", "ubuntu-24.04", r580("580.95.05"), "580.95.05"),
        driver_host("latest-current", "ubuntu-24.04", r580("580.95.05"), "580.95.05",
                    vars={"nvidia_driver_version": "latest"}, extra=[candidate("580.95.05-0ubuntu1")]),
        driver_host("latest-newer", "ubuntu-24.04", r580("580.82.07"), "580.82.07", after="580.95.05",
                    vars={"nvidia_driver_version": "latest"}, extra=[candidate("580.95.05-0ubuntu1")]),
        driver_host("pinned-same", "ubuntu-22.04", r580("580.95.05"), "580.95.05",
                    vars={"nvidia_driver_version": "580.95.05"}),
        driver_host("pinned-other", "ubuntu-22.04", r580("580.95.05"), "580.95.05", after="580.82.07",
                    vars={"nvidia_driver_version": "580.82.07"}),
        driver_host("pinned-not-reached", "ubuntu-22.04", r580("580.95.05"), "580.95.05", after="580.95.05",
                    vars={"nvidia_driver_version": "580.82.07"}),
        driver_host("stale-module", "ubuntu-24.04", r580("580.95.05"), "580.95.05", extra=[
            ["/proc/driver/nvidia/version", {"before": LOADED.format("580.82.07"), "after": LOADED.format("580.95.05")}]]),
        driver_host("unheld", "ubuntu-24.04", r580("580.95.05", held=False), "580.95.05"),
        driver_host("nvswitch", "ubuntu-22.04", nvidia_repo_ubuntu(535, VERSIONS[535]), VERSIONS[535],
                    pci=lspci8 + "\n" + switches, bus=bus8, n=8, vars={"nvidia_driver_source": "nvidia_repo"}),
        driver_host("nvswitch-debian", "debian-12", [], None, pci=lspci8 + "\n" + switches, bus=bus8, n=8),
        driver_host("nvswitch-archive", "ubuntu-24.04", [], None, pci=lspci8 + "\n" + switches, bus=bus8, n=8,
                    vars={"nvidia_driver_source": "distro"}),
        driver_host("gpus-vanish", "ubuntu-24.04", r580("580.82.07"), "580.82.07",
                    vars={"nvidia_driver_version": "latest"}, extra=[
                        candidate("580.95.05-0ubuntu1"),
                        ["nvidia-smi --query-gpu=index", {"before": smi("580.82.07"), "after": ""}],
                        ["dkms status", "dkms=nvidia/580.95.05, 6.8.0-45-generic, x86_64: added\n"
                                        "secureboot=SecureBoot enabled\nnouveau=\nnvidia_smi=NVIDIA-SMI has failed "
                                        "because it couldn't communicate with the NVIDIA driver."]]),
        driver_host("gpu-missing", "ubuntu-24.04", r580("580.95.05"), "580.95.05", pci=lspci8, bus=bus7, n=7),
        driver_host("gpu-missing-allowed", "ubuntu-24.04", r580("580.95.05"), "580.95.05", pci=lspci8, bus=bus7,
                    n=7, vars={"allow_degraded_gpus": True}),
    ]
    return hosts


@pytest.fixture(scope="module")
def r580_fleet():
    """The R580 hosts (r580_hosts) in one run."""
    return run_many(r580_hosts())


def cmds_of(fleet, name):
    return fleet[1][f"@fake/{name}"]


@pytest.mark.parametrize("name", ["kept", "latest-current", "pinned-same"])
def test_converged_host_gets_no_unhold_upgrade_or_reboot(r580_fleet, name):
    cmds = cmds_of(r580_fleet, name)
    assert driver_steps(cmds) == [], r580_fleet[2][-3000:]
    assert not [c for c in cmds if c.startswith(("update-initramfs", "apt-mark"))]


DRAIN = "echo voltafleet-test-drain-hook"


def test_drain_hook_runs_right_before_the_stop_and_only_when_the_driver_changes(r580_fleet):
    for name in ("latest-newer", "pinned-other", "stale-module", "nvswitch"):
        cmds = cmds_of(r580_fleet, name)
        assert cmds[cmds.index(DRAIN) + 1] == STOP, name
    for name in ("kept", "latest-current", "pinned-same", "unheld", "gpu-missing"):
        assert DRAIN not in cmds_of(r580_fleet, name), name


def test_latest_upgrades_within_the_branch_and_holds_again(r580_fleet):
    assert driver_steps(cmds_of(r580_fleet, "latest-newer")) == [
        STOP, "apt-mark unhold cuda-drivers-580 nvidia-dkms-580",
        APT_INSTALL + "cuda-drivers-580 nvidia-dkms-580 libnvidia-compute-580 nvidia-driver-580",
        "apt-mark hold cuda-drivers-580 nvidia-dkms-580 nvidia-driver-pinning-580", REBOOT]


def test_pinned_release_that_differs_is_installed_with_an_apt_pin(r580_fleet):
    cmds = cmds_of(r580_fleet, "pinned-other")
    assert driver_steps(cmds) == [
        STOP, "apt-mark unhold cuda-drivers-580 nvidia-dkms-580",
        APT_INSTALL + "--allow-downgrades cuda-drivers-580 nvidia-dkms-580 libnvidia-compute-580 nvidia-driver-580",
        "apt-mark hold cuda-drivers-580 nvidia-dkms-580 nvidia-driver-pinning-580", REBOOT]
    # the apt preferences file goes up before the install that needs it
    put = cmds.index("chmod 644 /etc/apt/preferences.d/voltafleet-nvidia-driver")
    assert put < cmds.index(STOP)


def test_pinned_release_not_reached_stops_the_host(r580_fleet):
    rc, _, out = r580_fleet
    assert rc != 0
    assert ("@fake/pinned-not-reached: nvidia-smi reports driver 580.95.05, nvidia_driver_version pins 580.82.07"
            in out)


def test_stale_module_reboots_without_touching_packages(r580_fleet):
    assert driver_steps(cmds_of(r580_fleet, "stale-module")) == [STOP, REBOOT]


def test_missing_holds_are_restored_without_a_reboot(r580_fleet):
    assert driver_steps(cmds_of(r580_fleet, "unheld")) == [
        "apt-mark hold cuda-drivers-580 nvidia-dkms-580 nvidia-driver-pinning-580"]


def test_nvswitch_host_gets_fabric_manager_of_the_driver_branch(r580_fleet):
    cmds = cmds_of(r580_fleet, "nvswitch")
    steps = driver_steps(cmds)
    assert APT_INSTALL + "cuda-drivers-580 nvidia-dkms-580 nvidia-fabricmanager-580" in steps
    assert "apt-mark hold cuda-drivers-580 nvidia-dkms-580 nvidia-fabricmanager-580 nvidia-driver-pinning-580" in steps
    assert cmds.index("systemctl enable nvidia-fabricmanager.service") > cmds.index(REBOOT)
    assert "systemctl start nvidia-fabricmanager.service" in cmds


@pytest.mark.parametrize("name,install,hold", [
    ("nvswitch-debian", "cuda-drivers nvidia-kernel-dkms nvidia-fabricmanager",
     "cuda-drivers nvidia-kernel-dkms nvidia-fabricmanager nvidia-driver-pinning-580"),
    ("nvswitch-archive", "nvidia-headless-580-server nvidia-utils-580-server nvidia-fabricmanager-580 libnvidia-nscq-580",
     "nvidia-headless-580-server nvidia-utils-580-server nvidia-fabricmanager-580 libnvidia-nscq-580"),
])
def test_nvswitch_fabric_manager_names_per_source(r580_fleet, name, install, hold):
    steps = driver_steps(cmds_of(r580_fleet, name))
    assert APT_INSTALL + install in steps, steps
    assert "apt-mark hold " + hold in steps


def test_hosts_without_nvswitch_get_no_fabric_manager(r580_fleet):
    for name in ("kept", "latest-newer", "pinned-other", "gpu-missing"):
        assert not [c for c in cmds_of(r580_fleet, name) if "fabricmanager" in c]


def test_host_whose_driver_sees_no_gpu_after_reboot_stops_with_what_to_check(r580_fleet):
    rc, _, out = r580_fleet
    cmds = cmds_of(r580_fleet, "gpus-vanish")
    assert REBOOT in cmds
    assert "@fake/gpus-vanish: nvidia-smi lists no GPU after the driver install and reboot" in out
    assert "dkms status: nvidia/580.95.05, 6.8.0-45-generic, x86_64: added" in out
    assert "mokutil --sb-state: SecureBoot enabled -> with Secure Boot enabled the unsigned module is refused" in out
    assert "lsmod | grep nouveau: (not loaded)" in out
    # the rest of the fleet went on: the other upgraded host finished its driver steps
    assert "systemctl start nvidia-persistenced.service" in cmds_of(r580_fleet, "latest-newer")


def test_missing_gpu_stops_the_host_naming_it(r580_fleet):
    rc, _, out = r580_fleet
    assert rc != 0
    assert ("@fake/gpu-missing: 1 of 8 GPUs on the PCI bus are missing from nvidia-smi: GPU 3 at PCI "
            "0000:3b:00.0 (nvidia-smi lists 7)") in out
    assert "set allow_degraded_gpus: true for this host to serve on the healthy GPUs" in out


def test_missing_gpu_allowed_serves_degraded_and_says_so(r580_fleet):
    _, _, out = r580_fleet
    assert ("@fake/gpu-missing-allowed: 1 of 8 GPUs on the PCI bus are missing from nvidia-smi: GPU 3 at PCI "
            "0000:3b:00.0 (nvidia-smi lists 7); serving on the 7 healthy GPU(s)") in out
    assert "@fake/gpu-missing-allowed: 1 of 8 GPUs" in out and \
        "gpu-missing-allowed: 1 of 8 GPUs on the PCI bus are missing from nvidia-smi: GPU 3 at PCI 0000:3b:00.0 " \
        "(nvidia-smi lists 7). The host is stopped" not in out


@pytest.mark.parametrize("vars,message", [
    ({"nvidia_driver_version": "575.64.05"},
     "nvidia_driver_version is 575.64.05, not a release of branch R580. Fix: set a 580.x version, or \"latest\""),
    ({"nvidia_driver_version": "580.95.05", "nvidia_driver_source": "distro"},
     "nvidia_driver_version is 580.95.05, but Ubuntu's archive keeps only the newest release of a branch. "
     "Fix: set nvidia_driver_version: latest, or nvidia_driver_source: nvidia_repo"),
])
def test_exact_version_that_cannot_be_installed_is_refused_before_any_change(vars, message):
    rc, cmds, out = run_many([driver_host("pinned-bad", "ubuntu-24.04", r580("580.95.05"), "580.95.05", vars=vars)])
    assert rc != 0
    assert f"@fake/pinned-bad: {message}" in out
    assert not [c for c in cmds["@fake/pinned-bad"] if c.startswith(("apt-get", "apt-mark", STOP, "DEBIAN"))]
