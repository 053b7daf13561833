"""The memory ceiling on a real kernel (issue 49), outside the lab (whose containers cannot enforce
one): this machine's memory cgroup (v1's controller here; v2 where that is what the kernel offers),
as root, with the pinned CPU llama-server and the ceiling its unit would get (tests/kernel/harness.py:
the project's own plan, unit and argv for a small CPU configuration of Gemma 3 270M).

(a) A healthy server loads a model file larger than its ceiling's headroom (the limit less what the
    loaded server holds in anonymous memory): the kernel charges the file's pages to the cgroup as it
    reads them and reclaims them at the limit (v1 failcnt, v2 memory.events max), kills nothing, and the
    server answers a completion and follow-ups up to its planned checkpoints. The load time is recorded.
(b) The same server driven past its plan (256 context checkpoints a slot on a ceiling planned for 2: a
    drop-in raising server_ctx_checkpoints without a new plan) is OOM-killed inside its cgroup: SIGKILL,
    the cgroup's oom_kill 1, its page cache reclaimed first, and nothing outside it killed (a process
    beside it holding more memory than the server's heap lives on; the host's OOM count rises by one).

Where the machine cannot do this (not root, no writable memory controller, no lab build or model) the
tests fail and say why: they never skip. Each cleans up its cgroup. About 20 s on two shared cores.
"""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.kernel import harness

MIB = 1 << 20
REPORT = harness.REPO / "reports" / "kernel-ceiling.json"


def require() -> harness.Planned:
    why = harness.unavailable()
    if why:
        pytest.fail(f"tests/kernel proves the memory ceiling on this machine's kernel and cannot here: {why}",
                    pytrace=False)
    return harness.planned()


def record(key: str, figures: dict) -> None:
    """The run's figures in reports/kernel-ceiling.json (bench/lab/memcg.py keeps the quoted ones)."""
    REPORT.parent.mkdir(exist_ok=True)
    data = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    data[key] = {**figures, "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    REPORT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{key}: {json.dumps(figures)}")


def test_a_healthy_server_loads_a_model_larger_than_its_headroom_and_serves_under_its_ceiling(tmp_path):
    p = require()
    model = harness.model()
    size = os.path.getsize(model)
    argv = p.argv(harness.pinned_server())
    cg = harness.Cgroup("voltafleet-kernel-a")
    server = harness.Server(argv, cg, tmp_path / "llama-server.log", p.cfg.server.oom_score_adjust, env=p.env())
    try:
        cg.limit(p.limit)
        harness.drop_cached(model)  # a cold load: the file's pages are read now, and charged to this cgroup
        load_s = server.start().wait_ready(60)
        loaded = cg.read()
        environ = Path(f"/proc/{server.proc.pid}/environ").read_bytes().split(b"\0")  # sh exec'd the server
        answer = server.complete(harness.FIRST_PROMPT, tokens=8)
        turns = server.converse(4, harness.FIRST_PROMPT + answer["content"])
        end = cg.read()
        alive = server.proc.poll() is None
    finally:
        server.stop()
        cg.remove()
    headroom = p.limit - loaded.anon
    figures = {"cgroup_version": loaded.version, "model_bytes": size, "limit_bytes": p.limit,
               "plan_bytes": p.plan.instance.total, "load_s": round(load_s, 3), "anon_after_load": loaded.anon,
               "file_after_load": loaded.file, "charged_after_load": loaded.charged, "peak": end.peak,
               "events_after_load": loaded.events, "events_end": end.events, "headroom_bytes": headroom,
               "checkpoints": server.checkpoints(), "turns": len(turns)}
    record("a_healthy_load", figures)
    assert alive, f"the server died: {server.exit_status()}: {server.tail()}"
    # it ran with its env file's heap tunables, as its unit runs it (glibc may cut the string at ':' in place)
    assert p.env() and any(x.decode().startswith("GLIBC_TUNABLES=glibc.malloc.mmap_max=0") for x in environ)
    assert answer["content"].strip() and answer["tokens_predicted"] > 0, answer
    assert all("error" not in t for t in turns), turns
    # the file is larger than what the limit leaves beside the loaded server: its pages had to be reclaimed
    assert size > headroom, figures
    assert loaded.file < size, figures  # of the model's pages read at load, the cgroup keeps fewer than all
    # the kernel reached the limit and reclaimed (v1: failcnt); 0 when the file's pages were charged elsewhere
    # (mapped by a running process, which POSIX_FADV_DONTNEED leaves cached): not a cold load
    assert loaded.events["max"] > 0, f"no reclaim at the limit during a cold load: {figures}"
    assert end.events.get("oom_kill", 0) == 0 and end.events.get("oom", 0) == 0, figures
    assert end.events.get("high", 0) == 0, figures  # v2: no MemoryHigh, never throttled
    assert end.peak is None or end.peak <= p.limit, figures
    # at its planned worst case: its 2 checkpoints (a slot) filled, within the plan's term for them
    made = server.checkpoints()
    assert max(n for n, _ in made) == p.cfg.server.ctx_checkpoints, made
    assert max(mib for _, mib in made) * MIB <= p.plan.instance.checkpoint_bytes, (made, p.plan.instance.checkpoint_bytes)


