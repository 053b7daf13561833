"""The smoke client's GPU samples (nvidia-smi --query-gpu during the measurement), the
verdict naming a throttle reason when tok/s is under its floor, and the per-GPU gauges of
the textfile; and the GPU health verdict's rules beyond the preflight cases."""
import json
import subprocess

import pytest

from tests import gpu_fixtures as G
from tests.unit.test_smoke import inst
from voltafleet.gpu import gpuhealth
from voltafleet.hostside import smoke_client
from voltafleet.measure import smoke
from voltafleet.inputs.config import ConfigError, validate_values

# One --query-gpu line per GPU as R580 prints it: index, serial, clocks.sm, clocks.mem,
# temperature.gpu, power.draw, clocks_event_reasons.active (NVML's bitmask).
BUSY = "3, 0323817105647, 1530, 877, 61, 251.37, 0x0000000000000000"
HOT = "3, 0323817105647, 1020, 877, 88, 180.02, 0x0000000000000068"   # sw + hw thermal, hw slowdown
IDLE = "3, 0323817105647, 135, 877, 38, 39.78, 0x0000000000000001"


def test_sample_lines_and_the_summary_under_load():
    rows = [smoke_client.parse_gpu_sample(line, t) for t, line in enumerate([IDLE, BUSY, HOT, BUSY])]
    assert rows[2]["reasons"] == ["hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown"]
    assert smoke_client.parse_gpu_sample("3, 0323817105647, [N/A], 877, 40, [N/A], 0x0")["sm"] is None
    assert smoke_client.parse_gpu_sample("Failed to initialize NVML: Driver/library version mismatch") is None
    g = smoke_client.gpu_summary(rows, 3)
    assert g == {"index": 3, "serial": "0323817105647", "samples": 4, "sm_clock_mhz": 1360.0, "sm_clock_min_mhz": 1020.0,
                 "mem_clock_mhz": 877.0, "power_w": 227.6, "power_max_w": 251.37, "temperature_max_c": 88.0,
                 "reasons": ["hw_slowdown", "hw_thermal_slowdown", "idle", "sw_thermal_slowdown"]}
    assert smoke_client.gpu_summary(rows, 0) is None


def test_sampler_runs_nvidia_smi_and_falls_back_to_the_older_field_name(tmp_path, monkeypatch):
    """A driver older than R535 knows only clocks_throttle_reasons.active."""
    G.stub_tool(tmp_path, "nvidia-smi", 'case "$1" in *clocks_event_reasons*) echo "Field is not a valid field to query." >&2; '
                        f'exit 2;; esac; echo "{HOT}"\n')
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    s = smoke_client.GpuSampler(0.05)
    s.sample()
    s.sample()
    assert s.fields == ["clocks_throttle_reasons.active"]
    assert [(r["index"], r["sm"], r["temp"]) for r in s.samples] == [(3, 1020.0, 88.0)] * 2
    s.start()
    s.stopped.wait(0.3)
    s.stopped.set()
    s.join(2)
    assert len(s.samples) > 2  # the thread kept sampling until stopped


def test_the_client_records_no_gpu_without_nvidia_smi():
    """A CPU lab host (no nvidia-smi on PATH): the client runs as on the host, records no "gpu"."""
    out = subprocess.run(["/usr/bin/env", "python3", smoke_client.__file__, "--port", "9", "--health-timeout", "0"],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=60)
    report = json.loads(out.stdout)
    assert report["instances"][0]["error"].startswith("TimeoutError") and "gpu" not in report["instances"][0]


def test_slow_tok_s_names_the_throttle_reason(cfg):
    g = smoke_client.gpu_summary([smoke_client.parse_gpu_sample(HOT)], 3)
    fails = smoke.verdict({"instances": [inst(instance=3, port=8083, single_tps=10.0, gpu=g)]}, cfg)
    assert fails == ["instance 3 (port 8083): single-stream 10.0 tok/s < 15: GPU 3 thermal slowdown "
                     "(88 C, SM 1020 MHz, 180 W)"]
    cool = smoke_client.gpu_summary([smoke_client.parse_gpu_sample(BUSY)], 3)
    assert smoke.verdict({"instances": [inst(single_tps=10.0, gpu=cool)]}, cfg) == [
        "instance 0 (port 8080): single-stream 10.0 tok/s < 15"]  # slow, but not throttled: says only that
    assert smoke.verdict({"instances": [inst(gpu=g)]}, cfg) == []  # throttled but fast enough: passes


