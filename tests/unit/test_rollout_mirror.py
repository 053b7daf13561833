"""The rolling driver with a `mirror` group (python -m rollout, its pyinfra runs recorded, not
run): mirrors are configured with the gateways before the first batch, they are never a
server host (no preflight plan, no batch, no canary), and the fleet plan names them."""
import json

import pytest

from voltafleet.state.runctx import RunContext, RunDir

import rollout.fleet
import rollout.main as driver
from rollout.runner import Runner
from voltafleet.state.records import Outcome, Preflight

INVENTORY = """
from tests.fixture_vars import PINNED_COMMIT
from voltafleet.inputs.groupvars import build_inventory
_g = build_inventory({
    "v100_16gb": ["gpu-1", "gpu-2", "gpu-3"],
    "mirror": [("mirror-1", {"ssh_hostname": "10.0.0.5"}), ("mirror-2", {"mirror_address": "10.0.0.6"})],
    "gateway": [("gw-1", {"gateway_address": "10.0.0.7"}), ("mirror-2", {"gateway_address": "10.0.0.6"})],
}, origin="inventory/test.py", overrides={"model_sha256": "a" * 64, "server_allow_unauthenticated": True,
                                 "gateway_allow_unauthenticated": True, "gateway_vip": "10.0.0.10",
                                 "gateway_bind": "10.0.0.10:8000",
                                 "llama_cpp_ref": PINNED_COMMIT})  # a 40-hex commit: no ls-remote here
v100_16gb, mirror, gateway = _g["v100_16gb"], _g["mirror"], _g["gateway"]
"""


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """The driver's pyinfra runs: [(phase, limit)]; preflight writes each server's plan, a
    batch passes every host it rolls."""
    calls = []

    def fake_pyinfra(self, limit, ctx, log, echo=True, label="", serial=False):
        phase = RunContext.from_env(ctx.to_env()).phase  # what deploy.py would read
        calls.append((phase, limit) if not serial else (phase, limit, "serial"))
        run_dir = RunDir(ctx.report_dir)
        if phase == "preflight":
            for h in ("gpu-1", "gpu-2", "gpu-3"):
                run_dir.write(Preflight(host=h, run=ctx.run, address=h, ports=(8080,), slots=2, fingerprint="fp"))
        if phase == "batch":
            for h in limit:
                run_dir.write(Outcome(host=h, run=ctx.run, status="passed"))
        return 0

    monkeypatch.setattr(Runner, "run", fake_pyinfra)
    monkeypatch.setattr(rollout.fleet, "remote_size", lambda url: 15_600_000_000)
    inv = tmp_path / "inventory.py"
    inv.write_text(INVENTORY)
    return calls, str(inv), tmp_path / "reports"


def test_mirrors_are_configured_before_the_first_batch_and_never_rolled(runs):
    calls, inv, reports = runs
    assert driver.main([inv, "--canary", "1", "--batch", "2", "--report-dir", str(reports)]) == 0
    # two gateways (one address): one run host by host (pyinfra --serial); no server host, no preflight again
    assert calls == [("preflight", None), ("gateway", ["mirror-1", "mirror-2", "gw-1"], "serial"),
                     ("batch", ["gpu-1", "mirror-2", "gw-1"]), ("batch", ["gpu-2", "gpu-3", "mirror-2", "gw-1"])]
    plan = json.loads(next(reports.glob("rollout-*/fleet-plan.json")).read_text())
    assert plan["mirrors"] == [
        {"host": "mirror-1", "address": "10.0.0.5", "port": 8880, "upstream": "https://huggingface.co"},
        {"host": "mirror-2", "address": "10.0.0.6", "port": 8880, "upstream": "https://huggingface.co"}]
    assert [s["host"] for s in plan["servers"]] == ["gpu-1", "gpu-2", "gpu-3"]
    report = json.loads((reports / "rollout-latest.json").read_text())
    assert [h["host"] for h in report["hosts"]] == ["gpu-1", "gpu-2", "gpu-3"]


def test_a_canary_group_never_picks_a_mirror(runs):
    calls, inv, reports = runs
    assert driver.main([inv, "--canary", "mirror", "--batch", "1", "--report-dir", str(reports)]) == 0
    batches = [c[1] for c in calls if c[0] == "batch"]
    assert batches == [["gpu-1", "mirror-2", "gw-1"], ["gpu-2", "mirror-2", "gw-1"], ["gpu-3", "mirror-2", "gw-1"]]


def test_without_the_gateway_the_mirrors_that_are_not_the_gateway_are_still_configured(runs):
    calls, inv, reports = runs
    assert driver.main([inv, "--canary", "1", "--batch", "2", "--no-gateway", "--report-dir", str(reports)]) == 0
    assert calls[:2] == [("preflight", ["gpu-1", "gpu-2", "gpu-3"]), ("gateway", ["mirror-1"])]
    assert calls[2:] == [("batch", ["gpu-1"]), ("batch", ["gpu-2", "gpu-3"])]
