"""monitoring/: the alert rules pass `promtool check rules` and their unit tests (`promtool
test rules`), the textfiles voltafleet writes pass `promtool check metrics`, and the Grafana
dashboard uses only metrics that exist: in those textfiles or in the exporters' outputs kept
as fixtures (tests/fixtures/exporters/, each saying where it comes from).

promtool comes from Debian's prometheus package (`make promtool`); the tests skip without it
only outside CI: under CI=true or VOLTAFLEET_REQUIRE_LAB=1 a missing promtool fails."""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import gpu_fixtures as G
from tests.unit.test_memory_textfile import memory_textfile_text
from tests.unit.test_smoke import inst
from voltafleet.gpu import gpuhealth
from voltafleet.state import metrics
from voltafleet.hostside import smoke_client
from voltafleet.measure import smoke

REPO = Path(__file__).resolve().parents[2]
MON = REPO / "monitoring"
EXPORTERS = REPO / "tests" / "fixtures" / "exporters"
KNOWN_LINT = "voltafleet_smoke_ttft_ms metric names should not contain abbreviated units"  # named before this check


def promtool() -> str:
    path = shutil.which("promtool")
    if path:
        return path
    if os.environ.get("CI") == "true" or os.environ.get("VOLTAFLEET_REQUIRE_LAB") == "1":
        pytest.fail("promtool is missing: `make promtool` installs Debian's prometheus package (its promtool)")
    pytest.skip("promtool not installed (make promtool)")


def run(*args, stdin=None):
    return subprocess.run([promtool(), *args], cwd=MON, input=stdin, capture_output=True, text=True, timeout=120)


def test_alert_rules_are_valid_and_their_unit_tests_pass():
    check = run("check", "rules", "alerts.yml")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 23 rules found" in check.stdout
    tests = run("test", "rules", "alerts.test.yml")
    assert tests.returncode == 0, tests.stdout + tests.stderr


def test_the_memory_alerts_read_what_the_kernel_counts_never_vmrss(tmp_path):
    """Issue 49: the kernel limits and kills on the cgroup's charge, page cache included, not on VmRSS;
    every metric the memory alerts read is one the textfile writes."""
    import yaml

    rules = [r for g in yaml.safe_load((MON / "alerts.yml").read_text())["groups"] if g["name"] == "voltafleet-host-memory"
             for r in g["rules"]]
    used = set().union(*(promql_metrics(r["expr"]) for r in rules))
    assert "voltafleet_instance_memory_rss_bytes" not in used
    assert used == {"voltafleet_instance_memory_cgroup_bytes", "voltafleet_instance_memory_cgroup_file_bytes",
                    "voltafleet_instance_memory_cgroup_limit_bytes", "voltafleet_instance_memory_plan_held_bytes",
                    "voltafleet_instance_memory_events_total"}
    assert used <= exposition_names(memory_textfile_text(tmp_path))
    assert {e for r in rules for e in re.findall(r'event="(\w+)"', r["expr"])} == {"max", "oom_kill", "high"}


def test_every_alert_has_a_unit_test():
    rules = set(re.findall(r"- alert: (\w+)", (MON / "alerts.yml").read_text()))
    tested = set(re.findall(r"alertname: (\w+)", (MON / "alerts.test.yml").read_text()))
    assert len(rules) == 23 and rules == tested


def cuda_report(cfg) -> dict:
    """A representative smoke report of a CUDA host: 2 GPUs, one with a pending page and a
    thermal slowdown sampled under load, NVLink counters and Xids."""
    health = gpuhealth.summary("gpu-01", cfg, G.health(G.host_query(2, sick={1: G.PENDING}), nvlink=G.NVLINK,
                                                       xids="NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus"))
    hot = smoke_client.gpu_summary([smoke_client.parse_gpu_sample("1, 0321618080001, 1020, 877, 88, 180.02, 0x68")], 1)
    cool = smoke_client.gpu_summary([smoke_client.parse_gpu_sample("0, 0321618080000, 1380, 877, 61, 240.5, 0x0")], 0)
    return {"passed": False, "epoch": 1767225600, "gpu_health": health,
            "thresholds": {"smoke_min_single_tps": 15, "smoke_min_aggregate_tps": 40},
            "instances": [inst(gpu=cool), inst(instance=1, port=8081, single_tps=11.0, gpu=hot)]}


ROLLOUT = {"rollout": "20260101-000000", "inventory": "inventory/prod.py", "seconds": 812.4, "ok": False,
           "stopped": "the canary failed", "counts": {"passed": 0, "rolled_back": 1, "failed": 0, "unreachable": 0,
                                                      "not_run": 3}}


