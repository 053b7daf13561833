"""The result contract, rollback decision, golden probe, fleet lock and fleet plan: the pure
parts of 'a rollout never reports a false pass'."""
import json
import os
import subprocess
import sys
import time

import pytest

from voltafleet.state import fleetplan, records, rollback
from voltafleet.models import probe
from voltafleet.front.gateway import configured_servers, fleet_backends
from voltafleet.state.lock import FleetLock, LockHeld
from voltafleet.state.runctx import RunContext, RunDir, new_id


# ---------------------------------------------------------------- records


def test_a_record_round_trips_and_only_its_own_run_counts(tmp_path):
    d = RunDir(tmp_path)
    r = records.Outcome(host="h1", run="run-a", status="rolled_back", reason="line one\n  line two",
                        release="fp1", restarted=[0])
    d.write(r)
    back = d.read(records.Outcome, "h1", "run-a")
    assert back == r and back.status == "rolled_back" and back.reason == "line one line two" and back.restarted == [0]
    assert d.read(records.Outcome, "h1", "run-b") is None          # another run's record is not this run's
    assert d.read(records.Outcome, "h2", "run-a") is None          # no record
    (tmp_path / "outcome-h3.json").write_text("{not json")
    assert d.read(records.Outcome, "h3", "run-a") is None          # unreadable
    with pytest.raises(ValueError, match="status"):
        records.Outcome(host="h", run="r", status="ok")


def test_reasons_are_one_line_and_bounded():
    assert records.one_line("a\nb\tc") == "a b c"
    assert len(records.one_line("x" * 1000)) == 300


def test_run_ids_are_unique_within_one_second():
    assert len({new_id() for _ in range(200)}) == 200


def test_run_context_reads_the_environment_once_with_defaults():
    ctx = RunContext.from_env({})
    assert (ctx.phase, ctx.rollout, ctx.no_gateway, ctx.smoke_always) == ("all", None, False, False) and ctx.run
    ctx = RunContext.from_env({"VOLTAFLEET_PHASE": "batch", "VOLTAFLEET_RUN": "r", "VOLTAFLEET_NO_GATEWAY": "1",
                               "VOLTAFLEET_LOCK_OWNER": "42", "VOLTAFLEET_PROBE": "record"})
    assert (ctx.phase, ctx.run, ctx.no_gateway, ctx.lock_owner, ctx.record_probe) == ("batch", "r", True, 42, True)
    with pytest.raises(ValueError, match="VOLTAFLEET_PHASE"):
        RunContext.from_env({"VOLTAFLEET_PHASE": "nope"})


# ---------------------------------------------------------------- rollback


def test_every_failure_after_the_first_change_rolls_back_and_restarts_only_what_it_touched():
    facts = rollback.Facts(has_good=True, rollback=True, instances=[0, 1])
    for phase in rollback.PHASES:
        steps = rollback.decide(rollback.Failure(phase, "x", restarted=[0]), facts)
        assert [s.action for s in steps] == ["restore", "restart", "smoke", "ready"]
        assert [s.instance for s in steps if s.action == "restart"] == [0]  # instance 1 never left rotation
    both = rollback.decide(rollback.Failure("smoke", "x", restarted=[1, 0]), facts)
    assert [s.instance for s in both if s.action == "restart"] == [0, 1]
    # a drain that failed before any restart: the files go back, nothing restarts
    assert [s.action for s in rollback.decide(rollback.Failure("drain", "x", restarted=[]), facts)] == \
        ["restore", "smoke", "ready"]


def test_no_rollback_without_a_good_snapshot_or_when_off():
    f = rollback.Failure("restart", "x")
    assert rollback.decide(f, rollback.Facts(has_good=False, rollback=True, instances=[0])) == []
    assert "nothing to roll back to" in rollback.why_not(rollback.Facts(False, True, [0]))
    assert rollback.decide(f, rollback.Facts(has_good=True, rollback=False, instances=[0])) == []
    assert "smoke_rollback is off" in rollback.why_not(rollback.Facts(True, False, [0]))
    assert rollback.outcome_status([], None) == "failed"
    assert rollback.outcome_status([rollback.Step("restore")], False) == "failed"
    assert rollback.outcome_status([rollback.Step("restore")], True) == "rolled_back"


