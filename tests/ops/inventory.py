"""Fake-connector hosts for the NVIDIA toolchain tests: what cannot run here (NVIDIA's
apt repository, the driver). The scenario comes as JSON in VOLTAFLEET_FAKE (see
tests/ops/test_toolchain.py); every command answers as the scenario says.

A scenario is one host ({"name", "responses", "vars"}) or several ({"hosts": [...]}), run
together as one fleet, or groups of them ({"groups": {"mirror": [...], "v100_16gb": [...]}}). An answer is a string, or {"before": ..., "after": ...}: what the host
answers before and after its reboot (pyinfra's server.reboot command flips it), so a driver
upgrade can be followed through the reboot to nvidia-smi's new version."""
import json
import os
import re

from voltafleet.groupvars import load_or_exit

REBOOT = re.compile(r"&& reboot \)")


class _Phase:
    after = False


class _Flip(dict):
    """The reboot command's answer: from now on the host gives its after-reboot answers."""

    def __init__(self, phase):
        super().__init__()
        self.phase = phase

    def get(self, key, default=None):
        if key == "success":
            self.phase.after = True
        return default


class _Phased(dict):
    """An answer that differs before and after the host's reboot."""

    def __init__(self, phase, before, after):
        super().__init__()
        self.phase, self.before, self.after = phase, before, after

    def get(self, key, default=None):
        if key == "stdout":
            return self.after if self.phase.after else self.before
        return default


def _answer(answer):
    """"@gpu:{json}" is the GpuHealth fact's output made by tests/gpu_fixtures.py (too long
    for the scenario's environment variable): {"n": 8, "sick": {"3": "PENDING"}, "xids": true}."""
    if not (isinstance(answer, str) and answer.startswith("@gpu:")):
        return answer
    from tests import gpu_fixtures as g

    a = json.loads(answer[5:])
    sick = {int(i): getattr(g, name) for i, name in a.get("sick", {}).items()}
    return g.fact_output(g.host_query(a.get("n", 2), sick=sick), g.NVLINK if a.get("nvlink") else "",
                         g.XIDS if a.get("xids") else "", a.get("source", "journal"))


def _host(s):
    phase = _Phase()
    responses = {REBOOT: _Flip(phase)}
    for pattern, answer in s.get("responses", []):
        if re.compile(pattern) in responses:  # the first answer for a pattern wins (re.compile caches)
            continue
        answer = _answer(answer)
        if isinstance(answer, dict) and "before" in answer:
            answer = _Phased(phase, answer["before"], answer.get("after", answer["before"]))
        responses[re.compile(pattern)] = answer
    return ("@fake/" + s["name"], {"fake_responses": responses, "fake_delay": 0, "fake_delay_jitter": 0,
                                   **s.get("vars", {})})


_s = json.loads(os.environ["VOLTAFLEET_FAKE"])
_group = _s.get("group", "v100_16gb")
_overrides = {
    "model_sha256": "a" * 64,
    "model_url": "http://127.0.0.1:9/models/Qwen3.6-27B-Q4_K_S.gguf",
    # no model mirror here: the driver scenarios serve the group's -c/-np unplanned
    # (test_vram_refusal.py serves a real header and plans)
    "vram_plan_required": False,
    # no llama-server answers here: no golden probe to compare with (tests/lab probes)
    "smoke_probe": False,
    # no API key file in these scenarios: the servers' network is taken as closed
    "server_allow_unauthenticated": True,
}
if "groups" in _s:  # {"groups": {"mirror": [host, ...], "v100_16gb": [...]}}: each a pyinfra group of its name
    globals().update(load_or_exit({g: [_host(h) for h in hs] for g, hs in _s["groups"].items()},
                                  origin="tests/ops/inventory.py", overrides=_overrides))
else:
    fleet = load_or_exit({_group: [_host(h) for h in _s.get("hosts", [_s])]}, origin="tests/ops/inventory.py",
                         overrides=_overrides)[_group]
