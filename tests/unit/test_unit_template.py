import json
from pathlib import Path

import pytest

from voltafleet.planning import hostmem, vram
from voltafleet.inputs.config import ConfigError, validate_values
from voltafleet.models.gguf_header import from_json
from voltafleet.planning.unitfile import render_unit


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
    cfg = cfg.replace(voltafleet_backend="cpu")
    unit = render_unit(cfg, systemd_version=252)
    assert "PrivateDevices=yes" in unit and "DeviceAllow" not in unit
    assert "RestartSteps" not in unit  # unknown to systemd 252 (Debian 12)
    assert "--api-key" not in unit


# ---------------------------------------------------------------- host memory (voltafleet.planning.hostmem)


HEADER = from_json(json.loads((Path(__file__).resolve().parents[1] / "fixtures/gguf/qwen35-27b-q4ks.json").read_text()))


def memory(cfg: dict, **cfg_over) -> hostmem.HostMemoryPlan:
    """Qwen3.6-27B's host-memory plan for these variables, two instances."""
    return hostmem.plan(cfg.replace(**cfg_over), vram.shape_of(HEADER), 2)


def lines(unit: str, *keys: str) -> list[str]:
    return [line for line in unit.splitlines() if line.split("=", 1)[0] in keys]


KEYS = ("MemoryHigh", "MemoryMax", "MemorySwapMax", "OOMScoreAdjust", "OOMPolicy", "MemoryLimit")


def test_the_unit_carries_the_plans_ceiling_and_the_oom_preference(cfg):
    cfg = cfg.replace(server_oom_score_adjust=700)
    plan = memory(cfg)
    assert plan.instance.checkpoints > 0 and plan.instance.total < plan.memory_max
    unit = render_unit(cfg, 252, plan)
    # one ceiling, no MemoryHigh: page cache would cross one at every load (docs/host.md, issue 49)
    assert lines(unit, *KEYS) == ["OOMScoreAdjust=700", "OOMPolicy=stop", f"MemoryMax={plan.memory_max}",
                                  "MemorySwapMax=0"]
    assert "voltafleet.planning.hostmem" in unit
    # an OOM kill's result is "oom-kill": on-failure restarts it, on-abort would not
    assert lines(unit, "Restart") == ["Restart=on-failure"]


def test_without_a_usable_plan_no_memory_lines_and_a_comment_says_so(cfg):
    no_header = hostmem.plan(cfg, None, 2)
    unbounded = memory(cfg, server_cache_ram=-1)
    assert no_header.unplanned and unbounded.cache_unbounded
    for plan in (None, no_header, unbounded):
        unit = render_unit(cfg, 252, plan)
        assert lines(unit, *KEYS) == ["OOMScoreAdjust=500", "OOMPolicy=stop"]
        assert "No host-memory plan" in unit


def test_another_plan_is_another_unit_text(cfg):
    """The unit's text is what restarts every instance (roles/server's unit operation): a new
    ceiling changes it; the same one renders the same text."""
    a = render_unit(cfg, 252, memory(cfg))
    assert a == render_unit(cfg, 252, memory(cfg))
    assert a != render_unit(cfg, 252, memory(cfg, server_ctx_checkpoints=8)) != render_unit(cfg, 252)
    assert a != render_unit(cfg, 252, memory(cfg, hostmem_ceiling_margin=0.2))


@pytest.mark.parametrize("value, why", [(0, "below the minimum 1"), (1001, "above the maximum 1000"),
                                        (-900, "below the minimum 1")])
def test_the_oom_score_adjust_is_a_preference_for_the_server_never_a_protection(cfg, value, why):
    """1..1000: a negative score would make sshd or the system the kernel's choice before a server."""
    with pytest.raises(ConfigError, match=rf"server_oom_score_adjust: is {value}, {why}"):
        validate_values("gpu-01", {**cfg.flat(), "server_oom_score_adjust": value})


def test_every_stop_folds_its_cgroups_memory_events_as_root_and_never_fails(cfg):
    """ExecStopPost (an OOM kill's stop too) runs in the ending run's cgroup: the textfile script's --fold
    mode adds its memory.events to the instance's tally; "-": its failure fails no stop; "+": root, no sandbox."""
    for plan in (memory(cfg), None):
        unit = render_unit(cfg, 252, plan)
        assert lines(unit, "ExecStopPost") == ["ExecStopPost=-+/opt/voltafleet/bin/vf-memory-textfile --fold %i"]
