"""roles/server/files/vf-memory-textfile.sh against a fake /proc, cgroup tree and systemctl:
voltafleet-memory.prom holds each instance's VmRSS, its plan and its cgroup's charge, in the
textfile format, written whole (vf-atomic) with mode 0644; what cannot be read is left out."""
import os
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "roles/server/files/vf-memory-textfile.sh"
ATOMIC = REPO / "roles/helpers/files/vf-atomic.sh"
CG0 = "/system.slice/system-llama\\x2dserver.slice/llama-server@0.service"
CG1 = "/system.slice/system-llama\\x2dserver.slice/llama-server@1.service"


def fake_tree(tmp_path: Path, show: str, procs: dict[int, str], cgroups: dict[str, str]) -> dict:
    """A bin directory with a systemctl that prints `show` and a vf-atomic, a /proc with each
    pid's status text, a cgroup tree with each file's text: the script's environment."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "systemctl").write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/systemctl.args\ncat <<'EOF'\n{show}EOF\n")
    (bin_ / "vf-atomic").write_text(f"#!/bin/sh\nexec bash {ATOMIC} \"$@\"\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    for pid, text in procs.items():
        (tmp_path / "proc" / str(pid)).mkdir(parents=True)
        (tmp_path / "proc" / str(pid) / "status").write_text(text)
    for path, text in cgroups.items():
        (tmp_path / "cgroup" / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "cgroup" / path.lstrip("/")).write_text(text)
    return {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "VF_PROC": str(tmp_path / "proc"),
            "VF_CGROUP": str(tmp_path / "cgroup"), "VF_ATOMIC": str(bin_ / "vf-atomic")}


def status(rss_kib: int) -> str:
    return f"Name:\tllama-server\nVmPeak:\t{rss_kib * 3} kB\nVmRSS:\t{rss_kib:>9} kB\nRssAnon:\t{rss_kib - 5} kB\n"


PLAN = "# voltafleet\nhost gpu-01\ninstance 0 40000000000\ninstance 1 40000000000\n"
# systemctl show prints each unit's properties in its own order, a blank line after each unit
SHOW = (f"MainPID=4242\nControlGroup={CG0}\nId=llama-server@0.service\n\n"
        f"Id=llama-server@1.service\nControlGroup={CG1}\nMainPID=4343\n\n")


def run(tmp_path: Path, plan: str = PLAN, show: str = SHOW, procs=None, cgroups=None, v1: bool = False):
    """(exit status, the textfile's text or None, its mode or None, stderr)."""
    procs = {4242: status(30_000_000), 4343: status(1_000_000)} if procs is None else procs
    if cgroups is None:
        cgroups = {CG0 + "/memory.current": "32000000000\n"}
        if v1:
            cgroups = {"/memory" + CG0 + "/memory.usage_in_bytes": "32000000000\n"}
    env = fake_tree(tmp_path, show, procs, cgroups)
    (tmp_path / "memory-plan").write_text(plan)
    out = tmp_path / "textfile"
    r = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "memory-plan"), str(out)], env=env,
                       capture_output=True, text=True, timeout=30)
    prom = out / "voltafleet-memory.prom"
    if not prom.exists():
        return r.returncode, None, None, r.stderr
    return r.returncode, prom.read_text(), stat.S_IMODE(prom.stat().st_mode), r.stderr


def samples(text: str) -> dict[str, str]:
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))


L0 = 'host="gpu-01",instance="0",unit="llama-server@0.service"'
L1 = 'host="gpu-01",instance="1",unit="llama-server@1.service"'


