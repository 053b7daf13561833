"""`python -m rollout --plan`'s pyinfra run (VOLTAFLEET_PHASE=plan) on pyinfra's fake connector:
the real deploy.py, preflight and plan role. A converged host reports no change, a host with
one different flag reports that flag and the restart of that instance, a refused host its
reason; and the run sends the hosts nothing but fact reads."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ops.fakes import FAKE_OVERRIDES
from voltafleet.inputs.config import settings_of
from voltafleet.inputs.settings import Settings
from voltafleet.state.dryrun import sha1
from voltafleet.state.fleetplan import FleetPlan
from voltafleet.inputs.groupvars import load_or_exit
from voltafleet.planning.hostplan import UNIT_PATH, HostFacts, make_plan
from voltafleet.state.records import HostChange
from voltafleet.state.runctx import RunDir
from voltafleet.planning.unitfile import render_unit

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
CMD = re.compile(r"\[fake\] simulating command on ([^:]+): (.*)")
CXX = "12.2.0 x86_64-linux-gnu"
GROUP = "lab"  # the CPU backend: two instances a host, no driver
# Every command the plan phase may send a host: fact reads (roles/facts.py, pyinfra's Sha1File).
READS = [re.compile(p) for p in (
    r"^\. /etc/os-release; ",                                   # HostBasics
    r"^p=\S+; while \[ ! -e ",                                  # FreeDisk
    r"^if \[ -f \S+ \]; then stat -c 'stat=%s %Y' ",            # FileState
    r"^cd \S+ 2>/dev/null \|\| exit 0; echo \"current=",        # Releases
    r"^for f in /etc/voltafleet/llama-server/\*\.env; do ",     # EnvFiles, ServerInstances
    r"^test -e \S+ && \( sha1sum ",                             # Sha1File (the unit)
    r"^nvidia-smi --query-gpu=index,",                          # Gpus
    r"^command -v nvidia-smi >/dev/null 2>&1 \|\| \{ echo ",    # GpuHealth
    r"^for n in [^;]+; do command -v \$n ",                      # NvccVersion
    r"^lspci -Dnn -d 10de: 2>/dev/null \|\| true$",              # NvidiaPci
    r"^dpkg-query -W ",                                         # NvidiaPackages
    r"^cat /proc/driver/nvidia/version ",                       # LoadedDriver
)]


def host_cfg(name: str) -> Settings:
    """The host's settings as the fake inventory gives them (group_vars, the overrides)."""
    data = load_or_exit({GROUP: [(name, {})]}, origin="tests/ops/test_plan.py", overrides=FAKE_OVERRIDES)[GROUP][0][1]
    return settings_of(name, data)


def converged(name: str, env_over: dict | None = None) -> dict:
    """A fake host that has everything a batch would install; env_over: {instance: env text}."""
    cfg = host_cfg(name)
    plan = make_plan(name, cfg, HostFacts(os="debian-12", systemd=252), None, cfg.build.ref)
    fp = plan.build.fingerprint(None, CXX)
    model = plan.model_files[0]
    env = {i.index: plan.env_file(i.index) for i in plan.instances} | (env_over or {})
    env_out = "\n".join(f"@@voltafleet-env {i} {sha1(t)}\n{t.rstrip()}" for i, t in env.items())
    responses = [
        [r"^\. /etc/os-release", f"os=debian-12\ncpus=2\nmem_kib=24683664\nsystemd=252\ncxx={CXX}"],
        [r"df -PB1", "2049 900000000000"],
        [r"stat -c 'stat=%s %Y'", f"stat=5 9\nside={model.sha256} 5 9"],
        [r"releases/\*/", f"current={fp}\ngood={fp}\nrelease={fp} 1760000000 {{\"fingerprint\": \"{fp}\"}}"],
        [r"@@voltafleet-env", env_out],
        [r"sha1sum", f"{sha1(render_unit(cfg, 252))}  {UNIT_PATH}"],
        [r"systemctl is-active", "0 active enabled\n1 active enabled"],
    ]
    return {"name": name, "responses": responses, "plan": plan, "fp": fp}


