"""Knowledge spelled once (issue 53): the gateway group, what a server host is, an instance's
HAProxy server name, the pyinfra warning's cost and fix; each caller uses the one definition. Each plan
class is named for the plan it is."""
from pathlib import Path

from voltafleet.front import gateway, tiers
from voltafleet.state import pyinfra_version

REPO = Path(__file__).resolve().parents[2]


def test_a_server_host_is_in_neither_the_gateway_nor_the_mirror_group():
    assert tiers.runs_llama_server(["v100_16gb", "lab"])
    assert not tiers.runs_llama_server([tiers.GATEWAY_GROUP]) and not tiers.runs_llama_server(["mirror", "lab"])


def test_an_instance_is_known_by_its_hosts_part_of_the_name():
    name = gateway.backend_name("gpu 01.fleet", 3)
    assert name == "gpu_01.fleet-3" and gateway.backend_host("gpu 01.fleet") == "gpu_01.fleet"
    assert gateway.is_backend_of(name, "gpu 01.fleet")
    assert not gateway.is_backend_of("gpu_01.fleet-3x", "gpu 01.fleet") and not gateway.is_backend_of(name, "gpu")


def test_each_is_defined_once():
    py = [p for d in ("roles", "rollout", "voltafleet", "inventory", "lab", "bench", "tests") for p in (REPO / d).rglob("*.py")
          if p.name != "test_spelled_once.py"] + [REPO / "deploy.py"]
    assert [p for p in py if 'GATEWAY_GROUP = "gateway"' in p.read_text()] == [REPO / "voltafleet/front/tiers.py"]
    assert [p for p in py if "backend_name(" in p.read_text() and ", 0)[:-" in p.read_text()] == []
    assert [p for p in py if "4x the CPU" in p.read_text()] == [REPO / "voltafleet/state/pyinfra_version.py"]
    assert pyinfra_version.mismatch("0.1").endswith(pyinfra_version.COST_AND_FIX)


def test_each_plan_class_says_which_plan_it_is():
    """Host, VRAM, host-memory, CPU and fleet plans, and the --plan record: one class each, none called just `Plan`."""
    import re

    py = [p for d in ("roles", "rollout", "voltafleet") for p in (REPO / d).rglob("*.py")] + [REPO / "deploy.py"]
    plans = [m for p in py for m in re.findall(r"^class (\w*Plan)\b", p.read_text(), re.M)]
    assert sorted(plans) == ["CpuPlan", "FleetPlan", "HostMemoryPlan", "HostPlan", "VramPlan"]
    assert not [p for p in py if re.search(r"^\w+ = (\w+\.)?\w*Plan\s*(#.*)?$", p.read_text(), re.M)]  # no alias


def test_a_preflight_record_declares_no_field_of_the_fleet_plans_entry_again():
    """Preflight carries ServerEntry's fields (declared there once) and adds only the run and the refusals;
    its entry is those fields as a plain ServerEntry, whatever ServerEntry holds."""
    from dataclasses import fields

    from voltafleet.state.fleetplan import ServerEntry
    from voltafleet.state.records import Preflight

    assert set(Preflight.__annotations__) == {"run", "refusals"}
    rec = Preflight(host="h", run="r", address="10.0.0.2", ports=(8080, 8081), slots=4, fingerprint="fp", tier="latency")
    assert type(rec.entry()) is ServerEntry and rec.entry() == ServerEntry("h", "10.0.0.2", (8080, 8081), 4, "fp", "latency")
    assert {f.name: getattr(rec.entry(), f.name) for f in fields(ServerEntry)} == {f.name: getattr(rec, f.name) for f in fields(ServerEntry)}
    assert Preflight(host="h", run="r", address="a", ports=(), refusals=("why",)).entry() is None
