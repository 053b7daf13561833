"""A busy fleet's traffic (issue 51, bench/traffic): seeded multi-turn chats with thinking, Poisson
arrivals at 80 % of the slots, 1x/2x/4x the slots' conversations, replayed on one server; and item 3's
rounds (16 clients at once, as proof19b measured the seed's ratio).

    traffic51:BUILD    plan["traffic51"] (when its build is BUILD; bench/gpu/gpu_proof.py plan51): {"build",
                       "runs", "configs": [{"name", "kind" ("traffic", the default, or "rounds"), "args",
                       "model" (a file in --models; default q4ks.gguf: gpu_proof.sh writes q4ks-vary.gguf,
                       whose answers differ with the prompt), "memory_max_mib" (the server in a cgroup at its
                       unit's MemoryMax, with "planned_mib"), and for "traffic": "traffic" (bench.traffic.model
                       .Params as a dict), "calibrate"; for "rounds": "streams", "shapes" [[prompt, tokens]]}]};
                       each config's server, a warm-up, turn_s measured (driver.calibrate) when asked, then
                       `runs` replays of the schedule (seed, seed + 1, ...) or rounds at each shape, host memory
                       sampled (and its cgroup's); each repetition keeps /metrics before and after and its
                       span of the server's log (log_span, bytes; the whole log is log_file in logs.tgz). A
                       config whose complete record the results already hold (same name and argv) is skipped:
                       a later call or session goes on where the last stopped. TRAFFIC51_ONLY (names, comma-
                       separated) runs those configs alone, in the plan's order: a session whose device time
                       fits one config but not the next (bench/traffic/README.md).
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, replace

from bench.gpu.proof.hostmem import make_cgroup
from bench.gpu.proof.runner import HostSampler, ProofRun, cgroup_mem, proc_mem
from bench.gpu.qwen35_bench import Server, say
from voltafleet.hostside.smoke_client import metrics


def log_size(s: Server) -> int:
    """Bytes the server's log holds now: a repetition's span of it is [size before, size after]."""
    try:
        return os.path.getsize(s.logf)
    except OSError:
        return 0


def watch(run: ProofRun, s: Server):
    """At a repetition's start: the server's /metrics and log size now; the function returned gives the
    repetition's metrics_before, metrics_after and log_span at its end."""
    before, log0 = metrics(run.port, None), log_size(s)
    return lambda: {"metrics_before": before, "metrics_after": metrics(run.port, None), "log_span": [log0, log_size(s)]}


def only(configs: list) -> list:
    """The config names TRAFFIC51_ONLY gives (comma-separated, blanks aside; none: every config), each one of
    `configs`: a misspelt name would run nothing, silently, so it stops the phase, and gpu_proof.sh asks before the
    build."""
    names = [n.strip() for n in os.environ.get("TRAFFIC51_ONLY", "").split(",") if n.strip()]
    unknown = set(names) - {c["name"] for c in configs}
    if unknown:
        raise SystemExit(f"TRAFFIC51_ONLY names no config of the plan: {', '.join(sorted(unknown))}")
    return names


def done(out: list, item: dict) -> bool:
    """Whether the results hold a complete record of this config (its name, planned argv and environment)."""
    return any(r.get("complete") and r["name"] == item["name"] and r.get("plan_args") == item["args"]
               and r.get("env") == item.get("env") for r in out)


def replays(run: ProofRun, t: dict, item: dict, r: dict, s: Server, cgroup: str | None) -> None:
    from bench.traffic import driver
    from bench.traffic.model import params_from, schedule

    p = params_from(item["traffic"])
    driver.calibrate(p, run.port, n=1)  # warm-up: one request
    if item.get("calibrate"):
        p = replace(p, turn_s=round(driver.calibrate(p, run.port), 3))
    r["params"] = asdict(p)
    pid = s.p.pid
    for rep in range(t.get("runs", 1)):
        marks = watch(run, s)
        sampler, t0 = HostSampler(pid, cgroup), time.time()
        got = driver.replay(schedule(replace(p, seed=p.seed + rep)), run.port)
        got.update(rep=rep, seconds=round(time.time() - t0, 2), peak=sampler.stop(), mem=proc_mem(pid), **marks())
        r["reps"].append(got)
        say("traffic51", item["name"], rep, got["seconds"], got["summary"], "peak", got["peak"].get("VmRSS"),
            (got["peak"].get("cgroup") or {}).get("cg_unreclaimable"))
        run.save()


