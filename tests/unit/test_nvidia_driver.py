"""Pure driver decisions (voltafleet/gpu/nvidia.py): which packages belong to which branch and
source, what a branch move purges, when an upgrade happens, fabric manager, missing GPUs."""
import pytest

from voltafleet.gpu import nvidia
from voltafleet.inputs.config import ConfigError, check_value


def pkg(name, version, held=False, status=None):
    return {"name": name, "version": version, "status": status or ("hi " if held else "ii ")}


R580 = [pkg("cuda-drivers-580", "580.95.05-0ubuntu1", True), pkg("nvidia-dkms-580", "580.95.05-0ubuntu1", True),
        pkg("nvidia-driver-pinning-580", "580.95.05-1", True), pkg("nvidia-driver-580", "580.95.05-0ubuntu1"),
        pkg("libnvidia-compute-580", "580.95.05-0ubuntu1")]


def plan(installed, target=None, os_id="ubuntu-24.04", source="nvidia_repo", **kw):
    return nvidia.driver_plan(os_id, source, 580, "proprietary", target, installed, **kw)


@pytest.mark.parametrize("name,version,branch,source", [
    ("nvidia-headless-535-server", "535.230.02-0ubuntu0.22.04.1", 535, "distro"),
    ("linux-modules-nvidia-550-server-generic", "6.8.0-45.45", 550, "distro"),
    ("nvidia-fabricmanager-535", "535.230.02-0ubuntu0.24.04.1", 535, "distro"),
    ("cuda-drivers-570", "570.172.08-1", 570, "nvidia_repo"),
    ("nvidia-dkms-570", "570.172.08-0ubuntu1", 570, "nvidia_repo"),
    ("libnvidia-cfg1-580", "580.95.05-0ubuntu1", 580, "nvidia_repo"),
    ("nvidia-kernel-dkms", "570.172.08-1", 570, "nvidia_repo"),  # Debian, NVIDIA's repo: branch from the version
    ("nvidia-kernel-dkms", "535.216.01-1~deb12u1", 535, "distro"),  # Debian's own archive
    ("nvidia-driver-pinning-570", "570.172.08-1", 570, "nvidia_repo"),
])
def test_branch_and_source_of_a_package(name, version, branch, source):
    assert nvidia.package_branch(name, version) == branch
    assert nvidia.package_source(name, version) == source


def test_driver_set_leaves_out_what_is_not_the_driver():
    found = nvidia.driver_set([
        pkg("nvidia-container-toolkit", "1.17.8-1"), pkg("nvidia-settings", "510.47.03-0ubuntu4"),
        pkg("nvidia-cuda-toolkit", "12.0.140~12.0.1-4build4"), pkg("nvidia-kernel-common", "20151021+13"),
        pkg("nvidia-prime", "0.8.17.2"), pkg("nvidia-dkms-535", "535.230.02-0ubuntu1", status="rc "),
        pkg("nvidia-dkms-580", "580.95.05-0ubuntu1", held=True)])
    assert [(p["name"], p["branch"], p["held"]) for p in found] == [("nvidia-dkms-580", 580, True)]


def test_converged_host_changes_nothing():
    p = plan(R580, loaded="580.95.05")
    assert (p["change"], p["reboot"], p["purge"], p["install"], p["hold"], p["unhold"]) == \
        (False, False, [], [], [], [])


def test_converged_host_with_a_hold_lost_only_holds_again():
    p = plan([{**r, "status": "ii "} for r in R580], loaded="580.95.05")
    assert not p["reboot"] and p["install"] == []
    assert p["hold"] == ["cuda-drivers-580", "nvidia-dkms-580", "nvidia-driver-pinning-580"]


def test_latest_upgrades_every_kept_package_when_a_newer_release_is_there():
    old = [{**r, "version": r["version"].replace("580.95.05", "580.82.07")} for r in R580]
    p = plan(old, "latest", candidate="580.95.05-0ubuntu1", loaded="580.82.07")
    assert p["change"] and p["reboot"] and not p["downgrade"]
    assert p["install"] == ["cuda-drivers-580", "nvidia-dkms-580", "libnvidia-compute-580", "nvidia-driver-580"]
    assert p["unhold"] == ["cuda-drivers-580", "nvidia-dkms-580"]
    assert "580.82.07 -> 580.95.05" in p["why"]