def test_each_instance_rss_plan_and_cgroup_in_bytes(tmp_path):
    rc, text, mode, err = run(tmp_path)
    assert rc == 0, err
    assert samples(text) == {
        f"voltafleet_instance_memory_rss_bytes{{{L0}}}": str(30_000_000 * 1024),
        f"voltafleet_instance_memory_rss_bytes{{{L1}}}": str(1_000_000 * 1024),
        f"voltafleet_instance_memory_plan_bytes{{{L0}}}": "40000000000",
        f"voltafleet_instance_memory_plan_bytes{{{L1}}}": "40000000000",
        f"voltafleet_instance_memory_cgroup_bytes{{{L0}}}": "32000000000"}  # instance 1's cgroup is unreadable
    assert mode == 0o644
    assert [p.name for p in (tmp_path / "textfile").iterdir()] == ["voltafleet-memory.prom"]  # no temporary left
    # one systemctl call for every instance
    assert (tmp_path / "systemctl.args").read_text().split("\n")[:-1] == [
        "show -p Id -p MainPID -p ControlGroup -- llama-server@0.service llama-server@1.service"]


def test_help_and_type_once_per_metric_family_before_its_samples(tmp_path):
    text = run(tmp_path)[1]
    lines = text.splitlines()
    for name in ("rss", "plan", "cgroup"):
        metric = f"voltafleet_instance_memory_{name}_bytes"
        at = lines.index(f"# TYPE {metric} gauge")
        assert lines[at - 1].startswith(f"# HELP {metric} ")
        rows = [i for i, line in enumerate(lines) if line.startswith(metric + "{")]
        assert rows and rows == list(range(at + 1, at + 1 + len(rows)))  # grouped, right after TYPE


def test_cgroup_v1_usage_is_read_where_v2_is_absent(tmp_path):
    assert samples(run(tmp_path, v1=True)[1])[f"voltafleet_instance_memory_cgroup_bytes{{{L0}}}"] == "32000000000"


def test_a_stopped_instance_has_no_rss_and_no_plan_none_at_all(tmp_path):
    show = (f"Id=llama-server@0.service\nMainPID=0\nControlGroup=\n\n"
            f"Id=llama-server@1.service\nMainPID=4343\nControlGroup={CG1}\n\n")
    plan = "host gpu-01\ninstance 0 -\ninstance 1 -\n"
    rc, text, _, err = run(tmp_path, plan=plan, show=show)
    assert rc == 0, err
    assert samples(text) == {f"voltafleet_instance_memory_rss_bytes{{{L1}}}": str(1_000_000 * 1024)}
    assert "voltafleet_instance_memory_plan_bytes" not in text  # never a made-up 0


def test_a_process_gone_between_systemctl_and_proc_is_left_out(tmp_path):
    rc, text, _, err = run(tmp_path, procs={4343: status(1_000_000)})
    assert rc == 0, err
    assert f"voltafleet_instance_memory_rss_bytes{{{L0}}}" not in samples(text)
    assert f"voltafleet_instance_memory_plan_bytes{{{L0}}}" in samples(text)


def test_the_old_file_stays_whole_when_the_write_fails(tmp_path):
    out = tmp_path / "textfile"
    out.mkdir()
    (out / "voltafleet-memory.prom").write_text("old\n")
    env = fake_tree(tmp_path, SHOW, {4242: status(5)}, {})
    env["VF_ATOMIC"] = "/bin/false"
    (tmp_path / "memory-plan").write_text(PLAN)
    r = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "memory-plan"), str(out)], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and (out / "voltafleet-memory.prom").read_text() == "old\n"


def test_bad_usage(tmp_path):
    r = subprocess.run(["bash", str(SCRIPT), "only-one"], capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stderr


def memory_textfile_text(tmp_path: Path) -> str:
    """A representative voltafleet-memory.prom (tests/unit/test_monitoring.py checks it with promtool)."""
    return run(tmp_path)[1]


def test_the_memory_plan_sits_beside_the_env_dir_where_the_good_snapshot_keeps_it():
    """vf-good records and restores ENV_DIR/../memory-plan with the env files: a rollback leaves it as it was."""
    import posixpath

    from voltafleet.planning.hostplan import ENV_DIR
    from voltafleet.planning.unitfile import MEMORY_PLAN_PATH

    assert MEMORY_PLAN_PATH == posixpath.join(posixpath.dirname(ENV_DIR), "memory-plan")
    script = (Path(__file__).resolve().parents[2] / "roles/activation/files/vf-good.sh").read_text()
    assert script.count('dirname -- "$env_dir")/memory-plan') == 2
