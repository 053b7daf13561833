"""The server role's memory ceiling and its textfile (issue 38): the unit it installs carries
the host-memory plan's MemoryMax, MemorySwapMax=0 and server_oom_score_adjust, and a
new ceiling is a unit change (which restarts every instance); the memory textfile's plan file,
service and timer are installed (the script with the helper scripts) and the timer started, or
removed where smoke_textfile_dir is null. In process (tests/ops/fakes.py, test_filesync's Disk)
and through pyinfra's @fake connector (tests/ops/harness.py, tests/ops/server_deploy.py)."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from roles.filesync import FilesState, synced
from roles.helpers import wanted as helper_scripts
from roles.server import memory_files, memory_timer_removed, memory_timer_started, unit_file
from roles.shell import bin_path
from tests.ops.fakes import FAKE_OVERRIDES, FakeHost, commands
from tests.ops.harness import deploy
from tests.ops.test_filesync import DIR, Disk, sha1
from voltafleet.models import gguf_header
from voltafleet.inputs.config import settings_of
from voltafleet.inputs.settings import Settings
from voltafleet.planning.flags import pinned_help
from voltafleet.inputs.groupvars import load_or_exit
from voltafleet.planning.hostplan import UNIT_PATH, HostFacts, make_plan
from voltafleet.planning.unitfile import MEMORY_PLAN_PATH, MEMORY_UNIT_PATHS, render_unit

COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
CXX = "12.2.0 x86_64-linux-gnu"
SERVICE, TIMER = MEMORY_UNIT_PATHS["service"], MEMORY_UNIT_PATHS["timer"]
GROUP = "lab"  # the CPU backend: two instances a host, no GPU facts
REPO = Path(__file__).resolve().parents[2]
HEADER = gguf_header.from_json(json.loads((REPO / "tests/fixtures/gguf/qwen35-27b-q4ks.json").read_text()))
GIB = 1 << 30
FACTS = HostFacts(os="debian-12", systemd=252, mem_total=512 * GIB, mem_available=500 * GIB, cpus=64)


def host_plan(name: str, cfg: dict, header=HEADER):
    """A Debian 12 host's plan, its host-memory plan voltafleet.planning.hostmem's from Qwen3.6-27B's header
    (without a header: a plan that leaves the model out, so no ceiling): tests/ops/server_deploy.py's."""
    return make_plan(name, cfg, FACTS, header, COMMIT)


def with_margin(plan, margin: float):
    """The same plan with another hostmem_ceiling_margin (another MemoryMax)."""
    return dataclasses.replace(plan, hostmem=dataclasses.replace(plan.hostmem, ceiling_margin=margin))


@pytest.fixture
def plan(cfg):
    cfg = cfg.replace(voltafleet_backend="cpu", server_instances=2, llama_cpp_targets=["llama-server"])
    return host_plan("gpu-01", cfg)


def directive(text: str, key: str) -> list[str]:
    return re.findall(rf"^{key}=(.*)$", text, re.M)


# ---------------------------------------------------------------- the unit


def test_the_unit_carries_the_plans_numbers_and_the_oom_preference(plan):
    assert plan.hostmem.instance.checkpoints > 0 and plan.hostmem.memory_max > plan.hostmem.instance.total
    text = unit_file(plan).text
    assert directive(text, "MemoryHigh") == []  # one ceiling (docs/host.md, issue 49)
    assert directive(text, "MemoryMax") == [str(plan.hostmem.memory_max)]
    assert directive(text, "MemorySwapMax") == ["0"]
    assert directive(text, "OOMScoreAdjust") == [str(plan.settings.server.oom_score_adjust)] == ["500"]
    assert directive(text, "OOMPolicy") == ["stop"] and directive(text, "Restart") == ["on-failure"]


@pytest.mark.parametrize("why", ["no plan", "no header", "unbounded cache"])
def test_without_a_usable_host_memory_plan_the_unit_has_no_ceiling(plan, why):
    """No plan, or one whose number means nothing: the model left out (no GGUF header), or
    server_cache_ram -1 (llama.cpp's cache unbounded). A ceiling there would kill a healthy server."""
    plan = {"no plan": lambda: dataclasses.replace(plan, hostmem=None),
            "no header": lambda: host_plan("gpu-01", plan.settings, header=None),
            "unbounded cache": lambda: host_plan("gpu-01", plan.settings.replace(server_cache_ram=-1))}[why]()
    text = unit_file(plan).text
    assert directive(text, "MemoryHigh") == directive(text, "MemoryMax") == directive(text, "MemorySwapMax") == []
    assert directive(text, "OOMScoreAdjust") == ["500"]