def test_the_likely_cause_is_the_servers_own_last_error_line():
    log = ["main: loading model", "error: invalid argument: --rope-scaling bogus", "usage: ...",
           "llama-server@0.service: Main process exited, code=exited, status=1/FAILURE"]
    assert rollback.last_error(log) == "error: invalid argument: --rope-scaling bogus"
    assert rollback.likely_cause(["all good"], True) is None
    oom = ["ggml_backend_cuda_buffer_type_alloc_buffer: allocating 16400.00 MiB on device 0: "
           "cudaMalloc failed: out of memory"]
    assert "cuda_toolkit_version: \"12.8\"" in rollback.likely_cause(oom, plan_fits=True)
    assert "12.8" not in rollback.likely_cause(oom, plan_fits=False)  # a plan that does not fit: no such hint


# ---------------------------------------------------------------- golden probe


def test_golden_probe_is_keyed_by_model_and_settings(tmp_path):
    sha = "ab" * 32
    assert probe.key(sha, "p", 16) != probe.key(sha, "p", 8) != probe.key("cd" * 32, "p", 16)
    with pytest.raises(probe.ProbeError, match="no golden probe .* --record-probe"):
        probe.load(sha, "p", 16, tmp_path)
    with pytest.raises(probe.ProbeError, match="model_sha256"):
        probe.load(None, "p", 16, tmp_path)
    with pytest.raises(probe.ProbeError, match="no tokens"):
        probe.save(sha, "p", 16, {"tokens": [], "logprobs": []}, "h", tmp_path)
    probe.path(sha, "p", 16, tmp_path).write_text(json.dumps({"tokens": [], "logprobs": []}))
    with pytest.raises(probe.ProbeError, match="empty"):
        probe.load(sha, "p", 16, tmp_path)
    probe.save(sha, "p", 16, {"tokens": [1, 2], "logprobs": [-0.1, -0.2], "text": "x"}, "h", tmp_path)
    assert probe.load(sha, "p", 16, tmp_path)["tokens"] == [1, 2]


def test_probe_compare_never_matches_emptiness():
    gold = {"tokens": [5, 6, 7], "logprobs": [-0.1, -0.2, -0.3]}
    assert probe.compare(gold, {"tokens": [5, 6, 7], "logprobs": [-0.1, -0.25, -0.3]}, 0.5) is None
    assert "token 1 is 9" in probe.compare(gold, {"tokens": [5, 9, 7], "logprobs": [-0.1, -0.2, -0.3]}, 0.5)
    assert "differs by 0.900" in probe.compare(gold, {"tokens": [5, 6, 7], "logprobs": [-1.0, -0.2, -0.3]}, 0.5)
    assert "2 probe tokens" in probe.compare(gold, {"tokens": [5, 6], "logprobs": [-0.1, -0.2]}, 0.5)
    assert probe.compare({"tokens": []}, {"tokens": [1], "logprobs": [0]}, 0.5) == "the golden probe is empty"
    assert probe.compare(gold, None, 0.5) == "no probe tokens from this instance"
    assert probe.compare(gold, {"tokens": [5, 6, 7], "logprobs": [None, -0.2, -0.3]}, 0.5) == "log-probabilities missing"


def test_a_nan_probe_never_matches():
    # NaN logits (FP16 overflow on Volta's cuBLAS path) give NaN log-probabilities: abs(NaN - x) > tol is False
    gold = {"tokens": [5, 6, 7], "logprobs": [-0.1, -0.2, -0.3]}
    why = probe.compare(gold, {"tokens": [5, 6, 7], "logprobs": [-0.1, float("nan"), -0.3]}, 0.5)
    assert why and "token 1 is nan" in why and "NaN" in why
    assert "inf" in probe.compare(gold, {"tokens": [5, 6, 7], "logprobs": [float("-inf"), -0.2, -0.3]}, 0.5)


