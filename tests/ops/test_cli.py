"""What a user sees from the real CLI, `pyinfra --debug -y tests/ops/inventory.py
tests/ops/toolchain_deploy.py`, on the fake connector: one subprocess run per behaviour, the
scenarios that can share a run batched into it.

+ a bad value: refused when the inventory loads, exit code 2, one block, no traceback, no
  command on any host (tests/ops/test_inputs.py has every bad value, in process);
+ a host refused by preflight: exit code 1, the refusal printed, nothing changed on any host
  of the fleet (tests/ops/test_toolchain.py, test_gpu_health.py and test_vram_refusal.py have
  every refusal, in process);
+ hosts failing at execution (GPUs gone after the reboot, a missing GPU, a pinned release not
  reached): exit code 1, each failure printed, the other hosts go on (test_driver_upgrade.py's
  R580 fleet, which checks every host's commands in process);
+ a fleet that converges (branch moves with their reboots, a driver install, GPU health
  warnings): exit code 0, the warnings printed.

Every other scenario runs in process (tests/ops/harness.py). It stands for the CLI only as
long as both agree: each CLI run here is run in process too, and must give the same exit
code, the same commands to every host (the CLI's log shows a command's first line) and the
same messages about each host.
"""
import re

import pytest

from tests.ops.test_driver_upgrade import branch_move_hosts, r580_hosts
from tests.ops.test_gpu_health import WARNED, healthy_and_warned_hosts
from tests.ops.test_inputs import CANARY
from tests.ops.test_toolchain import changes, cli_run_many, host, run_many

HOST_LINE = re.compile(r"@fake/[\w.-]+: ")


def host_messages(out):
    """The lines that say something about a host: refusals, warnings, failures, driver notes.
    Not the debug trace of the commands sent, nor the `-->` line of the error that stopped the
    run (which of several failing hosts that names is the order of a set, in pyinfra)."""
    return {line.strip() for line in out.splitlines()
            if HOST_LINE.search(line) and "simulating command on" not in line and "-->" not in line}


def both(hosts):
    """The hosts through the CLI, and in process: (cli, in_process), each (rc, cmds, out)."""
    return cli_run_many(hosts), run_many(hosts)


def assert_same_run(cli, in_process):
    assert in_process[0] == cli[0], (cli[2][-3000:], in_process[2][-3000:])
    assert {h: [c.split("\n")[0] for c in cmds] for h, cmds in in_process[1].items()} == cli[1]
    assert host_messages(in_process[2]) == host_messages(cli[2])


# ---------------------------------------------------------------- a bad value: exit code 2


@pytest.fixture(scope="module")
def bad_input():
    CANARY.unlink(missing_ok=True)
    runs = both([host("v100-noble"), host("bad-input", vars={"model_url": f"http://127.0.0.1:9/models/`touch {CANARY}`.gguf"})])
    yield runs
    CANARY.unlink(missing_ok=True)


def test_cli_refuses_a_bad_value_when_the_inventory_loads(bad_input):
    (rc, cmds, out), _ = bad_input
    assert rc == 2, out
    assert "configuration refused, no host was touched" in out
    assert "tests/ops/inventory.py (host @fake/bad-input): model_url: is" in out
    assert "\n  Fix: " in out and "Traceback" not in out
    assert cmds == {"@fake/v100-noble": [], "@fake/bad-input": []}  # no host of the fleet was touched
    assert not CANARY.exists(), "a value ran as a command on the controller"


def test_cli_and_harness_agree_on_a_bad_value(bad_input):
    assert_same_run(*bad_input)


# ---------------------------------------------------------------- a preflight refusal: exit code 1


VOLTA_CUDA13 = ("cuda_toolkit_version is 13.0, but the host has Tesla V100-SXM2-16GB (compute capability 7.0): CUDA 13 "
                "removed Volta support and nvcc 13 cannot build sm_70. Fix: set cuda_toolkit_version: \"12.8\"")


@pytest.fixture(scope="module")
def refused():
    """A host preflight refuses, beside one it would pass."""
    return both([host("v100-noble"), host("v100-refused", vars={"cuda_toolkit_version": "13.0"})])


def test_cli_preflight_refusal_exits_1_before_any_host_changes(refused):
    (rc, cmds, out), _ = refused
    assert rc == 1, out
    assert "preflight refused the rollout, nothing was changed" in out
    assert f"@fake/v100-refused: {VOLTA_CUDA13}" in out
    assert "Traceback" not in out
    assert cmds["@fake/v100-refused"] and cmds["@fake/v100-noble"]  # the facts were read on both
    assert changes(cmds["@fake/v100-refused"]) == [] and changes(cmds["@fake/v100-noble"]) == []


def test_cli_and_harness_agree_on_a_refusal(refused):
    assert_same_run(*refused)


# ---------------------------------------------------------------- failures at execution: exit code 1


@pytest.fixture(scope="module")
def r580():
    return both(r580_hosts())


def test_cli_execution_failures_exit_1_and_name_each_host(r580):
    (rc, cmds, out), _ = r580
    assert rc == 1, out[-3000:]
    assert ("@fake/pinned-not-reached: nvidia-smi reports driver 580.95.05, nvidia_driver_version pins 580.82.07"
            in out)
    assert "@fake/gpus-vanish: nvidia-smi lists no GPU after the driver install and reboot" in out
    assert "mokutil --sb-state: SecureBoot enabled -> with Secure Boot enabled the unsigned module is refused" in out
    assert ("@fake/gpu-missing: 1 of 8 GPUs on the PCI bus are missing from nvidia-smi: GPU 3 at PCI "
            "0000:3b:00.0 (nvidia-smi lists 7)") in out
    assert ("@fake/gpu-missing-allowed: 1 of 8 GPUs on the PCI bus are missing from nvidia-smi: GPU 3 at PCI "
            "0000:3b:00.0 (nvidia-smi lists 7); serving on the 7 healthy GPU(s)") in out
    # the rest of the fleet went on: rebooted into the new driver and started its daemons
    for name in ("latest-newer", "pinned-other", "nvswitch"):
        assert "systemctl start nvidia-persistenced.service" in cmds[f"@fake/{name}"], name
    assert "systemctl start nvidia-fabricmanager.service" in cmds["@fake/nvswitch"]


def test_cli_and_harness_agree_on_execution_failures(r580):
    assert_same_run(*r580)


# ---------------------------------------------------------------- a converging fleet: exit code 0


@pytest.fixture(scope="module")
def converging():
    """Every branch move, a driver install on a bare R580-less host, GPU health warnings."""
    return both([*branch_move_hosts(), host("v100-noble"), *healthy_and_warned_hosts()])


def test_cli_converging_fleet_exits_0_and_prints_the_warnings(converging):
    (rc, cmds, out), _ = converging
    assert rc == 0, out[-3000:]
    assert len(cmds) == len(branch_move_hosts()) + 1 + 1 + len(WARNED)
    for name, (_, line) in WARNED.items():
        assert line in out
        assert changes(cmds[f"@fake/{name}"])  # the rollout went on
    assert "@fake/v100-healthy: GPU" not in out
    rebooted = [h for h, c in cmds.items() if "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &" in c]
    assert len(rebooted) == len(branch_move_hosts()) + 1  # every branch move and the driver install
    for h in rebooted:  # and each came back to its persistence daemon
        assert cmds[h].index("systemctl start nvidia-persistenced.service") > \
            cmds[h].index("( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &"), h


def test_cli_and_harness_agree_on_a_converging_fleet(converging):
    assert_same_run(*converging)
