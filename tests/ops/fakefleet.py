"""Fake-connector hosts for the NVIDIA toolchain tests: what cannot run here (NVIDIA's
apt repository, the driver). A scenario (see tests/ops/test_toolchain.py) becomes the hosts
of pyinfra's @fake connector: every command answers as the scenario says. The same hosts
serve the CLI (tests/ops/inventory.py, the scenario as JSON in VOLTAFLEET_FAKE) and the
in-process runs (tests/ops/harness.py).

A scenario is one host ({"name", "responses", "vars"}) or several ({"hosts": [...]}), run
together as one fleet. An answer is a string, or {"before": ..., "after": ...}: what the host
answers before and after its reboot (pyinfra's server.reboot command flips it), so a driver
upgrade can be followed through the reboot to nvidia-smi's new version."""
import json
import re

import gevent

from tests.ops.fakes import FAKE_OVERRIDES
from voltafleet.inputs.groupvars import load_or_exit

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


OVERRIDES = FAKE_OVERRIDES  # tests/ops/fakes.py: no mirror, no probe, no key file here


def no_reboot_wait(seconds):
    """pyinfra's server.reboot sleeps `delay` (10 s) before it reconnects, then `interval`
    between tries: a fake host is back at once (its uptime answer confirms the reboot), so
    it only lets the other hosts' greenlets run. Both the CLI runs (tests/ops/inventory.py)
    and the in-process ones (tests/ops/harness.py) put it in place of server.reboot's sleep."""
    gevent.sleep(0)


def fleet_of(scenario: dict, origin: str = "tests/ops/inventory.py") -> list[tuple[str, dict]]:
    """The inventory group of a scenario: [("@fake/NAME", data)], validated by
    voltafleet.inputs.groupvars.load_or_exit as an inventory file's hosts are (a bad value prints
    its block and raises SystemExit(2))."""
    group = scenario.get("group", "v100_16gb")
    return load_or_exit({group: [_host(h) for h in scenario.get("hosts", [scenario])]}, origin=origin,
                        overrides=OVERRIDES)[group]


def groups_of(scenario: dict, origin: str = "tests/ops/inventory.py") -> dict[str, list[tuple[str, dict]]]:
    """{group: hosts} of a scenario: {"groups": {"mirror": [host, ...], "v100_16gb": [...]}} gives
    each a pyinfra group of its name; any other scenario is the one group `fleet`."""
    if "groups" not in scenario:
        return {"fleet": fleet_of(scenario, origin)}
    return load_or_exit({g: [_host(h) for h in hs] for g, hs in scenario["groups"].items()}, origin=origin,
                        overrides=OVERRIDES)
