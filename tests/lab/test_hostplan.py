"""The host plan on the real lab (issue 38): `--plan` shows each lab host's memory and CPU plan
against the facts its container reports, and a host whose servers do not fit its memory is
refused with the fix before anything changes."""
import json
import re
from pathlib import Path

from tests.lab.helpers import lab, rollout


def plan_json(run) -> dict:
    return json.loads(Path(re.search(r"(\S+/plan\.json)", run.out).group(1)).read_text())


def test_plan_shows_the_lab_hosts_memory_and_cpu_and_they_fit(converged, tmp_path):
    run, _ = rollout(["--plan"], tmp=tmp_path)
    assert run.rc == 0, run
    assert "host resources (voltafleet/planning/hostmem.py" in run.out and "group lab (" in run.out
    records = plan_json(run)["records"]
    for h in lab()["hosts"]:
        lines = records[h["name"]]["resources"]
        assert lines[0].startswith("host memory: 2 x") and "(MemTotal): fits" in lines[0], lines
        assert "checkpoints 4 slots x 32 x" in lines[1], lines  # the tiny qwen35 is hybrid: it checkpoints too
        assert lines[2].startswith("CPU: 2 x 1 threads + 0 reserved = 2 of 2 CPUs") and lines[2].endswith("fits"), lines


def test_a_host_whose_servers_outgrow_its_memory_is_refused_with_the_fix(converged, tmp_path):
    name = lab()["hosts"][0]["name"]
    run, _ = rollout(["--plan"], host_vars={name: {"hostmem_reserve_mib": 1 << 22}}, tmp=tmp_path)  # a 4 TiB reserve
    assert run.rc == 2, run
    assert f"{name}: refused: the servers do not fit the host's memory at their worst" in run.out
    assert "hostmem_reserve_mib" in run.out and f"{name} (REFUSED): host memory:" in run.out