def test_latest_when_already_newest_is_converged():
    assert not plan(R580, "latest", candidate="580.95.05-0ubuntu1", loaded="580.95.05")["reboot"]


def test_pinned_version_that_differs_moves_with_downgrades_allowed():
    p = plan(R580, "580.82.07", loaded="580.95.05")
    assert p["change"] and p["downgrade"] and "580.95.05 -> 580.82.07" in p["why"]
    assert plan(R580, "580.95.05", loaded="580.95.05")["change"] is False


def test_a_module_older_than_the_packages_still_loaded_means_reboot_only():
    p = plan(R580, loaded="580.82.07")
    assert p["reboot"] and not p["change"] and p["install"] == [] and p["purge"] == []


def test_installed_driver_with_no_module_loaded_is_rebooted_again():
    # the DKMS build failed on the last run and was fixed since: the packages are right, no module runs
    p = plan(R580, loaded=None)
    assert p["reboot"] and not p["change"] and "the loaded module is none" in p["why"]


def test_branch_move_purges_the_other_branch_and_the_other_source():
    installed = [pkg("nvidia-headless-535-server", "535.230.02-0ubuntu0.24.04.1", True),
                 pkg("nvidia-utils-535-server", "535.230.02-0ubuntu0.24.04.1", True),
                 pkg("cuda-drivers-570", "570.172.08-1"),  # NVIDIA's repo, another branch
                 pkg("nvidia-headless-580-server", "580.95.05-0ubuntu0.24.04.1"),  # right branch, other source
                 pkg("nvidia-container-toolkit", "1.17.8-1")]
    p = plan(installed)
    assert p["purge"] == ["nvidia-headless-535-server", "nvidia-utils-535-server", "cuda-drivers-570",
                          "nvidia-headless-580-server"]
    assert p["unhold"] == ["nvidia-headless-535-server", "nvidia-utils-535-server"]
    assert p["pin"] == "nvidia-driver-pinning-580"
    assert p["install"] == ["cuda-drivers-580", "nvidia-dkms-580"] and p["reboot"]


def test_fresh_host_installs_the_branch():
    p = plan([], os_id="debian-12")
    assert (p["purge"], p["pin"], p["install"]) == ([], "nvidia-driver-pinning-580", ["cuda-drivers", "nvidia-kernel-dkms"])


@pytest.mark.parametrize("os_id,source,names", [
    ("ubuntu-22.04", "nvidia_repo", ["nvidia-fabricmanager-580"]),
    ("debian-12", "nvidia_repo", ["nvidia-fabricmanager"]),
    ("ubuntu-24.04", "distro", ["nvidia-fabricmanager-580", "libnvidia-nscq-580"]),
])
def test_fabric_manager_goes_with_the_driver_on_nvswitch_hosts_only(os_id, source, names):
    with_switch = nvidia.driver_plan(os_id, source, 580, "proprietary", None, [], nvswitch=True)
    without = nvidia.driver_plan(os_id, source, 580, "proprietary", None, [], nvswitch=False)
    assert with_switch["install"][-len(names):] == names and set(names) <= set(with_switch["hold"])
    assert not [n for n in without["install"] + without["hold"] if "fabricmanager" in n or "nscq" in n]


def test_fabric_manager_of_another_version_is_upgraded_with_the_driver():
    installed = R580 + [pkg("nvidia-fabricmanager-580", "580.82.07-1", True)]
    p = plan(installed, "580.95.05", nvswitch=True)
    assert p["change"] and "nvidia-fabricmanager-580" in p["install"] and "nvidia-fabricmanager-580" in p["unhold"]