def test_the_textfiles_are_valid_exposition(cfg, tmp_path):
    running = metrics.running_textfile("20260101-000000", "inventory/prod.py", 2700, now=1767225600)
    lab = 'rollout="20260101-000000",inventory="inventory/prod.py"'
    assert f"voltafleet_rollout_running{{{lab}}} 1" in running and f"voltafleet_rollout_max_seconds{{{lab}}} 2700" in running
    assert f"voltafleet_rollout_running{{{lab}}} 0" in metrics.rollout_textfile(ROLLOUT, now=1767225600)
    memory = memory_textfile_text(tmp_path)  # roles/server/files/vf-memory-textfile.sh on a fake /proc
    assert "voltafleet_instance_memory_rss_bytes{" in memory
    for text in (smoke.textfile("gpu-01", cuda_report(cfg), "3f2a"), metrics.rollout_textfile(ROLLOUT, now=1767225600),
                 running, memory):
        out = run("check", "metrics", stdin=text)
        problems = [line for line in (out.stdout + out.stderr).splitlines() if line.strip() and line != KNOWN_LINT]
        assert problems == []


def test_rollout_textfile_and_its_atomic_write(tmp_path):
    text = metrics.rollout_textfile(ROLLOUT, now=1767225600)
    lab = 'rollout="20260101-000000",inventory="inventory/prod.py"'
    for line in (f"voltafleet_rollout_passed{{{lab}}} 0", f'voltafleet_rollout_hosts{{{lab},status="rolled_back"}} 1',
                 f'voltafleet_rollout_hosts{{{lab},status="not_run"}} 3',
                 f"voltafleet_rollout_end_timestamp_seconds{{{lab}}} 1767225600",
                 f"voltafleet_rollout_duration_seconds{{{lab}}} 812.4"):
        assert line in text.splitlines(), line
    assert f"voltafleet_rollout_passed{{{lab}}} 1" in metrics.rollout_textfile({**ROLLOUT, "ok": True})
    path = metrics.write_rollout_textfile(tmp_path / "tf", ROLLOUT)
    assert path.name == "voltafleet-rollout.prom" and "voltafleet_rollout_passed" in path.read_text()
    assert [p.name for p in path.parent.iterdir()] == ["voltafleet-rollout.prom"]  # no temporary file left
    with pytest.raises(KeyError):
        metrics.rollout_textfile({"rollout": "x"})  # no outcome: nothing written, not a pass


# ---------------------------------------------------------------- the dashboard

PROMQL_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}


def exposition_names(text: str) -> set[str]:
    return {re.split(r"[{\s]", line, 1)[0] for line in text.splitlines() if line.strip() and not line.startswith("#")}


def promql_metrics(expr: str) -> set[str]:
    """Metric names of a PromQL expression: label matchers, grouping clauses, ranges and
    strings removed; a name followed by "(" is a function."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        rest = expr[m.end():].lstrip()
        if rest.startswith("(") or m.group(0) in PROMQL_WORDS:
            continue
        names.add(m.group(0))
    return names


def test_promql_metric_extraction():
    assert promql_metrics('sum by (instance) (rate(llamacpp:tokens_predicted_total{job="x"}[5m]))') == {
        "llamacpp:tokens_predicted_total"}
    assert promql_metrics("a_total < on (host) group_left b{x=\"1\"}") == {"a_total", "b"}


def test_dashboard_uses_only_metrics_that_exist(cfg, tmp_path):
    dash = json.loads((MON / "dashboard.json").read_text())
    used = {name for p in dash["panels"] for t in p["targets"] for name in promql_metrics(t["expr"])}
    exist = exposition_names(smoke.textfile("gpu-01", cuda_report(cfg), "3f2a"))
    exist |= exposition_names(metrics.rollout_textfile(ROLLOUT))
    exist |= exposition_names(memory_textfile_text(tmp_path))
    for fixture in ("llama-server-metrics.txt", "haproxy-metrics.txt", "haproxy-teams-metrics.txt"):
        exist |= exposition_names((EXPORTERS / fixture).read_text())
    assert len(used) >= 30  # the extraction found the dashboard's metrics, not nothing
    assert used - exist == set()
    assert {n for n in used if n.startswith("llamacpp:")} and {n for n in used if n.startswith("haproxy_")}
    assert {"voltafleet_gpu_sm_clock_mhz", "voltafleet_gpu_throttle_reason", "voltafleet_gpu_healthy"} <= used
    assert {"voltafleet_instance_memory_cgroup_bytes", "voltafleet_instance_memory_cgroup_file_bytes",
            "voltafleet_instance_memory_cgroup_limit_bytes", "voltafleet_instance_memory_plan_bytes",
            "voltafleet_instance_memory_events_total"} <= used
    assert {"voltafleet_team_budget_used_tokens", "voltafleet_team_budget_tokens"} <= used
