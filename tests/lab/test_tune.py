"""Autotune on the canary (issue 29), on the lab fleet: `python -m rollout inventory/lab.py --tune`
measures every setting on the drained canary, writes group_vars/lab.tuned.yml, and the next
rollout uses it; an interrupted tune leaves the canary as it was, and the fleet serves
every request meanwhile (a pooled keep-alive load through the gateway)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bench.lab.load import Load
from tests.lab.helpers import GATEWAY_URL, REPO, env_file, gateway_stat, lab, rollout, run_env
from voltafleet.measure import tune


TUNED = REPO / "group_vars" / f"lab{tune.SUFFIX}"
URL = GATEWAY_URL


@pytest.fixture
def no_tuned_file():
    """The lab group's tuned file exists only during the test (the repository ships none)."""
    assert not TUNED.exists(), f"{TUNED} is left from an earlier run: remove it"
    yield
    TUNED.unlink(missing_ok=True)


def in_rotation(host: str) -> bool:
    rows = gateway_stat(lab()["gateway"])
    return all(rows[f"{host}-{i}"]["status"].startswith("UP") for i in (0, 1))


def test_the_tune_measures_every_setting_and_the_next_rollout_uses_the_winner(converged, no_tuned_file, tmp_path):
    canary = lab()["hosts"][0]
    before = [env_file(canary, i) for i in (0, 1)]
    load = Load(URL, clients=2, tokens=16, seconds=900, max_requests=100000, pause_s=0.1).start()  # the fleet serves meanwhile; more clients only slow the trials on two cores
    run, _ = rollout(["--tune", "--canary", canary["name"]], tmp=tmp_path)
    served = load.stop()
    assert run.rc == 0, run
    print(run.out[-3500:])
    doc = yaml.safe_load(TUNED.read_text())
    trials = doc["trials"]
    assert len(trials) >= 5 and trials[0]["setting"] == "shipped"
    tried = yaml.safe_load((REPO / "group_vars/lab.yml").read_text())["tune_try"]  # the lab tries these kinds only
    assert {tune.KINDS[next(iter(t["values"]))] for t in trials[1:]} == set(tried), [t["setting"] for t in trials]
    measured = [t for t in trials if t["status"] == "measured"]
    assert len(measured) >= 5, [(t["setting"], t["status"], t["verdict"]) for t in trials]
    for t in measured:  # three repetitions each, medians recomputed from the raw figures
        assert len(t["reps"]) == 3
        assert all(r["followups"] > 0 for r in t["reps"])  # conversations continued in every repetition
        # real chats: the history goes back without the thinking, so a follow-up leaves the cached sequence where
        # the last answer began; the hybrid model resumes it from a context checkpoint, or reprocesses it whole
        resumed = [r["followup_cached_p50"] for r in t["reps"]]
        if t["values"].get("server_ctx_checkpoints") == 0:
            assert resumed == [0, 0, 0], (t["setting"], resumed)
        elif t["values"].get("server_cache_ram") == 0:
            # no host-RAM cache: a conversation whose slot another client took meanwhile has nothing left to
            # resume from, and how often that happens is the slots' timing (the median follow-up resumed in 0, 1
            # and 2 of 3 repetitions seen): a follow-up that kept its slot resumed, and the server counted what
            # each one reused
            best = [r["followup_cached_max"] for r in t["reps"]]
            assert max(c or 0 for c in best) > 0.5 and all(c is not None for c in resumed), (t["setting"], resumed, best)
        else:
            # the median repetition (with the host-RAM cache a conversation that lost its slot resumes from it)
            assert sorted(c or 0 for c in resumed)[1] > 0.5, (t["setting"], resumed)
        assert all(r["host_peak_mib"] for r in t["reps"])  # the server's host memory, sampled
        tps = sorted(r["throughput_tps"] for r in t["reps"])
        assert t["medians"]["throughput_tps"] == pytest.approx(tps[1])
        assert t["medians"]["peak_mib"] is not None and t["probe"] == "match"  # CPU: the server's peak RSS
    eligible = [t for t in measured if t["verdict"] == "eligible"]
    best = max(eligible, key=lambda t: t["medians"]["throughput_tps"])
    assert doc["chosen"]["setting"] == best["setting"] and doc["values"] == best["values"]
    assert doc["tuned"]["model_sha256"] == lab()["model_sha256"] and len(doc["tuned"]["llama_cpp"]["commit"]) == 40
    assert doc["calibration"]["measured"] is False  # no GPU in the lab: said, not invented
    # the canary is back as it was and serving; the fleet served every request meanwhile
    assert [env_file(canary, i) for i in (0, 1)] == before and in_rotation(canary["name"])
    assert served["requests"] > 0 and served["served"] == served["requests"], served
    # the next rollout: --plan shows the change on every host, then the rollout applies it
    plan, _ = rollout(["--plan"], tmp=tmp_path)
    assert plan.rc == 0, plan
    records = json.loads(Path(re.search(r"(\S+/plan\.json)", plan.out).group(1)).read_text())["records"]
    changed = {h: r["flags"] for h, r in records.items() if r["flags"]}
    assert bool(changed) == bool(doc["values"]) and (not changed or set(changed) == {h["name"] for h in lab()["hosts"]})
    if doc["values"]:
        run2, report = rollout(["--canary", "1", "--batch", "2"], tmp=tmp_path)
        assert run2.rc == 0 and report["ok"], run2
        flag = {"server_spec_ngram": "--spec-type", "server_parallel": "-np", "server_ctx": "-c",
                "server_cache_ram": "--cache-ram", "server_backend_sampling": "--backend-sampling",
                "server_ctx_checkpoints": "--ctx-checkpoints", "server_ubatch": "-ub"}
        for h in lab()["hosts"]:
            args = env_file(h, 0).replace('"', " ").split()
            for key, value in doc["values"].items():
                if value is True:
                    assert flag[key] in args, (h["name"], key, args)
                else:
                    assert args[args.index(flag[key]) + 1] == str(value), (h["name"], key, args)
    TUNED.unlink()  # the fleet back to the shipped values (the converged fixture re-rolls it)