def test_nvswitches_are_the_bridge_class_functions():
    lines = ["0000:34:00.0 3D controller [0302]: NVIDIA Corporation GV100GL [Tesla V100 SXM3 32GB] [10de:1db8] (rev a1)",
             "0000:5a:00.0 Bridge [0680]: NVIDIA Corporation Device [10de:1ac2] (rev a1)",
             "0000:34:00.1 Audio device [0403]: NVIDIA Corporation Device [10de:10f2] (rev a1)"]
    assert nvidia.nvswitches(lines) == ["0000:5a:00.0"]
    assert nvidia.nvswitches(lines[:1]) == []


LSPCI8 = [f"0000:{b}:00.0 3D controller [0302]: NVIDIA Corporation GV100GL [Tesla V100 SXM2 16GB] [10de:1db1]"
          for b in ("06", "07", "0a", "0b", "85", "86", "89", "8a")]
BUS8 = [f"00000000:{b.upper()}:00.0" for b in ("06", "07", "0a", "0b", "85", "86", "89", "8a")]


def test_all_gpus_present_is_healthy():
    assert nvidia.gpu_health("h", LSPCI8, BUS8, False) == {"missing": [], "error": None, "warning": None}


def test_missing_gpu_stops_the_host_naming_it():
    h = nvidia.gpu_health("gpu16-01", LSPCI8, BUS8[:3] + BUS8[4:], False)
    assert h["missing"] == [{"pci": "0000:0b:00.0", "position": 3, "of": 8}]
    assert h["error"].startswith("gpu16-01: 1 of 8 GPUs on the PCI bus are missing from nvidia-smi: GPU 3 at PCI "
                                 "0000:0b:00.0 (nvidia-smi lists 7). The host is stopped")
    assert "allow_degraded_gpus: true" in h["error"] and h["warning"] is None


def test_missing_gpu_allowed_serves_on_the_healthy_ones():
    h = nvidia.gpu_health("gpu16-01", LSPCI8, BUS8[1:], True)
    assert h["error"] is None and "GPU 0 at PCI 0000:06:00.0" in h["warning"]
    assert "serving on the 7 healthy GPU(s)" in h["warning"]


def test_no_gpu_error_says_what_to_check():
    text = nvidia.no_gpu_error("gpu16-02", {"dkms": "", "secureboot": "SecureBoot enabled", "nouveau": "nouveau"})
    assert text.startswith("gpu16-02: nvidia-smi lists no GPU after the driver install and reboot")
    assert "dkms status: (nothing: the kernel module was not built)" in text
    assert "mokutil --sb-state: SecureBoot enabled" in text and "lsmod | grep nouveau: nouveau" in text
    assert "lsmod | grep nouveau: (not loaded)" in nvidia.no_gpu_error("h", None)


def test_preferences_pin_one_release_only_when_asked():
    assert nvidia.driver_preferences(580, None) is None and nvidia.driver_preferences(580, "latest") is None
    text = nvidia.driver_preferences(580, "580.95.05")
    assert "Pin: version 580.95.05-*\nPin-Priority: 1001" in text and "cuda-drivers*" in text


def test_version_refusals(cfg):
    assert nvidia.version_refusals("h", cfg.replace(nvidia_driver_version="latest")) == []
    assert nvidia.version_refusals("h", cfg.replace(nvidia_driver_version="580.95.05")) == []
    [err] = nvidia.version_refusals("h", cfg.replace(nvidia_driver_version="590.44.01"))
    assert err.startswith("h: nvidia_driver_version is 590.44.01, not a release of branch R580")
    [err] = nvidia.version_refusals("h", cfg.replace(nvidia_driver_version="580.95.05", nvidia_driver_source="distro"))
    assert "Ubuntu's archive keeps only the newest release" in err
    assert nvidia.version_refusals("h", cfg.replace(nvidia_driver_version="575.1", manage_driver=False)) == []


@pytest.mark.parametrize("value,ok", [(None, True), ("latest", True), ("580.95.05", True), ("580.95", True),
                                      ("580", False), ("newest", False), (580.95, False)])
def test_nvidia_driver_version_schema(value, ok):
    if ok:
        check_value("nvidia_driver_version", value, "group_vars/all.yml")
    else:
        with pytest.raises(ConfigError, match=r"(?s)nvidia_driver_version: is .*Fix: give"):
            check_value("nvidia_driver_version", value, "group_vars/all.yml")


