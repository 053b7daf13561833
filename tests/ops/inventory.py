"""Fake-connector hosts for the NVIDIA toolchain tests: what cannot run here (NVIDIA's
apt repository, the driver). The scenario comes as JSON in VOLTAFLEET_FAKE (see
tests/ops/test_toolchain.py); every command answers as the scenario says."""
import json
import os
import re

from voltafleet.groupvars import load_or_exit

_s = json.loads(os.environ["VOLTAFLEET_FAKE"])
_responses = {}
for pattern, answer in _s.get("responses", []):
    _responses[re.compile(pattern)] = answer
_host = ("@fake/" + _s["name"], {"fake_responses": _responses, "fake_delay": 0, "fake_delay_jitter": 0,
                                 **_s.get("vars", {})})
fleet = load_or_exit({_s.get("group", "v100_16gb"): [_host]}, origin="tests/ops/inventory.py", overrides={
    "model_sha256": "a" * 64,
    "model_url": "http://127.0.0.1:9/models/Qwen3.6-27B-Q4_K_S.gguf",
})[_s.get("group", "v100_16gb")]
