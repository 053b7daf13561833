"""The memory ceiling on this machine's kernel (issue 49): the lab's pinned CPU llama-server in a
memory cgroup with the MemoryMax its unit would get (tests/kernel/harness.py: the project's plan,
unit and argv for one slot of Gemma 3 270M, weights read into anonymous memory), as root.

    .venv/bin/python -m bench.lab.memcg --runs 3 --record bench/records/kernel49/run1.json

Each run, one after another (one server at a time, -t 1):
    cold       the model dropped from the page cache, the unit's limit: load time (exec to /health 200),
               what the cgroup holds after load (anonymous, page cache, charged, peak), how often the
               kernel hit the limit (v1 failcnt, v2 memory.events max) and OOM kills, a completion
    warm       the same, the model read first by this process (its pages charged here, not to the server's
               cgroup: the "first reader owns the pages" case of 8 instances on one host)
    unlimited  cold, no limit: the load time and peak without a ceiling
    past-plan  the unit's limit, 256 checkpoints a slot where the plan counts 2, a conversation until the
               kernel kills it: turns, seconds, checkpoints held, the cgroup's counters, the host's OOM count
               and (v1) its parent cgroup's
Prints a table and writes every figure to --record (JSON).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

MIB = 1 << 20


def one(kind: str, tmp: Path, p, harness) -> dict:
    """One run of `kind` (cold, warm, unlimited, past-plan): its figures."""
    over = {"server_ctx_checkpoints": harness.PAST_PLAN_CHECKPOINTS} if kind == "past-plan" else {}
    argv = p.argv(harness.pinned_server(), **over)
    cg = harness.Cgroup(f"voltafleet-bench-{kind}")
    server = harness.Server(argv, cg, tmp / f"{kind}.log", p.cfg.server.oom_score_adjust, env=p.env())
    out: dict = {"kind": kind}
    try:
        if kind != "unlimited":
            cg.limit(p.limit)
        harness.drop_cached(harness.model())
        if kind == "warm":
            harness.read_all(harness.model())
        kills, parent = harness.vmstat_oom_kills(), parent_oom_kills(cg)
        out["load_s"] = round(server.start().wait_ready(60), 3)
        r = cg.read()
        out.update(anon_after_load=r.anon, file_after_load=r.file, charged_after_load=r.charged,
                   other_after_load=r.charged - r.anon - r.file,  # kernel memory, shmem: neither anon nor file
                   peak_after_load=r.peak, events_after_load=dict(r.events))
        if kind == "past-plan":
            marker = f"voltafleet bench.lab.memcg {os.getpid()} {time.time()}"
            marked = harness.mark_kernel_log(marker)
            t0 = time.monotonic()
            turns = server.converse(120, harness.FIRST_PROMPT)
            server.proc.wait(30)
            ok = [t for t in turns if "error" not in t]
            made = server.checkpoints()
            out.update(killed_after_s=round(time.monotonic() - t0, 2), turns_served=len(ok),
                       checkpoints_held=made[-1][0] if made else 0, checkpoint_mib=made[-1][1] if made else 0,
                       anon_last_turn=ok[-1]["anon"] if ok else None, file_last_turn=ok[-1]["file"] if ok else None,
                       turns=turns)
            log = harness.kernel_log_since(marker) if marked else None
            out["kernel_log"] = None if log is None else [
                line.split("] ", 1)[-1] for line in log.splitlines() if "oom-kill:" in line or "Killed process" in line]
        else:
            answer = server.complete("The capital of France is", tokens=8)
            out["answer"] = answer["content"]
        end = cg.read()
        out.update(events_end=dict(end.events), peak=end.peak, exit=server.exit_status() if server.proc.poll() is not None
                   else "running", host_oom_kills=harness.vmstat_oom_kills() - kills, cgroup_version=end.version,
                   parent_oom_kills=None if parent is None else parent_oom_kills(cg) - parent)
    finally:
        server.stop()
        cg.remove()
    return out


def parent_oom_kills(cg) -> int | None:
    """v1: the oom_kill count of the cgroup's parent (this process's own memory cgroup), which v1 keeps per
    cgroup; None on v2, whose parent here is the root (no memory.events)."""
    if cg.version != 1:
        return None
    from voltafleet.measure import cgroupmem

    return cgroupmem.flat((cg.path.parent / "memory.oom_control").read_text()).get("oom_kill")


def summary(runs: list[dict]) -> dict[str, dict]:
    """Per kind: the median and range of the quoted figures."""
    out = {}
    for kind in ("cold", "warm", "unlimited", "past-plan"):
        rs = [r for r in runs if r["kind"] == kind]
        if not rs:
            continue
        row = {}
        for key, get in (("load_s", lambda r: r["load_s"]), ("anon_mib", lambda r: r["anon_after_load"] / MIB),
                         ("file_mib", lambda r: r["file_after_load"] / MIB), ("peak_mib", lambda r: (r["peak"] or 0) / MIB),
                         ("other_mib", lambda r: r["other_after_load"] / MIB),
                         ("max_events_at_load", lambda r: r["events_after_load"].get("max", 0)),
                         ("oom_kill", lambda r: r["events_end"].get("oom_kill", 0)),
                         ("killed_after_s", lambda r: r.get("killed_after_s")), ("turns", lambda r: r.get("turns_served")),
                         ("checkpoints_held", lambda r: r.get("checkpoints_held"))):
            vals = [v for v in map(get, rs) if v is not None]
            if vals:
                row[key] = {"median": round(statistics.median(vals), 3), "min": round(min(vals), 3),
                            "max": round(max(vals), 3)}
        out[kind] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="repetitions of each kind (default 3)")
    ap.add_argument("--record", type=Path, help="write every figure here (JSON)")
    a = ap.parse_args()
    from tests.kernel import harness

    why = harness.unavailable()
    if why:
        sys.exit(f"bench.lab.memcg: {why}")
    p = harness.planned()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.runs):
            for kind in ("cold", "warm", "unlimited", "past-plan"):
                r = one(kind, Path(tmp), p, harness)
                r["run"] = i + 1
                runs.append(r)
                print(f"run {i + 1} {kind:<10} load {r['load_s']:6.2f} s  anon {r['anon_after_load'] / MIB:6.1f}"
                      f"  file {r['file_after_load'] / MIB:6.1f}  peak {(r['peak'] or 0) / MIB:6.1f} MiB"
                      f"  events {r['events_end']}  {r['exit']}"
                      + (f"  killed after {r['killed_after_s']} s, {r['turns_served']} turns, "
                         f"{r['checkpoints_held']} checkpoints" if kind == "past-plan" else ""), flush=True)
    build = next(Path(harness.pinned_server()).parents[1].glob("BUILD_INFO.json"), None)
    record = {
        "what": "bench.lab.memcg (issue 49): the pinned CPU llama-server under its unit's MemoryMax, this machine's kernel",
        "at": time.strftime("%Y-%m-%dT%H:%M:%S"), "kernel": platform.release(), "cpus": os.cpu_count(),
        "mem_total": harness.mem_total(), "build": json.loads(build.read_text()) if build else None,
        "model": Path(harness.model()).name, "model_bytes": os.path.getsize(harness.model()),
        "plan": p.plan.instance.describe(), "plan_bytes": p.plan.instance.total, "limit_bytes": p.limit,
        "checkpoint_bytes_planned": p.plan.instance.checkpoint_bytes,
        "argv": p.argv("llama-server")[1:], "past_plan_checkpoints": harness.PAST_PLAN_CHECKPOINTS,
        "summary": summary(runs), "runs": runs,
    }
    print(json.dumps(record["summary"], indent=1))
    if a.record:
        a.record.parent.mkdir(parents=True, exist_ok=True)
        a.record.write_text(json.dumps(record, indent=1) + "\n")
        print(f"written {a.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
