"""GPU health of V100 boards: the GpuHealth fact on real public `nvidia-smi -q` outputs
(tests/fixtures/gpu/, each naming its source), its command run by a real shell, and
preflight on pyinfra's fake connector (in process, tests/ops/harness.py): each sick board
refused or warned, naming the GPU (index, PCI address, serial) and the fix, before anything
changes; a healthy 8-GPU host passes."""
import os
import subprocess

import pytest

from roles.facts import GpuHealth
from tests import gpu_fixtures as G
from tests.ops.test_toolchain import changes, host, run_many
from voltafleet.gpu import gpuhealth


def fact(query, **kw):
    return GpuHealth().process(G.fact_output(query, **kw).splitlines())


def test_pcie_32gb_under_load_reads_every_record():
    [g] = fact(G.PCIE_32)["gpus"]
    assert g == {
        "index": 0, "pci": "0000:18:00.0", "name": "Tesla V100-PCIE-32GB", "serial": "032161808xxxx",
        "uuid": "GPU-4965xxxx-79e3-7941-12cb-1dfe9c53xxxx", "ecc_mode": "Enabled",
        "ecc": {"volatile_sbe": 0, "volatile_dbe": 0, "aggregate_sbe": 0, "aggregate_dbe": 0},
        "retired": {"sbe": 0, "dbe": 0, "pending": False}, "pstate": "P0", "throttle": [],
        "clocks": {"sm": 1380, "mem": 877, "sm_max": 1380}, "temperature": {"gpu": 40, "slowdown": 87},
        "power": {"draw": 58.81, "limit": 250.0}, "pcie": {"gen": 3, "gen_max": 3, "width": 16, "width_max": 16}}


def test_sxm2_32gb_idle_power9_board(cfg):
    health = fact(G.SXM2_32)
    [g] = health["gpus"]
    assert (g["pci"], g["serial"], g["throttle"], g["clocks"]["sm"], g["pcie"]) == (
        "0004:04:00.0", "0561519020531", ["idle"], 135, {"gen": 3, "gen_max": 3, "width": 2, "width_max": 16})
    refusals, warnings = gpuhealth.judge("p9", cfg, health)
    assert refusals == ["p9: GPU 0 (0004:04:00.0, serial 0561519020531): its PCIe link is x2 of x16. Fix: reseat "
                        "the board or its riser; or set gpu_refuse_pcie_downtrained: false where a narrow link is by design."]
    assert warnings == []  # idle is not a slowdown
    assert gpuhealth.judge("p9", cfg.replace(gpu_refuse_pcie_downtrained=False), health) == ([], [])


@pytest.mark.parametrize("name,serial,pci", [("SXM2_16_HEAD", "0322817061565", "0000:00:1e.0"),
                                             ("PCIE_16_HEAD", "0320118119095", "0000:00:07.0")])
def test_16gb_outputs_without_health_sections_are_refused_not_passed(cfg, name, serial, pci):
    health = fact(getattr(G, name))
    [g] = health["gpus"]
    assert (g["serial"], g["pci"], g["retired"], g["ecc"]["volatile_dbe"], g["pcie"]) == (serial, pci, None, None, None)
    refusals, warnings = gpuhealth.judge("h", cfg, health)
    who = f"h: GPU 0 ({pci}, serial {serial}): "
    assert [r.split(". Fix:")[0] for r in refusals] == [
        who + "nvidia-smi -q has no page-retirement record (Retired Pages / Pending)",
        who + "nvidia-smi -q has no uncorrectable (double-bit) ECC count",
        who + "nvidia-smi -q has no PCIe link record"]
    assert warnings == [who + "nvidia-smi -q has no throttle record"]


def test_nvlink_and_xid_lines():
    assert gpuhealth.parse_nvlink(G.NVLINK.splitlines()) == {0: {"replay": 0, "recovery": 0, "crc": 0},
                                                              1: {"replay": 0, "recovery": 0, "crc": 0}}
    bad = G.derive(G.NVLINK, {"Link 4: CRC Errors: 0": "Link 4: CRC Errors: 17",
                              "Link 5: Replay Errors: 0": "Link 5: Replay Errors: 3"})
    assert gpuhealth.parse_nvlink(bad.splitlines())[0] == {"replay": 3, "recovery": 0, "crc": 17}
    assert [(x["pci"], x["xid"]) for x in gpuhealth.parse_xids(G.XIDS.splitlines())] == [
        ("0000:07:00", 48), ("0000:44:00", 79), ("0000:dc:00", 45)]


def test_a_host_without_nvidia_tools_gives_a_clear_error(cfg):
    health = GpuHealth().process([gpuhealth.NO_SMI])
    assert health["error"] == "nvidia-smi is not installed (no NVIDIA driver tools on this host)"
    assert gpuhealth.judge("cpu-box", cfg, health) == ([
        "cpu-box: the GPUs' health could not be read: nvidia-smi is not installed (no NVIDIA driver tools on this "
        "host). Fix: install or repair the NVIDIA driver (nvidia-smi -q must answer) before serving."], [])
    assert GpuHealth.default()["error"] == "nvidia-smi -q listed no GPU (it printed: nothing)"


