"""bench/lab/affinity.py's pure parts: the users' pauses (the same in every mode), the bounded-load check
sample by sample, and the summary the README and bench/RESULTS.md quote, recomputed from the raw
per-turn records kept in bench/records/affinity-records/."""
import json
import statistics
from pathlib import Path

import pytest

from bench.lab import affinity as af

ROOT = Path(__file__).resolve().parents[2]
# the records made since the bench counts reprocessed logs (8users-no-think.json is older)
RECORDS = sorted(p for p in (ROOT / "bench/records/affinity-records").glob("*.json") if p.name != "8users-no-think.json")


def test_a_conversation_pauses_the_same_in_every_mode():
    assert af.think_s("0102-off0-7", 2, 4.0) == af.think_s("0102-on1-7", 2, 4.0)
    assert af.think_s("0102-off0-7", 2, 4.0) != af.think_s("0102-off0-7", 3, 4.0)
    assert af.think_s("0102-off0-7", 2, 4.0) != af.think_s("0102-off0-8", 2, 4.0)
    assert af.think_s("x-1", 1, 0) == 0.0
    draws = [af.think_s(f"x-{n}", t, 4.0) for n in range(200) for t in range(1, 5)]
    assert 3.4 < statistics.mean(draws) < 4.6 and min(draws) >= 0


@pytest.mark.parametrize("sample, over", [
    ({"a": 2, "b": 1, "c": 1, "d": 1, "e": 1, "f": 2}, False),  # 8 over 6: 1.25 x 1.33 -> 2 allowed
    ({"a": 3, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1}, True),
    ({"a": 1, "b": 0, "c": 0, "d": 0, "e": 0, "f": 0}, False),  # never below one request
    ({"a": 2, "b": 0, "c": 0, "d": 0, "e": 0, "f": 0}, True),
    ({"a": 5, "b": 4, "c": 4, "d": 4, "e": 4, "f": 3}, False),  # 24 over 6: 5 allowed
    ({"a": 6, "b": 4, "c": 4, "d": 4, "e": 3, "f": 3}, True),
])
def test_the_bound_is_the_mean_in_flight_times_the_factor_in_whole_requests(sample, over):
    assert af.over_bound([sample], 125) == ([sample] if over else [])


def test_a_larger_factor_allows_more():
    assert af.over_bound([{"a": 3, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1}], 200) == []


def test_a_failed_conversation_is_counted_in_the_summary():
    run = {"follow_up_ttft_mean_ms": 1, "follow_up_prompt_tokens_mean": 1, "first_turn_ttft_mean_ms": 1,
           "max_over_mean_concurrency": 1, "max_over_mean_requests": 1, "follow_up_log_reprocessed": 0}
    s = af.summary([{"mode": "on", **run, "failed": 2}, {"mode": "on", **run, "failed": 1}, {"mode": "off", **run}])
    assert s["on"]["failed"] == 3 and s["off"]["failed"] == 0


def test_time_averaged_load_and_its_ratio():
    per = af.time_averaged([{"a": 2, "b": 0}, {"a": 1, "b": 1}])
    assert per == {"a": 1.5, "b": 0.5}
    assert af.ratio(per) == 1.5
    assert af.time_averaged([]) == {} and af.ratio({}) is None


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name)
def test_the_recorded_runs_hold_what_their_summary_says(path):
    record = json.loads(path.read_text())
    runs = record["runs"]
    assert {r["mode"] for r in runs} == {"on", "off"}
    for r in runs:
        follow = [t for t in r["turns"] if t["turn"] > 0 and t["ttft_ms"] is not None]
        assert r["follow_up_ttft_mean_ms"] == pytest.approx(statistics.mean(t["ttft_ms"] for t in follow), abs=0.1)
        assert r["follow_up_log_reprocessed"] == sum(1 for t in follow if (t["prompt_n"] or 0) > 500)
        assert r["max_over_mean_requests"] == af.ratio(r["per_instance"])
        assert len(r["turns"]) == record["conversations"] * record["turns"] and not r.get("failed")
        assert r["max_over_mean_concurrency"] == af.ratio(r["concurrency"])
    s = af.summary(runs)
    for mode in ("on", "off"):  # what the record's summary says, recomputed (older ones say less)
        assert {k: s[mode][k] for k in record["summary"][mode]} == record["summary"][mode]
    assert s["follow_up_ttft_ratio"] == round(s["off"]["follow_up_ttft_mean_ms"] / s["on"]["follow_up_ttft_mean_ms"], 2)
