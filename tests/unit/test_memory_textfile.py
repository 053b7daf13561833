"""roles/server/files/vf-memory-textfile.sh against a fake /proc, cgroup tree and systemctl:
voltafleet-memory.prom holds each instance's VmRSS, its plan and what the kernel counts in its
cgroup (the charge, its page cache, the limit, memory.events summed over the unit's runs), v2 and
v1, in the textfile format, written whole (vf-atomic) with mode 0644; what cannot be read is left
out. Its `--fold` mode (the unit's ExecStopPost) keeps a run's events past its cgroup. The script
reads the cgroup as voltafleet.measure.cgroupmem does (the kernel test's and the bench's reader)."""
import os
import stat
import subprocess
from pathlib import Path

import pytest

from voltafleet.measure import cgroupmem
from voltafleet.planning.unitfile import MEMORY_EVENTS_DIR

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "roles/server/files/vf-memory-textfile.sh"
ATOMIC = REPO / "roles/helpers/files/vf-atomic.sh"
CG0 = "/system.slice/system-llama\\x2dserver.slice/llama-server@0.service"
CG1 = "/system.slice/system-llama\\x2dserver.slice/llama-server@1.service"
INV0, INV1 = "a" * 32, "b" * 32

# One cgroup of each version as the kernel writes it (values: a server near its limit, 3 charges that hit it)
V2 = {"memory.current": "32000000000\n",
      "memory.stat": "anon 28000000000\nfile 3500000000\nkernel 400000000\nshmem 0\n"
                     "active_anon 0\ninactive_anon 28000000000\nactive_file 1000000000\ninactive_file 2500000000\n",
      "memory.max": "35000000000\n",
      "memory.events": "low 0\nhigh 0\nmax 3\noom 0\noom_kill 0\noom_group_kill 0\n",
      "memory.peak": "34999996928\n"}
V1 = {"memory.usage_in_bytes": "32000000000\n",
      "memory.stat": "cache 3500000000\nrss 28000000000\nactive_file 1\ninactive_file 2\n"
                     "total_cache 3500000000\ntotal_rss 28000000000\ntotal_active_file 1000000000\n"
                     "total_inactive_file 2500000000\n",
      "memory.limit_in_bytes": "35000001536\n",
      "memory.failcnt": "3\n",
      "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
      "memory.max_usage_in_bytes": "34999996928\n"}