def test_textfile_has_per_gpu_gauges_labelled_by_index_and_serial(cfg):
    health = gpuhealth.summary("gpu-01", cfg, G.health(G.host_query(2, sick={1: G.PENDING}), nvlink=G.NVLINK))
    g = smoke_client.gpu_summary([smoke_client.parse_gpu_sample(HOT.replace("3, 0323817105647", "1, 0321618080001"))], 1)
    report = {"passed": False, "epoch": 1767225600.4, "gpu_health": health,
              "instances": [inst(), inst(instance=1, port=8081, gpu=g)]}
    text = smoke.textfile("gpu-01", report, "3f2a")
    lab = 'host="gpu-01",gpu="1",serial="0321618080001"'
    for line in ('voltafleet_smoke_passed{host="gpu-01",release="3f2a"} 0',
                 'voltafleet_smoke_time_seconds{host="gpu-01"} 1767225600',
                 f"voltafleet_gpu_sm_clock_mhz{{{lab}}} 1020", f"voltafleet_gpu_temperature_max_celsius{{{lab}}} 88",
                 f"voltafleet_gpu_power_max_watts{{{lab}}} 180.02", f"voltafleet_gpu_throttled{{{lab}}} 1",
                 f'voltafleet_gpu_throttle_reason{{{lab},reason="hw_thermal_slowdown"}} 1',
                 f"voltafleet_gpu_healthy{{{lab}}} 0", 'voltafleet_gpu_healthy{host="gpu-01",gpu="0",serial="0321618080000"} 1',
                 f"voltafleet_gpu_retired_pages_pending{{{lab}}} 1",
                 f'voltafleet_gpu_retired_pages{{{lab},cause="double_bit"}} 1',
                 f'voltafleet_gpu_ecc_errors_volatile{{{lab},type="uncorrectable"}} 0',
                 f"voltafleet_gpu_pcie_link_width{{{lab}}} 16", f"voltafleet_gpu_pcie_link_gen_max{{{lab}}} 3",
                 f'voltafleet_gpu_nvlink_errors{{{lab},kind="crc"}} 0'):
        assert line in text.splitlines(), line
    assert text.count("# TYPE voltafleet_gpu_healthy gauge") == 1
    cpu = smoke.textfile("lab-1", {"passed": True, "instances": [inst()]}, None)
    assert "voltafleet_gpu_" not in cpu  # a CPU host has no GPU gauge, not zeros


# ---------------------------------------------------------------- the verdict's other rules


def test_xid_on_a_listed_gpu_names_it_and_warn_xids_only_warn(cfg):
    # derived from the real Xid 79 line: the bus of the host's GPU 1 (3b), the brief's pid/name fields
    xids = ("NVRM: Xid (PCI:0000:3b:00): 79, pid=2817, name=llama-server, GPU has fallen off the bus.\n"
            "NVRM: Xid (PCI:0000:86:00): 31, pid=2817, name=llama-server, Ch 00000008, intr 00000000. MMU Fault\n")
    refusals, warnings = gpuhealth.judge("h", cfg, G.health(G.host_query(4), xids=xids))
    assert refusals == ["h: GPU 1 (0000:3b:00.0, serial 0321618080001): Xid 79 since boot: pid=2817, name=llama-server, "
                        "GPU has fallen off the bus. Fix: drain the host and reboot it; a GPU whose Xid comes back "
                        "goes to repair (gpu_fatal_xids lists the Xids that refuse)."]
    assert warnings == ["h: GPU 2 (0000:86:00.0, serial 0321618080002): Xid 31 since boot: pid=2817, "
                        "name=llama-server, Ch 00000008, intr 00000000. MMU Fault"]
    assert gpuhealth.judge("h", cfg.replace(gpu_fatal_xids=[]), G.health(G.host_query(4), xids=xids))[0] == []
    s = gpuhealth.summary("h", cfg, G.health(G.host_query(4), xids=xids))
    assert [(g["healthy"], g["xids"]) for g in s["gpus"]] == [(True, {}), (False, {79: 1}), (True, {31: 1}), (True, {})]


def test_ecc_off_unreadable_kernel_log_and_nvlink_errors(cfg):
    refusals, _ = gpuhealth.judge("h", cfg, G.health(G.host_query(1, sick={0: G.ECC_OFF})))
    assert refusals == ["h: GPU 0 (0000:18:00.0, serial 0321618080000): ECC is disabled, so memory errors go unseen. "
                        "Fix: enable it (nvidia-smi -i 0 -e 1) and reboot."]
    refusals, _ = gpuhealth.judge("h", cfg, G.health(G.host_query(1), source="none"))
    assert refusals == ["h: the kernel log since boot could not be read for Xid errors. Fix: let the connecting user "
                        "read it (journalctl -k -b or dmesg, e.g. through sudo)."]
    bad = G.derive(G.NVLINK, {"Link 2: Recovery Errors: 0": "Link 2: Recovery Errors: 4"})
    _, warnings = gpuhealth.judge("h", cfg, G.health(G.host_query(2), nvlink=bad))
    assert warnings == ["h: GPU 0 (0000:18:00.0, serial 0321618080000): NVLink errors: recovery 4 "
                        "(nvidia-smi nvlink -e; gpu_nvlink_errors_warn)"]
    assert gpuhealth.judge("h", cfg.replace(gpu_nvlink_errors_warn=4), G.health(G.host_query(2), nvlink=bad))[1] == []


def test_thresholds_are_variables_with_clear_errors(cfg):
    assert gpuhealth.judge("h", cfg.replace(gpu_retired_pages_warn=3),
                           G.health(G.host_query(1, sick={0: G.PENDING})))[1] == [
        "h: GPU 0 (0000:18:00.0, serial 0321618080000): 3 pages retired of the 64 a V100 can retire: plan its "
        "replacement (gpu_retired_pages_warn)"]
    with pytest.raises(ConfigError, match=r"group_vars/x.yml: gpu_fatal_xids: has 300, not an Xid \(1-255\)"):
        validate_values("h", {**cfg.flat(), "gpu_fatal_xids": [79, 300]}, {"gpu_fatal_xids": "group_vars/x.yml"})
    with pytest.raises(ConfigError, match="gpu_retired_pages_warn: is 65, above the maximum 64"):
        validate_values("h", {**cfg.flat(), "gpu_retired_pages_warn": 65})
