"""voltafleet.measure.cgroupmem: a memory cgroup's files, v1 or v2, as one reading, and the tally that
keeps a unit's memory events past its cgroup; tests/kernel/harness.py's choice of a writable memory
cgroup, and its reasons when there is none (the kernel test fails with them, never skips)."""
from pathlib import Path

import pytest

from tests.kernel import harness
from voltafleet.measure import cgroupmem
from voltafleet.measure.cgroupmem import Tally

V2 = {"memory.current": "500\n", "memory.stat": "anon 300\nfile 180\nkernel 20\nactive_file 100\ninactive_file 80\n",
      "memory.max": "max\n", "memory.events": "low 0\nhigh 2\nmax 9\noom 1\noom_kill 1\noom_group_kill 0\n",
      "memory.peak": "640\n"}
V1 = {"memory.usage_in_bytes": "500\n", "memory.stat": "rss 1\ncache 1\ntotal_rss 300\ntotal_active_file 100\n"
      "total_inactive_file 80\n", "memory.limit_in_bytes": "9223372036854771712\n", "memory.failcnt": "9\n",
      "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n", "memory.max_usage_in_bytes": "640\n"}


def test_v2_and_v1_read_as_the_same_quantities():
    for files, version, events in ((V2, 2, {"high": 2, "max": 9, "oom": 1, "oom_kill": 1}),
                                   (V1, 1, {"max": 9, "oom_kill": 1})):
        r = cgroupmem.reading(files)
        assert (r.version, r.charged, r.file, r.anon, r.unreclaimable, r.peak) == (version, 500, 180, 300, 320, 640)
        assert r.limit is None and r.events == events  # unlimited; v1: failcnt is max, no high or oom count


def test_limits_in_bytes_and_the_unlimited_forms():
    assert cgroupmem.limit_of("475045261\n") == 475045261
    assert cgroupmem.limit_of("max\n") is None and cgroupmem.limit_of("9223372036854771712") is None
    assert cgroupmem.limit_of(None) is None and cgroupmem.limit_of("") is None
    assert cgroupmem.reading({**V1, "memory.limit_in_bytes": "475041792\n"}).limit == 475041792


def test_an_old_v1_kernel_without_oom_kill_and_a_v2_one_without_peak():
    r = cgroupmem.reading({**V1, "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\n"})
    assert r.events == {"max": 9}
    assert cgroupmem.reading({k: v for k, v in V2.items() if k != "memory.peak"}).peak is None


def test_read_takes_the_files_of_a_directory(tmp_path):
    for name, files in (("v2", V2), ("v1", V1)):
        (tmp_path / name).mkdir()
        for f, text in files.items():
            (tmp_path / name / f).write_text(text)
        assert cgroupmem.read(tmp_path / name) == cgroupmem.reading(files)


def test_fold_adds_a_runs_counts_once():
    t = cgroupmem.fold(Tally(), {"max": 9, "oom_kill": 1}, "a")
    assert t == Tally("a", {"max": 9, "oom_kill": 1})
    assert cgroupmem.fold(t, {"max": 9, "oom_kill": 1}, "a") is t  # the same run: folded already
    t = cgroupmem.fold(t, {"high": 0, "max": 3, "oom": 0, "oom_kill": 0}, "b")
    assert t == Tally("b", {"high": 0, "max": 12, "oom": 0, "oom_kill": 1})
    assert Tally.parse(t.text()) == t and t.text() == "invocation b\nhigh 0\nmax 12\noom 0\noom_kill 1\n"
    assert cgroupmem.fold(Tally(), {"max": 1}, "").text() == "invocation -\nmax 1\n"  # no invocation id: "-"


def test_counted_is_the_tally_plus_the_running_invocation_unless_folded():
    t = Tally("a", {"max": 12, "oom_kill": 1})
    assert cgroupmem.counted(t, {"max": 5, "oom_kill": 0}, "b") == {"max": 17, "oom_kill": 1}
    assert cgroupmem.counted(t, {"max": 12, "oom_kill": 1}, "a") == {"max": 12, "oom_kill": 1}
    assert cgroupmem.counted(Tally(), {"max": 5}, "b") == {"max": 5}
    assert cgroupmem.counted(Tally(), {}, "") == {}


# ---------------------------------------------------------------- tests/kernel's cgroup, or why none


@pytest.fixture
def machine(monkeypatch):
    def set_(mounts: list[tuple[str, str, str]], own: str | None = "/user.slice"):
        monkeypatch.setattr(harness, "_mounts", lambda: mounts)
        monkeypatch.setattr(harness, "own_v1_memory_cgroup", lambda: own)
    return set_


def test_v1s_memory_controller_under_this_processs_own_cgroup(machine):
    machine([("/sys/fs/cgroup/memory", "cgroup", "rw,relatime,memory"), ("/sys/fs/cgroup/unified", "cgroup2", "rw")],
            "/process_api/abc")
    assert harness.parent_cgroup() == (Path("/sys/fs/cgroup/memory/process_api/abc"), 1, Path("/sys/fs/cgroup/memory"))
    machine([("/sys/fs/cgroup/memory", "cgroup", "rw,memory")], "/")
    assert harness.parent_cgroup() == (Path("/sys/fs/cgroup/memory"), 1, Path("/sys/fs/cgroup/memory"))


def test_v2_where_its_root_has_the_memory_controller(machine, tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "CGROUP", tmp_path)
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    machine([(str(tmp_path), "cgroup2", "rw,nsdelegate")])
    assert harness.parent_cgroup() == (tmp_path, 2, tmp_path)
    (tmp_path / "cgroup.controllers").write_text("cpu io pids\n")
    assert "has no memory controller (cgroup.controllers: cpu io pids)" in harness.parent_cgroup()


@pytest.mark.parametrize("mounts, own, why", [
    ([("/sys/fs/cgroup/memory", "cgroup", "ro,nosuid,memory")], "/", "mounted read-only"),
    ([("/sys/fs/cgroup/memory", "cgroup", "rw,memory")], None, "in no cgroup of v1's memory controller"),
    ([("/sys/fs/cgroup", "cgroup2", "ro,nosuid")], "/", "cgroup v2 is mounted read-only"),
    ([("/proc", "proc", "rw")], "/", "neither cgroup v1's memory controller nor cgroup v2 is mounted"),
])
def test_every_machine_without_a_writable_memory_cgroup_is_named(machine, monkeypatch, mounts, own, why):
    monkeypatch.setattr(harness, "CGROUP", Path("/sys/fs/cgroup"))
    machine(mounts, own)
    assert why in harness.parent_cgroup()
    monkeypatch.setattr(harness.os, "geteuid", lambda: 0)
    assert harness.unavailable().startswith("no writable memory controller: ")


def test_the_kernel_tests_fail_and_never_skip():
    text = (Path(harness.__file__).parent / "test_ceiling.py").read_text()
    assert "pytest.skip" not in text and "skipif" not in text and "importorskip" not in text
    assert text.count("p = require()") == 2 and "pytest.fail(" in text
