from voltafleet.unitfile import render_unit


def test_cuda_unit_allows_only_the_nvidia_nodes_and_backs_off(cfg):
    unit = render_unit(cfg, systemd_version=255)
    assert "DevicePolicy=closed" in unit
    assert "DeviceAllow=/dev/nvidia%i rw" in unit and "DeviceAllow=/dev/nvidiactl rw" in unit
    assert "PrivateDevices" not in unit  # would hide /dev/nvidia*
    assert "RestartSteps=" in unit and "RestartMaxDelaySec=" in unit
    assert "User=llama" in unit and "NoNewPrivileges=yes" in unit and "ProtectSystem=strict" in unit
    assert "ExecStart=/opt/voltafleet/current/bin/llama-server $LLAMA_SERVER_ARGS" in unit
    assert "TimeoutStartSec=900" in unit


def test_cpu_unit_has_no_devices_and_old_systemd_no_backoff_keys(cfg):
    cfg["voltafleet_backend"] = "cpu"
    unit = render_unit(cfg, systemd_version=252)
    assert "PrivateDevices=yes" in unit and "DeviceAllow" not in unit
    assert "RestartSteps" not in unit  # unknown to systemd 252 (Debian 12)
    assert "--api-key" not in unit