def test_the_long_probe_must_reach_the_64_token_path():
    from tests.fixture_vars import all_yml_settings

    cfg = all_yml_settings(smoke_probe=True, smoke_probe_prompt="p", smoke_probe_tokens=4, smoke_probe_long=True,
                           smoke_probe_long_min_tokens=512)
    short, long_ = probe.probes(cfg)
    assert (short.name, short.prompt, short.min_prompt_tokens) == ("probe", "p", 0)
    assert long_.name == "probe_long" and long_.prompt == probe.long_prompt() and long_.min_prompt_tokens == 512
    assert len(long_.prompt.split()) > 400  # ~600+ tokens in the lab's and Qwen's tokenizers (checked on the lab)
    assert probe.probes(cfg.replace(smoke_probe_long=False)) == [short]
    assert probe.probes(cfg.replace(smoke_probe=False)) == []
    gold = {"tokens": [5, 6], "logprobs": [-0.1, -0.2]}
    ok = {"tokens": [5, 6], "logprobs": [-0.1, -0.2], "prompt_n": 640}
    assert probe.check(gold, ok, 0.5, long_) is None
    assert "fewer than smoke_probe_long_min_tokens (512)" in probe.check(gold, {**ok, "prompt_n": 100}, 0.5, long_)
    assert "None tokens" in probe.check(gold, {**ok, "prompt_n": None}, 0.5, long_)
    assert probe.check(gold, {**ok, "tokens": [5, 9]}, 0.5, long_) == "long probe: token 1 is 9, the golden probe's is 6"
    assert probe.check(gold, {**ok, "tokens": [5, 9]}, 0.5, short) == "token 1 is 9, the golden probe's is 6"
    assert probe.check(gold, {**ok, "prompt_n": 3}, 0.5, short) is None  # the short probe has no minimum


# ---------------------------------------------------------------- lock


HOLD = """
import sys, time
sys.path.insert(0, {repo!r})
from voltafleet.state.lock import FleetLock
lock = FleetLock({path!r}, "holder").acquire()
print("held", flush=True)
time.sleep(30)
"""