def test_driven_past_its_plan_it_is_oom_killed_inside_its_cgroup_and_nothing_outside_is(tmp_path):
    p = require()
    argv = p.argv(harness.pinned_server(), server_ctx_checkpoints=harness.PAST_PLAN_CHECKPOINTS)
    assert "--ctx-checkpoints" in argv and argv[argv.index("--ctx-checkpoints") + 1] == str(harness.PAST_PLAN_CHECKPOINTS)
    cg = harness.Cgroup("voltafleet-kernel-b")
    server = harness.Server(argv, cg, tmp_path / "llama-server.log", p.cfg.server.oom_score_adjust, env=p.env())
    try:
        outsider = harness.Outsider(64)
    except BaseException:
        cg.remove()
        raise
    marker = f"voltafleet-kernel-test {os.getpid()} {time.time()}"
    try:
        cg.limit(p.limit)
        outsider_rss = outsider.rss()
        kills_before = harness.vmstat_oom_kills()
        marked = harness.mark_kernel_log(marker)
        server.start().wait_ready(60)
        pid = server.proc.pid
        t0 = time.monotonic()
        turns = server.converse(120, harness.FIRST_PROMPT)
        try:
            server.proc.wait(30)
        except Exception:  # noqa: BLE001 (the assertion below says it lived)
            pass
        killed_after_s = time.monotonic() - t0
        end = cg.read()
        kills = harness.vmstat_oom_kills() - kills_before
        outsider_alive, outsider_rss_after = outsider.alive(), outsider.rss() if outsider.alive() else 0
        log = harness.kernel_log_since(marker) if marked else None
    finally:
        server.stop()
        outsider.stop()
        cg.remove()
    ok = [t for t in turns if "error" not in t]
    made = server.checkpoints()
    held, last_mib = made[-1] if made else (0, 0.0)
    figures = {"cgroup_version": end.version, "limit_bytes": p.limit, "plan_bytes": p.plan.instance.total,
               "planned_checkpoints": p.cfg.server.ctx_checkpoints, "run_checkpoints": harness.PAST_PLAN_CHECKPOINTS,
               "checkpoints_held": held, "checkpoint_mib": last_mib,
               "turns_served": len(ok), "killed_after_s": round(killed_after_s, 2), "exit": server.exit_status(),
               "events_end": end.events, "file_last_turn": ok[-1]["file"] if ok else None,
               "anon_last_turn": ok[-1]["anon"] if ok else None, "host_oom_kills": kills,
               "kernel_log": "read" if log is not None else "unreadable"}
    record("b_past_plan", figures)
    assert server.proc.returncode == -signal.SIGKILL, f"{server.exit_status()} after {len(ok)} turns: {server.tail()}"
    assert end.events["oom_kill"] == 1, figures  # the cgroup's own count: its kernel killed it
    assert end.events["max"] > 0, figures
    # past its plan: more checkpoints than the plan's term holds
    assert held > p.cfg.server.ctx_checkpoints and held * last_mib * MIB > p.plan.instance.checkpoints, figures
    # the page cache went before the kill: little was left to reclaim at the last answer
    assert ok and ok[-1]["file"] < 0.1 * p.limit, figures
    # nothing outside: the process beside it lives with its memory, and the host counted this one kill only
    assert outsider_alive and outsider_rss_after >= outsider_rss - MIB, (outsider_alive, outsider_rss, outsider_rss_after)
    assert kills == 1, figures
    if log is not None:  # the kernel's own words: a memory cgroup's OOM, in this cgroup, of this process
        assert "constraint=CONSTRAINT_MEMCG" in log, log[-2000:]
        assert f"oom_memcg={cg.name}" in log and f"pid={pid}" in log, log[-2000:]
        assert f"Killed process {pid} (llama-server)" in log, log[-2000:]

