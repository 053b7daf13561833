"""lab up after a container died before its network went: the host side of its veth pair (vb-NAME) is left,
and systemd-nspawn refuses the next boot ("Failed to add new veth interfaces: File exists"). These run the real
`ip` on this machine (root, as CI is) with a veth pair of a name no lab host takes."""
import subprocess

import pytest

from lab import fleet

NAME = "vf-lab-zz"  # no lab host is named this
LINK = f"vb-{NAME}"


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


@pytest.fixture
def stale_link():
    subprocess.run(["ip", "link", "add", LINK, "type", "veth", "peer", "name", "vf-zz-peer"], check=True)
    yield LINK
    if link_exists(LINK):
        subprocess.run(["ip", "link", "del", LINK], check=True)


def test_a_stale_link_is_removed_before_its_container_boots(stale_link):
    assert link_exists(stale_link)
    fleet.clear_stale_link(NAME)
    assert not link_exists(stale_link)
    assert not link_exists("vf-zz-peer")  # its peer goes with it


def test_no_link_leaves_the_machine_as_it_was():
    before = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, check=True).stdout
    fleet.clear_stale_link(NAME)
    assert subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, check=True).stdout == before


def test_a_running_container_of_that_name_keeps_its_link(stale_link):
    # a real process whose command line reads as that container's systemd-nspawn
    impostor = subprocess.Popen(["bash", "-c", f'exec -a "systemd-nspawn -D rootfs --boot -M {NAME} --keep-unit" sleep 60'])
    try:
        fleet.wait_for(lambda: subprocess.run(["pgrep", "-f", f"systemd-nspawn .*-M {NAME} "], capture_output=True).returncode == 0,
                       10, "the impostor")
        with pytest.raises(SystemExit, match=rf"container {NAME} already runs .*pid {impostor.pid}\).*kill that pid"):
            fleet.clear_stale_link(NAME)
        assert link_exists(stale_link)
    finally:
        impostor.kill()
        impostor.wait()