def test_a_new_ceiling_uploads_the_unit_and_reloads_systemd(plan):
    """The unit's operation is among those that restart every instance (roles/server Changes):
    the unit of the old plan (or of no plan) is replaced, the same one is left alone."""
    new = unit_file(plan)
    for old in (render_unit(plan.settings, 252), unit_file(with_margin(plan, plan.hostmem.ceiling_margin + 0.05)).text):
        disk = Disk({"/etc/systemd/system": DIR, UNIT_PATH: {"type": "file", "mode": 644, "text": old}})
        assert disk.run(synced._inner(files=[new], then=["systemctl daemon-reload"])) == [
            f"upload {UNIT_PATH} {sha1(new.text)}", f"chmod 644 {UNIT_PATH}", "systemctl daemon-reload"]
        assert f"MemoryMax={plan.hostmem.memory_max}" in disk.paths[UNIT_PATH]["text"]
        assert disk.run(synced._inner(files=[new], then=["systemctl daemon-reload"])) == []


# ---------------------------------------------------------------- the memory textfile


def test_the_plan_file_holds_each_instances_planned_bytes(plan):
    files = {w.dest: w for w in memory_files(plan)}
    total, held = plan.hostmem.instance.total, plan.hostmem.instance.held
    assert held < total  # the program's and the mapped model's file pages are reclaimable
    assert files[MEMORY_PLAN_PATH].text.splitlines()[1:] == ["host gpu-01", f"instance 0 {total} {held}",
                                                              f"instance 1 {total} {held}"]
    no_plan = {w.dest: w for w in memory_files(host_plan("gpu-01", plan.settings, header=None))}
    assert no_plan[MEMORY_PLAN_PATH].text.splitlines()[1:] == ["host gpu-01", "instance 0 - -", "instance 1 - -"]


def test_the_service_runs_the_installed_script_every_30_s(plan):
    files = {w.dest: w.text for w in memory_files(plan)}
    script = bin_path(plan, "vf-memory-textfile")
    assert script in {w.dest for w in helper_scripts(plan)[0]}  # installed by roles/helpers
    assert directive(files[SERVICE], "ExecStart") == [
        f"{script} {MEMORY_PLAN_PATH} {plan.settings.smoke.textfile_dir}"]
    assert directive(files[SERVICE], "Type") == ["oneshot"]
    assert directive(files[SERVICE], "ReadWritePaths") == [f"-{plan.settings.smoke.textfile_dir}"]
    assert directive(files[SERVICE], "ProtectSystem") == ["strict"]
    assert directive(files[TIMER], "OnUnitActiveSec") == ["30"]
    assert directive(files[TIMER], "WantedBy") == ["timers.target"]


def test_installed_then_the_timer_enabled_and_restarted_and_nothing_when_converged(plan):
    files = memory_files(plan)
    disk = Disk({"/etc/voltafleet": DIR, "/etc/systemd/system": DIR})
    cmds = disk.run(synced._inner(files=files, then=memory_timer_started()))
    assert cmds == [c for w in files for c in (f"upload {w.dest} {sha1(w.text)}", f"chmod 644 {w.dest}")] + [
        "systemctl daemon-reload", "systemctl enable voltafleet-memory.timer",
        "systemctl restart voltafleet-memory.timer"]
    assert disk.run(synced._inner(files=files, then=memory_timer_started())) == []
    # a new plan: only the plan file changes, and the timer is restarted
    replanned = memory_files(host_plan("gpu-01", plan.settings.replace(server_ctx_checkpoints=4)))
    cmds = disk.run(synced._inner(files=replanned, then=memory_timer_started()))
    assert cmds[:2] == [f"upload {MEMORY_PLAN_PATH} {sha1(replanned[0].text)}", f"chmod 644 {MEMORY_PLAN_PATH}"]
    assert len(cmds) == 5