def run_plan(hosts: list[dict], tmp_path: Path, group: str = GROUP):
    """deploy.py in the plan phase on these fake hosts: (rc, {host: commands}, records, output)."""
    fleet = tmp_path / "fleet-plan.json"
    fleet.write_text(FleetPlan(rollout="t", model_bytes={FAKE_OVERRIDES["model_url"]: 15_600_000_000}).to_json())
    scenario = {"group": group, "hosts": [{k: h[k] for k in ("name", "responses", "vars") if k in h} for h in hosts]}
    env = {**os.environ, "VOLTAFLEET_FAKE": json.dumps(scenario), "VOLTAFLEET_PHASE": "plan",
           "VOLTAFLEET_REPORT_DIR": str(tmp_path), "VOLTAFLEET_FLEET_PLAN": str(fleet), "VOLTAFLEET_RUN": "t1"}
    proc = subprocess.run([PYINFRA, "--debug", "-y", "tests/ops/inventory.py", "deploy.py"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    cmds = {f"@fake/{h['name']}": [] for h in hosts}
    for m in CMD.finditer(out):
        cmds.setdefault(m.group(1), []).append(m.group(2))
    files = {h["name"]: RunDir(tmp_path).file(HostChange, f"@fake/{h['name']}") for h in hosts}
    records = {h: json.loads(f.read_text()) for h, f in files.items() if f.exists()}
    return proc.returncode, cmds, records, out


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    conv = converged("plan-conv")
    plan = conv["plan"]
    other = plan.env_file(1).replace("-t 1 ", "-t 2 ")
    assert other != plan.env_file(1)
    flag = converged("plan-flag", {1: other})
    stale = converged("plan-new")
    stale["responses"][2] = [r"stat -c 'stat=%s %Y'", ""]                      # no model file yet
    stale["responses"][3] = [r"releases/\*/", "current=old\ngood=old\n"]     # an older release
    old_os = converged("plan-old-os")
    old_os["responses"][0] = [r"^\. /etc/os-release", f"os=debian-11\ncpus=2\nmem_kib=24683664\nsystemd=247\ncxx={CXX}"]
    hosts = [conv, flag, stale, old_os]
    return (*run_plan(hosts, tmp_path_factory.mktemp("plan")), conv["fp"])


def test_a_converged_host_reports_no_change(fleet):
    rc, cmds, records, out, fp = fleet
    r = records["plan-conv"]
    assert r["refusals"] == [], out
    assert (r["fingerprint"], r["current"], r["present"]) == (fp, fp, True)
    assert (r["flags"], r["unit"], r["downloads"], r["restart"], r["retire"], r["toolchain"]) == ({}, False, [], [], [], [])


def test_a_different_flag_is_a_flag_change_and_a_restart_of_its_instance(fleet):
    r = fleet[2]["plan-flag"]
    assert r["flags"] == {"1": ["-t 2 -> 1"]} and r["restart"] == [1] and r["restart_why"] == ["flags"]
    assert (r["unit"], r["downloads"], r["current"] == r["fingerprint"]) == (False, [], True)


def test_a_new_release_and_model_restart_every_instance(fleet):
    r = fleet[2]["plan-new"]
    assert r["current"] == "old" and not r["present"] and r["restart"] == [0, 1]
    assert r["downloads"][0]["bytes"] == 15_600_000_000 and r["restart_why"] == ["release", "model"]


def test_a_refused_host_is_recorded_with_its_reason_not_an_abort(fleet):
    rc, cmds, records, out, fp = fleet
    assert records["plan-old-os"]["refusals"] == ["@fake/plan-old-os: OS debian-11 is not one of debian-12, "
                                                  "ubuntu-22.04, ubuntu-24.04 (preflight_supported_os)"]
    assert rc == 0, out  # the others were planned too


def test_the_plan_phase_sends_nothing_but_fact_reads(fleet):
    rc, cmds, records, out, fp = fleet
    assert any(cmds.values()) and sent_only_reads(cmds) == []
    assert "Starting operation" not in out  # no operation at all, not even one that would change nothing


def sent_only_reads(cmds: dict) -> list[str]:
    """The commands sent that are not fact reads ([] is the point)."""
    return [c for host_cmds in cmds.values() for c in host_cmds if not any(p.search(c) for p in READS)]


def test_a_v100_host_reports_its_driver_move_and_every_restart(tmp_path):
    """The v100_16gb group on the fake connector: R580 580.82.07 installed and loaded, 580.95.05
    pinned, the CUDA toolkit in place: a driver move, and every instance restarts."""
    from tests.ops.test_driver_upgrade import driver_host, nvidia_repo_ubuntu

    v100 = driver_host("plan-v100", "ubuntu-24.04", nvidia_repo_ubuntu(580, "580.82.07"), before="580.82.07",
                       vars={"nvidia_driver_version": "580.95.05"}, extra=[
                           [r"^for n in /usr/local/cuda-12.8/bin/nvcc", "Cuda compilation tools, release 12.8, V12.8.93"],
                           [r"releases/\*/", "current=someother\n"],
                           [r"systemctl is-active", "0 active enabled\n1 active enabled"]])
    rc, cmds, records, out = run_plan([v100], tmp_path, group="v100_16gb")
    r = records["plan-v100"]
    assert r["refusals"] == [] and rc == 0, out
    assert r["driver"] == "upgrade" and "580.82.07" in r["driver_why"] and "580.95.05" in r["driver_why"]
    assert r["driver_managed"] and r["restart"] == [0, 1] and "driver" in r["restart_why"]
    assert r["toolchain"] == [] and r["fingerprint"]  # the toolkit answers: the fingerprint is known
    assert sent_only_reads(cmds) == []


def rollout_plan(hosts: list[dict], tmp_path: Path, *args: str):
    """`python -m rollout tests/ops/inventory.py --plan ...` on these fake hosts: (rc, stdout, plan.json)."""
    scenario = {"group": GROUP, "hosts": [{"name": h["name"], "responses": h["responses"]} for h in hosts]}
    proc = subprocess.run([sys.executable, "-m", "rollout", "tests/ops/inventory.py", "--plan", "--report-dir",
                           str(tmp_path), *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "VOLTAFLEET_FAKE": json.dumps(scenario)})
    plans = list(tmp_path.glob("rollout-*/plan.json"))
    return proc.returncode, proc.stdout + proc.stderr, json.loads(plans[0].read_text()) if plans else None


def test_rollout_plan_prints_the_batches_changes_and_estimate(tmp_path):
    conv = converged("plan-conv")
    flag = converged("plan-flag", {0: conv["plan"].env_file(0).replace("-t 1 ", "-t 3 ")})
    rc, out, report = rollout_plan([conv, flag], tmp_path, "--canary", "1", "--batch", "1")
    assert rc == 0, out
    assert report["ok"] and report["batches"] == [["@fake/plan-conv"], ["@fake/plan-flag"]]
    rows = {r["host"]: r for r in report["hosts"]}
    assert (rows["@fake/plan-conv"]["flags"], rows["@fake/plan-conv"]["restart"]) == ("same", "no")
    assert (rows["@fake/plan-flag"]["flags"], rows["@fake/plan-flag"]["restart"]) == ("change", "1 of 2 (flags)")
    assert "@fake/plan-flag: instance 0: -t 3 -> 1" in out and "canary: @fake/plan-conv" in out
    # group_vars/lab.yml: a 2 s run, 1 s a restart, 2 s a smoke test; no gateway here (no drain), no probe (fakes)
    est = report["estimate"]
    assert [b["seconds"] for b in est["batches"]] == [2, 2 + 1 + 2] and est["total_s"] == 2 + 2 + 5
    assert not list(tmp_path.glob("rollout-*/outcome-*")) and not list(tmp_path.glob("rollout-*.json"))


def test_rollout_plan_exits_2_naming_the_refused_host(tmp_path):
    old_os = converged("plan-old-os")
    old_os["responses"][0] = [r"^\. /etc/os-release", f"os=debian-11\ncpus=2\nmem_kib=24683664\nsystemd=247\ncxx={CXX}"]
    rc, out, report = rollout_plan([converged("plan-conv"), old_os], tmp_path)
    assert rc == 2 and not report["ok"] and list(report["refused"]) == ["@fake/plan-old-os"]
    assert "@fake/plan-old-os: refused: OS debian-11" in out and "REFUSED: 1 host(s)" in out