def fake_tree(tmp_path: Path, show: str, procs: dict[int, str], cgroups: dict[str, str],
              self_cgroup: str = "") -> dict:
    """A bin directory with a systemctl that prints `show` and a vf-atomic, a /proc with each
    pid's status text (and self/cgroup), a cgroup tree with each file's text: the script's environment."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "systemctl").write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/systemctl.args\ncat <<'EOF'\n{show}EOF\n")
    (bin_ / "vf-atomic").write_text(f"#!/bin/sh\nexec bash {ATOMIC} \"$@\"\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    for pid, text in procs.items():
        (tmp_path / "proc" / str(pid)).mkdir(parents=True, exist_ok=True)
        (tmp_path / "proc" / str(pid) / "status").write_text(text)
    (tmp_path / "proc" / "self").mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc" / "self" / "cgroup").write_text(self_cgroup)
    for path, text in cgroups.items():
        (tmp_path / "cgroup" / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "cgroup" / path.lstrip("/")).write_text(text)
    return {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "VF_PROC": str(tmp_path / "proc"),
            "VF_CGROUP": str(tmp_path / "cgroup"), "VF_ATOMIC": str(bin_ / "vf-atomic"),
            "VF_EVENTS": str(tmp_path / "events")}


def status(rss_kib: int) -> str:
    return f"Name:\tllama-server\nVmPeak:\t{rss_kib * 3} kB\nVmRSS:\t{rss_kib:>9} kB\nRssAnon:\t{rss_kib - 5} kB\n"


def v2_cgroup(path: str, files: dict = V2) -> dict[str, str]:
    return {f"{path}/{name}": text for name, text in files.items()}


def v1_cgroup(path: str, files: dict = V1) -> dict[str, str]:
    return {f"/memory{path}/{name}": text for name, text in files.items()}


PLAN = "# voltafleet\nhost gpu-01\ninstance 0 40000000000 38000000000\ninstance 1 40000000000 38000000000\n"
# systemctl show prints each unit's properties in its own order, a blank line after each unit
SHOW = (f"MainPID=4242\nControlGroup={CG0}\nInvocationID={INV0}\nId=llama-server@0.service\n\n"
        f"Id=llama-server@1.service\nInvocationID={INV1}\nControlGroup={CG1}\nMainPID=4343\n\n")


def run(tmp_path: Path, plan: str = PLAN, show: str = SHOW, procs=None, cgroups=None, v1: bool = False,
        tallies: dict[str, str] | None = None):
    """(exit status, the textfile's text or None, its mode or None, stderr)."""
    procs = {4242: status(30_000_000), 4343: status(1_000_000)} if procs is None else procs
    if cgroups is None:
        cgroups = v1_cgroup(CG0) if v1 else v2_cgroup(CG0)  # instance 1's cgroup unreadable
    env = fake_tree(tmp_path, show, procs, cgroups)
    for inst, text in (tallies or {}).items():
        (tmp_path / "events").mkdir(exist_ok=True)
        (tmp_path / "events" / inst).write_text(text)
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
M = "voltafleet_instance_memory_"


def cgroup_lines(labels: str, files: dict, events=None) -> dict[str, str]:
    """What the textfile holds for one cgroup: read by voltafleet.measure.cgroupmem, the reference."""
    r = cgroupmem.reading(files)
    out = {f"{M}cgroup_bytes{{{labels}}}": str(r.charged), f"{M}cgroup_file_bytes{{{labels}}}": str(r.file)}
    if r.limit is not None:
        out[f"{M}cgroup_limit_bytes{{{labels}}}"] = str(r.limit)
    for e, n in (r.events if events is None else events).items():
        out[f'{M}events_total{{{labels},event="{e}"}}'] = str(n)
    return out


def test_each_instance_rss_plan_and_what_the_kernel_counts_in_bytes(tmp_path):
    rc, text, mode, err = run(tmp_path)
    assert rc == 0, err
    assert samples(text) == {
        f"{M}rss_bytes{{{L0}}}": str(30_000_000 * 1024),
        f"{M}rss_bytes{{{L1}}}": str(1_000_000 * 1024),
        f"{M}plan_bytes{{{L0}}}": "40000000000",
        f"{M}plan_bytes{{{L1}}}": "40000000000",
        f"{M}plan_held_bytes{{{L0}}}": "38000000000",
        f"{M}plan_held_bytes{{{L1}}}": "38000000000",
        f"{M}cgroup_bytes{{{L0}}}": "32000000000",        # memory.current (instance 1's cgroup is unreadable)
        f"{M}cgroup_file_bytes{{{L0}}}": "3500000000",    # active_file + inactive_file
        f"{M}cgroup_limit_bytes{{{L0}}}": "35000000000",  # memory.max
        f'{M}events_total{{{L0},event="high"}}': "0",
        f'{M}events_total{{{L0},event="max"}}': "3",
        f'{M}events_total{{{L0},event="oom"}}': "0",
        f'{M}events_total{{{L0},event="oom_kill"}}': "0"}
    assert mode == 0o644
    assert [p.name for p in (tmp_path / "textfile").iterdir()] == ["voltafleet-memory.prom"]  # no temporary left
    # one systemctl call for every instance
    assert (tmp_path / "systemctl.args").read_text().split("\n")[:-1] == [
        "show -p Id -p MainPID -p ControlGroup -p InvocationID -- llama-server@0.service llama-server@1.service"]


def test_cgroup_v1_charge_page_cache_limit_failcnt_and_oom_kill(tmp_path):
    got = samples(run(tmp_path, v1=True)[1])
    want = {f"{M}cgroup_bytes{{{L0}}}": "32000000000",
            f"{M}cgroup_file_bytes{{{L0}}}": "3500000000",    # total_active_file + total_inactive_file
            f"{M}cgroup_limit_bytes{{{L0}}}": "35000001536",  # memory.limit_in_bytes
            f'{M}events_total{{{L0},event="max"}}': "3",      # memory.failcnt
            f'{M}events_total{{{L0},event="oom_kill"}}': "0"}  # memory.oom_control; v1 has no high, no oom count
    assert {k: v for k, v in got.items() if "cgroup" in k or "events" in k} == want


@pytest.mark.parametrize("v1", [False, True], ids=["v2", "v1"])
def test_the_script_reads_a_cgroup_as_the_python_reader_does(tmp_path, v1):
    files = V1 if v1 else V2
    got = samples(run(tmp_path, v1=v1)[1])
    assert {k: v for k, v in got.items() if L0 in k and ("cgroup" in k or "events" in k)} == cgroup_lines(L0, files)


def test_an_unlimited_cgroup_has_no_limit_line(tmp_path):
    for v1, files, key in ((False, V2, "memory.max"), (True, V1, "memory.limit_in_bytes")):
        unlimited = {**files, key: "max\n" if not v1 else "9223372036854771712\n"}
        cgroups = v1_cgroup(CG0, unlimited) if v1 else v2_cgroup(CG0, unlimited)
        sub = tmp_path / ("v1" if v1 else "v2")
        sub.mkdir()
        got = samples(run(sub, cgroups=cgroups)[1])
        assert f"{M}cgroup_bytes{{{L0}}}" in got and f"{M}cgroup_limit_bytes{{{L0}}}" not in got
        assert cgroupmem.reading(unlimited).limit is None


def test_help_and_type_once_per_metric_family_before_its_samples(tmp_path):
    text = run(tmp_path)[1]
    lines = text.splitlines()
    for name, kind in (("rss_bytes", "gauge"), ("plan_bytes", "gauge"), ("plan_held_bytes", "gauge"), ("cgroup_bytes", "gauge"),
                       ("cgroup_file_bytes", "gauge"), ("cgroup_limit_bytes", "gauge"), ("events_total", "counter")):
        metric = M + name
        at = lines.index(f"# TYPE {metric} {kind}")
        assert lines[at - 1].startswith(f"# HELP {metric} ")
        rows = [i for i, line in enumerate(lines) if line.startswith(metric + "{")]
        assert rows and rows == list(range(at + 1, at + 1 + len(rows)))  # grouped, right after TYPE


def test_a_stopped_instance_has_no_rss_no_cgroup_and_no_plan_none_at_all(tmp_path):
    show = (f"Id=llama-server@0.service\nMainPID=0\nControlGroup=\nInvocationID=\n\n"
            f"Id=llama-server@1.service\nMainPID=4343\nControlGroup={CG1}\nInvocationID={INV1}\n\n")
    plan = "host gpu-01\ninstance 0 - -\ninstance 1 - -\n"
    rc, text, _, err = run(tmp_path, plan=plan, show=show)
    assert rc == 0, err
    assert samples(text) == {f"{M}rss_bytes{{{L1}}}": str(1_000_000 * 1024)}
    assert "plan_bytes" not in text and "events_total" not in text  # never a made-up 0


def test_a_process_gone_between_systemctl_and_proc_is_left_out(tmp_path):
    rc, text, _, err = run(tmp_path, procs={4343: status(1_000_000)})
    assert rc == 0, err
    assert f"{M}rss_bytes{{{L0}}}" not in samples(text)
    assert f"{M}plan_bytes{{{L0}}}" in samples(text)


# ---------------------------------------------------------------- events that outlive a run's cgroup


def test_the_tally_of_ended_runs_is_added_to_the_running_ones_counts(tmp_path):
    """Instance 0 was OOM-killed twice before this run (its stop folded them in); instance 1, stopped
    now, keeps its tally without a cgroup."""
    show = (f"MainPID=4242\nControlGroup={CG0}\nInvocationID={INV0}\nId=llama-server@0.service\n\n"
            f"Id=llama-server@1.service\nMainPID=0\nControlGroup=\nInvocationID=\n\n")
    tallies = {"0": f"invocation {'c' * 32}\nhigh 0\nmax 90\noom 2\noom_kill 2\n", "1": "invocation -\nmax 4\noom_kill 1\n"}
    got = samples(run(tmp_path, show=show, tallies=tallies)[1])
    assert {k: v for k, v in got.items() if "events" in k} == {
        f'{M}events_total{{{L0},event="high"}}': "0", f'{M}events_total{{{L0},event="max"}}': "93",
        f'{M}events_total{{{L0},event="oom"}}': "2", f'{M}events_total{{{L0},event="oom_kill"}}': "2",
        f'{M}events_total{{{L1},event="max"}}': "4", f'{M}events_total{{{L1},event="oom_kill"}}': "1"}
    ref = cgroupmem.counted(cgroupmem.Tally.parse(tallies["0"]), cgroupmem.reading(V2).events, INV0)
    assert ref == {"high": 0, "max": 93, "oom": 2, "oom_kill": 2}


def test_a_run_its_stop_folded_already_is_not_counted_twice(tmp_path):
    """ExecStopPost runs in the cgroup: between its fold and the cgroup's removal both are readable."""
    tallies = {"0": f"invocation {INV0}\nhigh 0\nmax 3\noom 0\noom_kill 0\n"}
    got = samples(run(tmp_path, tallies=tallies)[1])
    assert got[f'{M}events_total{{{L0},event="max"}}'] == "3"
    assert cgroupmem.counted(cgroupmem.Tally.parse(tallies["0"]), {"max": 3}, INV0) == {
        "high": 0, "max": 3, "oom": 0, "oom_kill": 0}


def fold(tmp_path: Path, self_cgroup: str, cgroups: dict, invocation: str | None = INV0, inst: str = "0"):
    env = fake_tree(tmp_path, "", {}, cgroups, self_cgroup)
    env.pop("INVOCATION_ID", None)
    if invocation:
        env["INVOCATION_ID"] = invocation
    r = subprocess.run(["bash", str(SCRIPT), "--fold", inst], env=env, capture_output=True, text=True, timeout=30)
    tally = tmp_path / "events" / inst
    return r.returncode, (tally.read_text() if tally.exists() else None), r.stderr


V2_SELF = f"0::{CG0}\n"
V1_SELF = f"9:name=systemd:{CG0}\n4:memory:{CG0}\n1:cpu:/\n0::/\n"  # a hybrid host: memory on v1


@pytest.mark.parametrize("v1", [False, True], ids=["v2", "v1"])
def test_the_stop_folds_its_runs_counts_into_the_tally(tmp_path, v1):
    killed = {**V1, "memory.failcnt": "12\n", "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"} \
        if v1 else {**V2, "memory.events": "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n"}
    cgroups = v1_cgroup(CG0, killed) if v1 else v2_cgroup(CG0, killed)
    rc, text, err = fold(tmp_path, V1_SELF if v1 else V2_SELF, cgroups)
    assert rc == 0, err
    want = {"max": 12, "oom_kill": 1} if v1 else {"high": 0, "max": 12, "oom": 1, "oom_kill": 1}
    assert cgroupmem.Tally.parse(text) == cgroupmem.Tally(INV0, want)
    assert text == cgroupmem.fold(cgroupmem.Tally(), cgroupmem.reading(killed).events, INV0).text()
    # the next run's stop adds its own; the same run's stop twice adds nothing
    (tmp_path / "events" / "0").write_text(cgroupmem.Tally("c" * 32, {"max": 5, "oom_kill": 2}).text())
    assert cgroupmem.Tally.parse(fold(tmp_path, V1_SELF if v1 else V2_SELF, cgroups)[1]).events == {
        e: n + {"max": 5, "oom_kill": 2}.get(e, 0) for e, n in want.items()}
    again = fold(tmp_path, V1_SELF if v1 else V2_SELF, cgroups)[1]
    assert cgroupmem.Tally.parse(again).events["max"] == 17


def test_the_stop_folds_nothing_but_the_units_own_cgroup(tmp_path):
    """v1 without memory accounting for the unit: its memory line names the slice, whose counts are
    every instance's; the wrong instance's cgroup, or none readable: no tally, exit 0 (never fails a stop)."""
    slice_ = "/system.slice/system-llama\\x2dserver.slice"
    for name, self_cgroup, cgroups, inst in (
            ("slice", f"4:memory:{slice_}\n0::/\n", v1_cgroup(slice_), "0"),
            ("other", V2_SELF, v2_cgroup(CG0), "1"),
            ("unreadable", V2_SELF, {}, "0")):
        sub = tmp_path / name
        sub.mkdir()
        rc, text, err = fold(sub, self_cgroup, cgroups, inst=inst)
        assert rc == 0 and text is None, (name, err)


def test_the_script_and_the_unit_agree_on_the_tally_folder():
    text = SCRIPT.read_text()
    assert f"events_dir=${{VF_EVENTS:-{MEMORY_EVENTS_DIR}}}" in text


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


@pytest.mark.parametrize("argv", [["only-one"], ["--fold", "x"], ["a", "b", "c"]])
def test_bad_usage(argv):
    r = subprocess.run(["bash", str(SCRIPT), *argv], capture_output=True, text=True)
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


def test_a_plan_file_of_one_figure_an_instance_gives_no_held_line(tmp_path):
    """A host whose plan file predates `held` (instance N TOTAL): the total is reported, no held is made up."""
    rc, text, _, err = run(tmp_path, plan="host gpu-01\ninstance 0 40000000000\ninstance 1 40000000000\n")
    assert rc == 0, err
    assert f"{M}plan_bytes{{{L0}}}" in samples(text) and "plan_held_bytes" not in text