def test_without_a_textfile_dir_an_installed_timer_is_removed():
    there = FakeHost({FilesState: [{"type": "file", "mode": 644, "sha1": "0" * 40}] * 3})
    assert commands(memory_timer_removed, there) == [
        f"systemctl disable --now voltafleet-memory.timer 2>/dev/null; rm -f {MEMORY_PLAN_PATH} {SERVICE} {TIMER} "
        "&& systemctl daemon-reload"]
    gone = FakeHost({FilesState: [{"type": "none"}] * 3})
    gone.noop = lambda text: None
    assert commands(memory_timer_removed, gone) == []


# ---------------------------------------------------------------- the role through pyinfra's @fake connector


def fake_host(name: str, cfg: dict, **vars) -> dict:
    """A Debian 12 CPU host whose service account, release and help text are in place; its
    files (FilesState: no answer) all missing."""
    fp = host_plan(name, cfg).build.fingerprint(None, CXX)
    return {"name": name, "vars": vars, "responses": [
        [r"^\. /etc/os-release", f"os=debian-12\ncpus=2\nmem_kib=4000000\nsystemd=252\ncxx={CXX}"],
        [r"/etc/group; awk", "group=yes\nhome=/nonexistent\nshell=/usr/sbin/nologin\nprimary=llama"],
        [r"^if \[ -x ", pinned_help(COMMIT)],
        [r"releases/\*/", f"current={fp}\ngood={fp}\nrelease={fp} 1760000000 {{}}"],
    ]}


def host_cfg(name: str, **vars) -> Settings:
    data = load_or_exit({GROUP: [(name, vars)]}, origin="tests/ops/test_server_memory.py",
                        overrides=FAKE_OVERRIDES)[GROUP][0][1]
    return settings_of(f"@fake/{name}", data)


def run_server(unit_on_host: str | None = None, **vars):
    """roles/server on one fake host of the lab group (the CPU backend), whose unit file is
    `unit_on_host` (None: missing): (rc, its commands, output)."""
    name = "m1"
    host = fake_host(name, host_cfg(name, **vars), **vars)
    if unit_on_host is not None:
        host["responses"].insert(0, [r"^for p in /etc/systemd/system /etc/systemd/system/llama-server@\.service;",
                                     f"dir 755\nfile 644 {sha1(unit_on_host)}"])
    rc, cmds, out = deploy(deploy_file="tests/ops/server_deploy.py", groups={GROUP: [host]})
    return rc, cmds[f"@fake/{name}"], out


def test_the_role_installs_the_unit_and_the_memory_timer():
    rc, cmds, out = run_server()
    assert rc == 0, out
    assert f"chmod 644 {UNIT_PATH}" in cmds
    for path in (MEMORY_PLAN_PATH, SERVICE, TIMER):
        assert f"chmod 644 {path}" in cmds
    at = cmds.index("systemctl enable voltafleet-memory.timer")
    assert cmds[at - 1] == "systemctl daemon-reload" and cmds[at + 1] == "systemctl restart voltafleet-memory.timer"
    assert not any("disable --now voltafleet-memory.timer" in c for c in cmds)


def test_the_role_without_a_textfile_dir_installs_no_timer():
    rc, cmds, out = run_server(smoke_textfile_dir=None)
    assert rc == 0, out
    assert not any("voltafleet-memory" in c and "for p in" not in c for c in cmds)
    assert any(c.startswith(f"for p in {MEMORY_PLAN_PATH} ") for c in cmds)  # the one fact read, nothing found


def test_the_role_renders_the_unit_of_the_plan_with_its_ceiling():
    """The unit on the host is the plan's (its sha1): left alone; the same unit without the
    ceiling (before issue 38, or a plan without hostmem): replaced, which restarts every instance."""
    plan = host_plan("@fake/m1", host_cfg("m1"))
    assert f"MemoryMax={plan.hostmem.memory_max}" in unit_file(plan).text
    rc, cmds, out = run_server(unit_on_host=unit_file(plan).text)
    assert rc == 0, out
    assert f"chmod 644 {UNIT_PATH}" not in cmds
    rc, cmds, out = run_server(unit_on_host=render_unit(plan.settings, 252))
    assert rc == 0, out
    assert f"chmod 644 {UNIT_PATH}" in cmds and "systemctl daemon-reload" in cmds