def test_an_interrupted_tune_leaves_the_canary_as_it_was_and_loses_no_request(converged, no_tuned_file, tmp_path):
    canary = lab()["hosts"][0]
    before = [env_file(canary, i) for i in (0, 1)]
    load = Load(URL, clients=2, tokens=16, seconds=900, max_requests=100000, pause_s=0.1).start()  # the fleet serves meanwhile; more clients only slow the trials on two cores
    proc = subprocess.Popen([sys.executable, "-m", "rollout", "inventory/lab.py", "--tune", "--canary", canary["name"]],
                            cwd=REPO, env=run_env(None, None, tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out = []
    deadline = time.monotonic() + 300
    for line in proc.stdout:  # interrupt during the second trial (the canary runs a changed setting)
        out.append(line)
        if "trial 2/" in line:
            time.sleep(3)
            proc.send_signal(signal.SIGINT)
            break
        assert time.monotonic() < deadline, "".join(out)
    out += proc.stdout.readlines()
    rc = proc.wait(timeout=600)
    served = load.stop()
    text = "".join(out)
    assert rc == 128 + signal.SIGINT, text[-3000:]
    assert "restoring" in text and "INTERRUPTED" in text and not TUNED.exists()
    assert [env_file(canary, i) for i in (0, 1)] == before and in_rotation(canary["name"])
    assert served["requests"] > 0 and served["served"] == served["requests"], served
    assert os.environ.get("VOLTAFLEET_VARS") is None


def test_the_workload_can_be_recorded_from_the_fleets_own_logs(converged, no_tuned_file, tmp_path):
    """--profile-hours: the tune's prompt, answer, clients and follow-up share read from the gateway's log
    and the canary's servers' journals of the window, before the canary is touched (the budget here lets
    only the shipped setting run: the profile's part is what is checked)."""
    canary = lab()["hosts"][0]
    before = [env_file(canary, i) for i in (0, 1)]
    started = time.time()
    load = Load(URL, clients=4, tokens=24, seconds=15, max_requests=100000).start()  # 24: no other lab client's length
    time.sleep(15)
    served = load.stop()
    assert served["served"] == served["requests"] > 60, served
    # the window holds this test's traffic alone: the canary's requests of an earlier test (a tune trial's, 16
    # tokens) would otherwise weigh in, as they did once when the tests before ran faster
    hours = round((time.time() - started + 3) / 3600, 4)
    run, _ = rollout(["--tune", "--canary", canary["name"], "--profile-hours", str(hours), "--budget", "0.01"],
                     tmp=tmp_path)
    assert run.rc == 0, run
    assert "workload recorded from the logs" in run.out, run.out[-3000:]
    doc = yaml.safe_load(TUNED.read_text())
    src, w = doc["tuned"]["workload_from"], doc["tuned"]["workload"]
    assert src["requests"] >= 20 and src["gateway_lines"] >= 20 and f"{hours:g} h" in src["source"]
    assert w["answer_tokens"] == 24 and 1 <= w["clients"] <= 4 and w["prompt_tokens"] > 0  # the traffic's, not tune_*'s
    # the load repeats one short prompt, which the hybrid model's slots did not reuse (its checkpoint is invalidated:
    # `cached n_tokens = 0` in the journals), so its requests are not follow-ups
    assert w["followup_share"] < 0.5
    run_dir = Path(re.search(r"; records in (\S+)\s*$", run.out, re.M).group(1))
    trial0 = yaml.safe_load((run_dir / "trial-0.yml").read_text())
    assert trial0["tune_answer_tokens"] == 24 and trial0["tune_clients"] == w["clients"]  # the trial ran that workload
    assert [t["status"] for t in doc["trials"]][0] == "measured" and doc["trials"][0]["reps"][0]["requests"] == \
        yaml.safe_load((REPO / "group_vars" / "lab.yml").read_text())["tune_requests"]
    assert [env_file(canary, i) for i in (0, 1)] == before and in_rotation(canary["name"])