def test_a_second_rollout_refuses_naming_the_holder(tmp_path):
    path = tmp_path / "fleet.lock"
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    holder = subprocess.Popen([sys.executable, "-c", HOLD.format(repo=repo, path=str(path))], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        with pytest.raises(LockHeld, match=f"pid {holder.pid} .* since .*holder"):
            FleetLock(path, "second").acquire()
        assert time.monotonic() - t0 < 2  # at once, not after a wait
        assert FleetLock(path, "child").acquire(allow_pid=holder.pid).fd is None  # the driver's own batch
    finally:
        holder.kill()
        holder.wait()
    lock = FleetLock(path, "third").acquire()  # the holder died: its lock is stale, taken over
    assert lock.warning and f"pid {holder.pid}" in lock.warning and "gone" in lock.warning
    lock.release()
    lock = FleetLock(path, "fourth").acquire()  # released cleanly: no warning
    assert lock.warning is None
    lock.release()


DRIVER = """
import subprocess, sys, time
sys.path.insert(0, {repo!r})
from voltafleet.state.lock import FleetLock
lock = FleetLock({path!r}, "python -m rollout inventory/x.py").acquire()
# as rollout/runner.py starts each pyinfra run: its own process group, the lock's descriptor passed on
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=(lock.fd,),
                         start_new_session=True)
print(child.pid, flush=True)
time.sleep(60)
"""


def test_a_killed_drivers_lock_stays_held_while_its_pyinfra_run_runs(tmp_path):
    """issue 28: SIGKILL the driver mid-batch: its pyinfra run goes on changing hosts, so a second
    rollout must not take the lock over as stale; it may once that run has ended."""
    import signal

    path = tmp_path / "fleet.lock"
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    driver = subprocess.Popen([sys.executable, "-c", DRIVER.format(repo=repo, path=str(path))], stdout=subprocess.PIPE,
                              text=True)
    child = int(driver.stdout.readline())
    try:
        driver.kill()
        driver.wait()
        with pytest.raises(LockHeld, match="started: that driver is gone, its run still changes hosts"):
            FleetLock(path, "second").acquire()
    finally:
        os.kill(child, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            lock = FleetLock(path, "third").acquire()
            break
        except LockHeld:
            time.sleep(0.1)
    assert lock.warning and "gone" in lock.warning  # the run ended: now the stale lock is taken over
    lock.release()


def test_the_fleet_is_its_set_of_hosts():
    assert FleetLock.for_hosts(["a", "b"], "x").path == FleetLock.for_hosts(["b", "a", "a"], "y").path
    assert FleetLock.for_hosts(["a"], "x").path != FleetLock.for_hosts(["a", "b"], "x").path


# ---------------------------------------------------------------- fleet plan and gateway backends


def test_fleet_plan_round_trips_and_elects_one_builder_per_fingerprint():
    servers = [fleetplan.ServerEntry("h1", "10.0.0.1", (8080, 8081), 4, "fpA"),
               fleetplan.ServerEntry("h2", "10.0.0.2", (8080,), 4, "fpA"),
               fleetplan.ServerEntry("h3", "10.0.0.3", (8080,), 4, "fpB"),
               fleetplan.ServerEntry("h4", "10.0.0.4", (8080,), 4, None)]
    plan = fleetplan.with_servers(fleetplan.FleetPlan("r", commits={fleetplan.commit_key("git://x", "main"): "c" * 40},
                                                      model_bytes={"http://m/x.gguf": 12}), servers)
    back = fleetplan.FleetPlan.from_json(plan.to_json())
    assert back == plan and back.builders == {"fpA": "h1", "fpB": "h3"}
    assert back.commit("git://x", "main") == "c" * 40 and back.commit("git://x", "dev") is None
    assert back.server("h2").ports == (8080,)


HAPROXY = """global
    maxconn 100
backend llama
    balance leastconn
    server h1-0 10.0.0.1:8080 check
    server h1-1 10.0.0.1:8081 check
    server h2-0 10.0.0.2:8080 check
backend other
    server h2-9 10.0.0.2:9999 check
"""


def test_a_host_missing_from_a_run_keeps_its_backends():
    live = configured_servers(HAPROXY)
    assert live == [("h1-0", "10.0.0.1", 8080, 0, "throughput"), ("h1-1", "10.0.0.1", 8081, 0, "throughput"),
                    ("h2-0", "10.0.0.2", 8080, 0, "throughput")]
    got = fleet_backends([("h1", "10.0.0.1", [8080, 8081])], ["h2"], live)
    assert [(b.name, b.port) for b in got] == [("h1-0", 8080), ("h1-1", 8081), ("h2-0", 8080)]
    # a host named like a prefix of another keeps only its own
    assert [b.name for b in fleet_backends([], ["h1"], live + [("h1x-0", "x", 1, 0, "throughput")])] == ["h1-0", "h1-1"]
    # a kept backend keeps its slot cap
    assert configured_servers("backend llama\n    server h3-0 10.0.0.3:8080 check maxconn 4\n") == [
        ("h3-0", "10.0.0.3", 8080, 4, "throughput")]
    assert configured_servers("backend llama\n    server h3-0 10.0.0.3:8080 check maxconn 4 weight 64\n") == [
        ("h3-0", "10.0.0.3", 8080, 4, "throughput")]  # affinity's ring weight after it


def test_a_host_missing_from_a_run_keeps_its_tier():
    """issue 41: an unreachable host of the latency tier stays in the latency tier's backend."""
    live = configured_servers(HAPROXY + "backend llama_latency\n    server h4-0 10.0.0.4:8080 check maxconn 2\n"
                              "backend vf_teams\n    server x-0 10.0.0.9:1 check\n")
    assert live[-1] == ("h4-0", "10.0.0.4", 8080, 2, "latency") and len(live) == 4
    got = fleet_backends([("h1", "10.0.0.1", [8080], 16, "throughput")], ["h4"], live)
    assert [(b.name, b.slots, b.tier) for b in got] == [("h1-0", 16, "throughput"), ("h4-0", 2, "latency")]


# ---------------------------------------------------------------- issue 31: one run contract

def test_the_driver_and_the_roles_spell_no_name_of_the_run_contract():
    """Every environment variable and record file between python -m rollout and deploy.py is
    spelled in voltafleet/state/runctx.py only: the driver, deploy.py and the roles go through
    RunContext.to_env/from_env and RunDir (a stray literal is a second spelling to drift)."""
    import re
    from pathlib import Path

    from voltafleet.state.runctx import ENV, RunDir

    root = Path(__file__).resolve().parents[2]
    files = [root / "deploy.py", *sorted((root / "rollout").glob("*.py")), *sorted((root / "roles").rglob("*.py")),
             *[p for p in sorted((root / "voltafleet").rglob("*.py")) if p.name != "runctx.py"]]
    env_literal = re.compile(r"""["'](%s)["']""" % "|".join(ENV.values()))
    record_literal = re.compile(r"""["'/](%s)-(\{|\*)""" % "|".join(RunDir.KINDS))
    found = []
    for f in files:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if env_literal.search(line) or record_literal.search(line):
                found.append(f"{f.relative_to(root)}:{n}: {line.strip()}")
    assert found == []
    assert len(files) > 40  # the scan read the tree


def test_the_contract_round_trips_and_its_records_are_atomic_and_run_checked(tmp_path):
    from dataclasses import replace

    from voltafleet.state.fleetplan import ServerEntry
    from voltafleet.state.runctx import RunContext, RunDir

    ctx = RunContext(phase="tune", run="r2", rollout="x", batch="tune-1", report_dir=str(tmp_path),
                     smoke_always=True, no_gateway=True, record_probe=True, lock_owner=7, vars_file="/v.yml")
    assert RunContext.from_env(ctx.to_env()) == ctx and ctx.holds_drained
    assert "VOLTAFLEET_NO_GATEWAY" not in replace(ctx, no_gateway=False).to_env()  # the driver's own env stays
    d = RunDir(tmp_path)
    d.write(records.Preflight(host="gpu/01", run="r2", address="a", ports=(8080, 8081), slots=4))
    assert d.file("preflight", "gpu/01").name == "preflight-gpu_01.json" == d.file(records.Preflight, "gpu/01").name
    assert records.entry(d.read(records.Preflight, "gpu/01", "r2")) == ServerEntry("gpu/01", "a", (8080, 8081), 4)
    assert d.read(records.Preflight, "gpu/01", "r1") is None and records.entry(None) is None  # another run's: none
    (tmp_path / "smoke-bad.json").write_text("{half")
    assert d.read(records.Smoke, "bad") is None and [r.host for r in d.all(records.Preflight)] == ["gpu/01"]
    for raw in (lambda: d.all("preflight"), lambda: d.read("preflight", "gpu/01")):  # typed records only
        with pytest.raises(TypeError, match="pass the record class"):
            raw()
    assert not list(tmp_path.glob(".*.tmp"))
    with pytest.raises(ValueError):
        d.file("secrets", "h")


# every record kind's fields and their types: what a reader may rely on (docs/records.md). A change
# here is a change of the contract between deploy.py's roles and their readers.
FIELDS = {
    "preflight": {"host": str, "run": str, "address": str, "ports": tuple[int, ...], "slots": int,
                  "fingerprint": str | None, "tier": str, "refusals": tuple[str, ...]},
    "smoke": {"host": str, "run": str, "passed": bool, "failures": list[str], "instances": list[dict],
              "timings": records.Timings, "fingerprint": str | None, "batch": str | None, "time": str, "epoch": float,
              "flags": list[str], "thresholds": dict, "judged": dict, "disagreements": list[str],
              "probe_only_failures": bool, "probe_diverged": str | None, "gpu_health": dict | None, "rolled_back": bool,
              "after_rollback": dict | None},
    "outcome": {"host": str, "run": str, "status": str, "reason": str, "rollout": str | None, "batch": str | None,
                "release": str | None, "flags": list, "model_sha256": str | None, "probe": str | None,
                "ttft_ms": float | None, "ttft_p50_ms": float | None, "ttft_p99_ms": float | None,
                "single_tps": float | None, "aggregate_tps": float | None, "restarted": list, "streams_cut": int,
                "converged": bool, "time": float},
    "tune": {"host": str, "run": str, "status": str, "reason": str, "probe": str | None, "reps": list[dict],
             "loaded_mib": float | None, "after_load_mib": float | None, "planned_mib": float | None,
             "planned_static_mib": float | None, "gpu": dict | None},
    "profile": {"host": str, "run": str, "kind": str, "ok": bool, "lines": list[str], "reason": str},
    "build": {"host": str, "run": str, "fingerprint": str, "built": bool, "seconds": float | None, "source": str},
    "fetch": {"host": str, "run": str, "downloads": tuple[records.Download, ...]},
    "plan": {"host": str, "refusals": list, "warnings": list, "fingerprint": str | None, "release_key": str | None,
             "current": str | None, "present": bool, "shared": bool, "toolchain": list, "flags": dict, "unit": bool,
             "downloads": list, "driver": str | None, "driver_why": str, "driver_managed": bool, "restart": list,
             "restart_why": list, "retire": list, "instances": int, "smoke": bool, "probe": bool, "constants": dict,
             "resources": list, "run": str},
}
NESTED = {records.Timings: {"drain_s": list[float], "restart_s": list[float], "smoke_s": float | None},
          records.Download: {"dest": str, "bytes": int, "seconds": float}}
# a value of each type that is not of the field's type
WRONG = {str: 5, int: "5", float: "5", bool: "yes", list: "x", dict: ["x"], tuple: "x"}


def wrong(tp):
    """A JSON value that a field of type `tp` must refuse."""
    import typing
    from dataclasses import is_dataclass

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if args and type(None) in args:  # X | None: a wrong X
        return wrong(next(a for a in args if a is not type(None)))
    if origin in (list, tuple) and args and args[0] is not dict:
        return [wrong(args[0])]  # a list of the wrong items
    if is_dataclass(tp):
        return {f: wrong(t) for f, t in NESTED[tp].items()}
    return WRONG[origin or tp]


def example(kind) -> dict:
    """A record of `kind` with every field set, as JSON has it."""
    from dataclasses import asdict

    out = {"host": "gpu/01", "run": "r1"}
    extra = {"preflight": dict(address="10.0.0.1", ports=[8080, 8081], slots=4, fingerprint="fp", tier="latency",
                               refusals=["gpu/01: does not fit. Fix: a smaller model"]),
             "smoke": dict(passed=False, failures=["instance 0: TTFT 9000 ms"], instances=[{"port": 8080, "instance": 0}],
                           timings={"drain_s": [0.5], "restart_s": [3.1, 2], "smoke_s": 12.5}, fingerprint="fp",
                           batch="0", time="2026-01-01T00:00:00+0000", epoch=1.5, flags=["-c", "8192"],
                           thresholds={"smoke_max_ttft_ms": 2000}, judged={"0": {"single_tps": 30.0}},
                           disagreements=["instance 0: ..."], probe_only_failures=False, probe_diverged=None,
                           gpu_health={"gpus": []}, rolled_back=True, after_rollback={"passed": True}),
             "outcome": dict(status="rolled_back", reason="why", rollout="x", batch="1", release="fp", flags=["-c"],
                             model_sha256="a" * 64, probe="match", ttft_ms=10.5, ttft_p50_ms=11, ttft_p99_ms=12,
                             single_tps=30.0, aggregate_tps=80.0, restarted=[0], streams_cut=1, converged=False,
                             time=1.5),
             "tune": dict(status="measured", reason="", probe="match", reps=[{"throughput_tps": 80.0}], loaded_mib=1000,
                          after_load_mib=1100.5, planned_mib=1200.0, planned_static_mib=900.0, gpu={"name": "H200"}),
             "profile": dict(kind="server", ok=True, lines=["a", "b"], reason=""),
             "build": dict(fingerprint="fp", built=True, seconds=228, source=""),
             "fetch": dict(downloads=[{"dest": "/m/a.gguf", "bytes": 3 * 2**20, "seconds": 1.5}]),
             "plan": {**asdict(records.HostChange(host="x", refusals=["r"], flags={0: ["-t 1 -> 2"]}, restart=[0])),
                      "flags": {"0": ["-t 1 -> 2"]}}}
    return {**out, **extra[kind], **({"host": "gpu/01", "run": "r1"})}


def test_every_record_kind_is_typed_with_its_contracts_fields_and_types(tmp_path):
    """Each RunDir kind has its record class, whose fields and types are the contract's
    (FIELDS); a record of every field reads back equal; a field of another type, or a missing
    required one, makes no record (None), never a record with a default in its place."""
    from dataclasses import MISSING, fields

    assert {k.KIND for k in records.KINDS} == set(RunDir.KINDS) == set(FIELDS)
    for kind in records.KINDS:
        assert records.field_types(kind) == FIELDS[kind.KIND], kind.KIND
        data = example(kind.KIND)
        assert set(data) == set(FIELDS[kind.KIND]), kind.KIND
        rec = kind.of(data)
        assert rec is not None and kind.of(rec.to_dict()) == rec, kind.KIND
        RunDir(tmp_path).write(rec)
        assert RunDir(tmp_path).read(kind, "gpu/01", "r1") == rec and RunDir(tmp_path).read(kind, "gpu/01", "r2") is None
        for name, tp in FIELDS[kind.KIND].items():
            assert kind.of({**data, name: wrong(tp)}) is None, f"{kind.KIND}.{name} took {wrong(tp)!r}"
            with pytest.raises(records.RecordError, match=name):
                kind.make({**data, name: wrong(tp)})
        for f in fields(kind):
            if f.default is MISSING and f.default_factory is MISSING:
                assert kind.of({k: v for k, v in data.items() if k != f.name}) is None, f"{kind.KIND} without {f.name}"
    for cls, want in NESTED.items():
        assert records.field_types(cls) == want


def test_the_records_keep_the_keys_their_readers_read():
    """On disk, the keys the lab tests and people read are the records' (smoke: passed, failures,
    instances, timings; outcome: status, rollout, probe)."""
    assert {"passed", "failures", "instances", "timings"} <= set(FIELDS["smoke"])
    assert {"status", "rollout", "probe", "reason", "release"} <= set(FIELDS["outcome"])


def test_no_role_imports_another_role():
    """A role (roles/<name>/) imports shared modules (roles/*.py) and voltafleet/, never another role."""
    import re
    from pathlib import Path

    roles = Path(__file__).resolve().parents[2] / "roles"
    names = {p.name for p in roles.iterdir() if (p / "__init__.py").exists()}
    found = []
    for role in sorted(names):
        for f in sorted((roles / role).rglob("*.py")):
            for m in re.finditer(r"^\s*(?:from|import) roles\.(\w+)", f.read_text(), re.M):
                if m.group(1) in names and m.group(1) != role:
                    found.append(f"{f.relative_to(roles.parent)} imports roles.{m.group(1)}")
    assert len(names) >= 10 and found == []