def test_the_fact_command_in_a_real_shell(tmp_path):
    """The fact's own shell line, run by bash with nvidia-smi and journalctl stubs that print
    the fixtures: what it prints parses to the same GPUs, NVLink counters and Xids."""
    (tmp_path / "q").write_text(G.host_query(2))
    (tmp_path / "nv").write_text(G.NVLINK)
    (tmp_path / "log").write_text("kernel: usb 1-1: new device\n" + G.XIDS)
    G.stub_tool(tmp_path, "nvidia-smi", f'[ "$1" = -q ] && exec cat {tmp_path}/q; [ "$1" = nvlink ] && exec cat {tmp_path}/nv\n')
    G.stub_tool(tmp_path, "journalctl", f"exec cat {tmp_path}/log\n")
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}
    out = subprocess.run(["/bin/bash", "-c", GpuHealth().command()], capture_output=True, text=True, env=env, check=True)
    health = GpuHealth().process(out.stdout.splitlines())
    assert [g["serial"] for g in health["gpus"]] == ["0321618080000", "0321618080001"]
    assert health["xid_source"] == "journal" and [x["xid"] for x in health["xids"]] == [48, 79, 45]
    assert sorted(health["nvlink"]) == [0, 1]
    (tmp_path / "empty").mkdir()
    no_smi = subprocess.run(["/bin/bash", "-c", GpuHealth().command()], capture_output=True, text=True,
                            env={**os.environ, "PATH": str(tmp_path / "empty")}, check=True)
    assert GpuHealth().process(no_smi.stdout.splitlines())["error"].startswith("nvidia-smi is not installed")


# ---------------------------------------------------------------- preflight on the fake connector

SICK = {  # host: (the GpuHealth answer, the refusal it must print)
    "v100-pending": ('@gpu:{"n": 8, "sick": {"3": "PENDING"}}',
                     "GPU 3 (0000:af:00.0, serial 0321618080003): a retired page is pending (2 single-bit, 1 "
                     "double-bit pages retired): the page stays in use until the GPU is reset. Fix: drain the host "
                     "and reset the GPU (nvidia-smi -r -i 3) or reboot it, then roll out again."),
    "v100-dbe": ('@gpu:{"n": 8, "sick": {"5": "DBE"}}',
                 "GPU 5 (0000:3c:00.0, serial 0321618080005): 1 uncorrectable (double-bit) ECC error(s) since the "
                 "driver loaded. Fix: reboot or reset the GPU so the page retires; if they come back, replace the board."),
    "v100-narrow": ('@gpu:{"n": 8, "sick": {"1": "NARROW"}}',
                    "GPU 1 (0000:3b:00.0, serial 0321618080001): its PCIe link is x8 of x16. Fix: reseat the board"),
    "v100-gen1": ('@gpu:{"n": 8, "sick": {"6": "SLOW_GEN"}}',
                  "GPU 6 (0000:87:00.0, serial 0321618080006): its PCIe link runs at gen 1 of 3 under P0."),
    "v100-xid": ('@gpu:{"n": 8, "xids": true}', "the GPU at 0000:44:00 (not listed by nvidia-smi): Xid 79 since boot: GPU has fallen off "
                             "the bus. Fix: drain the host and reboot it"),
    "v100-driver-gone": ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
                         "that the latest NVIDIA driver is installed and running.",
                         "the GPUs' health could not be read: nvidia-smi -q listed no GPU (it printed: NVIDIA-SMI has "
                         "failed because it couldn't communicate with the NVIDIA driver."),
}
WARNED = {
    "v100-thermal": ('@gpu:{"n": 8, "sick": {"2": "THERMAL"}}',
                     "warning: @fake/v100-thermal: GPU 2 (0000:86:00.0, serial 0321618080002): throttled now: "
                     "thermal slowdown at 88 C"),
    "v100-powercap": ('@gpu:{"n": 8, "sick": {"4": "POWER_CAP"}}',
                      "warning: @fake/v100-powercap: GPU 4 (0000:19:00.0, serial 0321618080004): throttled now: power cap"),
    "v100-pages": ('@gpu:{"n": 8, "sick": {"7": "NEAR_LIMIT"}}',
                   "warning: @fake/v100-pages: GPU 7 (0000:b0:00.0, serial 0321618080007): 54 pages retired of the "
                   "64 a V100 can retire: plan its replacement (gpu_retired_pages_warn)"),
}
V100x8 = "\n".join(f"{i}, Tesla V100-PCIE-32GB, 7.0, 32768, 580.95.05" for i in range(8))


@pytest.mark.parametrize("name", sorted(SICK))
def test_each_sick_board_is_refused_before_any_change(name):
    """One pyinfra run per host: pyinfra stops at the first host whose deploy code raises."""
    rc, cmds, out = run_many([host(name, smi=V100x8, extra=[["nvidia-smi -q", SICK[name][0]]])])
    assert rc != 0
    assert "preflight refused the rollout, nothing was changed" in out
    assert f"@fake/{name}: {SICK[name][1]}" in out
    assert changes(cmds[f"@fake/{name}"]) == []


def healthy_and_warned_hosts():
    """A healthy 8-GPU host and one host per WARNED board."""
    unmanaged = {"manage_driver": False}  # R580 already there: no driver install and reboot to wait for
    hosts = [host("v100-healthy", smi=V100x8, vars=unmanaged, extra=[["nvidia-smi -q", '@gpu:{"n": 8, "nvlink": true}']])]
    hosts += [host(name, smi=V100x8, vars=unmanaged, extra=[["nvidia-smi -q", answer]])
              for name, (answer, _) in WARNED.items()]
    return hosts


def test_a_healthy_8_gpu_host_passes_and_warnings_do_not_stop():
    rc, cmds, out = run_many(healthy_and_warned_hosts())
    assert rc == 0, out[-3000:]
    for name, (_, line) in WARNED.items():
        assert line in out
        assert changes(cmds[f"@fake/{name}"])  # the rollout went on
    assert "@fake/v100-healthy: GPU" not in out  # no refusal, no warning for the healthy host
    assert len(changes(cmds["@fake/v100-healthy"])) == len(changes(cmds["@fake/v100-thermal"]))