def rounds(run: ProofRun, t: dict, item: dict, r: dict, s: Server, cgroup: str | None) -> None:
    from bench.gpu.proof.serving import one_round
    from bench.gpu.proof.runner import wall_rate

    one_round(run, 1, 8, 32, 9900)  # warm-up
    for rep in range(t.get("runs", 1)):
        for plen, tokens in item["shapes"]:
            marks, sampler = watch(run, s), HostSampler(s.p.pid, cgroup)
            recs = one_round(run, item["streams"], tokens, plen, 5100 + 100 * rep + plen % 97)
            r["reps"].append({"rep": rep, "streams": item["streams"], "prompt": plen, "tokens": tokens, "recs": recs,
                              "peak": sampler.stop(), **marks()})
            say("traffic51", item["name"], rep, plen, tokens, wall_rate(recs))
            run.save()


def traffic(run: ProofRun, build: str, key: str = "traffic51") -> None:
    """`traffic51:BUILD`: each config's records (replays: bench.traffic.driver.replay per request and its
    summary, the schedule's params and fingerprint; rounds: every request's TTFT and token times), the
    server's host memory (VmRSS and its cgroup's charge) peak a repetition against its plan."""
    out = run.results.setdefault(key, [])
    t = run.plan[key]
    if t["build"] != build:
        return
    names = only(t["configs"])
    for item in t["configs"]:
        if done(out, item):
            say("traffic51", item["name"], "done in an earlier call: skipped")
            continue
        if names and item["name"] not in names:
            say("traffic51", item["name"], "not in TRAFFIC51_ONLY: skipped")
            continue
        cgroup, why = None, None
        if item.get("memory_max_mib"):
            try:
                cgroup = make_cgroup(f"t51-{item['name']}", item["memory_max_mib"])
            except OSError as e:  # no writable cgroup v2 here: the process's figures alone, and why
                why = repr(e)
        model = os.path.join(run.a.models, item["model"]) if item.get("model") else None
        s = run.server(build, item["name"], item["args"], model=model, cgroup=cgroup, env=item.get("env"))
        r = {"name": item["name"], "part": item.get("part"), "kind": item.get("kind", "traffic"), "env": item.get("env"),
             "model": item.get("model"), "build": build, "plan_args": item["args"], "args": s.args, "healthy": s.ok,
             "load_s": s.load_s, "complete": False, "reps": [], "started": time.time(),
             **{k: item[k] for k in ("planned_mib", "planned_held_mib", "memory_max_mib", "estimate_s") if k in item},
             **({"cgroup_load": cgroup_mem(cgroup), "cgroup_error": why} if item.get("memory_max_mib") else {})}
        out.append(r)  # in the results from its start; every repetition saved as it ends
        try:
            if s.ok:
                time.sleep(2)
                r["mem_load"] = proc_mem(s.p.pid)
                (rounds if item.get("kind") == "rounds" else replays)(run, t, item, r, s, cgroup)
                r["complete"] = True
        finally:
            r["alive_at_end"] = s.p.poll() is None  # not killed by its cgroup's ceiling
            r["cgroup_end"] = cgroup_mem(cgroup)
            r["seconds"] = round(time.time() - r["started"], 1)
            s.stop()
            r["log"] = run.loglines(s)
            r["log_file"] = os.path.basename(s.logf)  # whole, in logs.tgz: gpu_proof.sh packs it on every call
            if cgroup:
                try:
                    os.rmdir(cgroup)
                except OSError:
                    pass
            run.save()
