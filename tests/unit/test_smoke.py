import pytest

from voltafleet.measure.smoke import table, verdict


def inst(**kw):
    base = {"instance": 0, "port": 8080, "health_s": 3.0, "offload": {"offloaded": 65, "total": 65},
            "ttft_ms": 120.0, "single_tps": 30.0, "parallel": 4, "errors": [], "aggregate_tps": 70.0}
    return {**base, **kw}


def test_pass(cfg):
    assert verdict({"instances": [inst()]}, cfg) == []


def test_each_threshold_fails_with_its_numbers(cfg):
    fails = verdict({"instances": [inst(ttft_ms=2500, single_tps=10.0, aggregate_tps=20.0)]}, cfg)
    assert fails == [
        "instance 0 (port 8080): time to first token 2500 ms > 2000 ms",
        "instance 0 (port 8080): single-stream 10.0 tok/s < 15",
        "instance 0 (port 8080): 4-way aggregate 20.0 tok/s < 40",
    ]


def test_partial_offload_fails_on_cuda(cfg):
    fails = verdict({"instances": [inst(offload={"offloaded": 20, "total": 65})]}, cfg)
    assert fails == ["instance 0 (port 8080): only 20/65 layers on the GPU"]
    assert "no 'offloaded N/M layers" in verdict({"instances": [inst(offload=None)]}, cfg)[0]


def test_offload_not_judged_on_cpu(cfg):
    cfg = cfg.replace(voltafleet_backend="cpu")
    assert verdict({"instances": [inst(offload=None)]}, cfg) == []


def test_errors_fail(cfg):
    assert verdict({"instances": [{"instance": 1, "port": 8081, "error": "TimeoutError: x"}]}, cfg) == \
        ["instance 1 (port 8081): TimeoutError: x"]
    fails = verdict({"instances": [inst(errors=["HTTP 503"])]}, cfg)
    assert fails == ["instance 0 (port 8080): 1 of 4 parallel streams failed: HTTP 503"]


def test_table_has_a_row_per_instance():
    t = table("gpu-01", {"instances": [inst(), inst(instance=1, port=8081, offload=None)]})
    lines = t.splitlines()
    assert len(lines) == 3 and "65/65" in lines[1] and "n/a" in lines[2]


# ---------------------------------------------------------------- issue 19: graph splits, TTFT percentiles

import json  # noqa: E402
from pathlib import Path  # noqa: E402

from voltafleet.measure.smoke import expected_splits, percentile, splits_problem, textfile, ttft_summary  # noqa: E402
from voltafleet.hostside.smoke_client import graph_splits, offload_from_log  # noqa: E402

PROOF = Path(__file__).resolve().parents[2] / "bench" / "records" / "proof19" / "results.json"


def test_graph_splits_reads_both_forms_of_the_line():
    log = ("0.02.437 I sched_reserve: graph: nodes = 4068, splits = 2, input objects = 5, input tensors = 11\n"
           "I sched_reserve: graph (pp bs=512, tg bs=4): nodes = 4088 / 4000, splits = 2 / 3, input objects = 5\n"
           "load_tensors: offloaded 65/65 layers to GPU\n")
    assert graph_splits(log) == [2, 2, 3]
    assert graph_splits("no such line") == []
    assert offload_from_log(log) == {"offloaded": 65, "total": 65} and offload_from_log(None) is None


def test_splits_expected_per_backend_and_a_fallback_named():
    assert expected_splits(cuda=True) == 2 and expected_splits(cuda=False) == 1
    assert splits_problem([2, 2], cuda=True) is None
    assert splits_problem([1], cuda=False) is None          # the lab's CPU build: one backend
    assert splits_problem(None, cuda=True) is None           # no line: the offload check judges
    why = splits_problem([2, 5], cuda=True)
    assert "splits = 5" in why and "2 expected" in why
    assert splits_problem([5], cuda=True, partial_allowed=True) is None  # layers on the CPU on purpose


def test_verdict_fails_on_a_cpu_fallback_naming_the_figure(cfg):
    fails = verdict({"instances": [inst(splits=[2, 4])]}, cfg)
    assert fails == ["instance 0 (port 8080): the scheduler split the graph 4 times (sched_reserve: splits = 4), "
                     "2 expected for a model served whole on the GPU: an op or layer fell back to the CPU"]
    assert verdict({"instances": [inst(splits=[2])]}, cfg) == []
    cfg = cfg.replace(voltafleet_backend="cpu")
    assert verdict({"instances": [inst(splits=[1], offload=None)]}, cfg) == []


def test_every_h200_load_of_the_proof_logged_two_splits():
    """The recorded log lines of every qwen35 load at -lv 4 on the H200 (bench/records/proof19): 2 splits.
    (The seed's own argv has no -lv 4: llama.cpp does not print the line there.)"""
    res = json.loads(PROOF.read_text())
    seen = [graph_splits("\n".join(r["log"])) for r in res["serve"] + res["vram"] if "--log-verbosity" in r["args"]]
    assert len(seen) == len(res["serve"]) + len(res["vram"]) - 1
    assert all(seen) and {s for x in seen for s in x} == {2}


def test_percentile_is_nearest_rank():
    v = [400, 100, 300, 200]
    assert percentile(v, 50) == 200 and percentile(v, 99) == 400 and percentile(v, 0) == 100
    assert percentile([], 50) is None and percentile([7], 99) == 7
    assert percentile(list(range(1, 101)), 99) == 99


def test_ttft_percentiles_in_table_and_textfile():
    m = inst(parallel_ttft_ms=[500.0, 800.0, 650.0, 2400.0])
    assert ttft_summary(m) == {"single": 120.0, "p50": 650.0, "p99": 2400.0}
    out = table("h1", {"instances": [m]})
    assert "N TTFT p50/p99 ms" in out and "650/2400" in out
    prom = textfile("h1", {"instances": [m], "passed": True, "epoch": 0}, "fp")
    assert 'voltafleet_smoke_parallel_ttft_p99_seconds{host="h1",instance="0",port="8080"} 2.400' in prom


def test_issue_9_loads_mtp_included_logged_two_splits():
    """bench/records/qwen35-h200-run1.json: the VRAM ladder, the V100 argv and MTP speculation (the draft context
    logs its own sched_reserve line) at -lv 4: all 2."""
    res = json.loads((PROOF.parents[1] / "qwen35-h200-run1.json").read_text())
    seen = [graph_splits("\n".join(r["log"])) for k in ("ladder", "mtp") for r in res[k]]
    assert all(seen) and {s for x in seen for s in x} == {2}


def test_a_stream_that_arrives_in_a_burst_gets_a_decode_rate_a_person_can_believe():
    """Issue 40: make demo showed "client 142494.0" tok/s when a busy host scheduled its client late
    and all 128 tokens were read in one burst. The rate is over the request's span less the server's
    prompt time, so a burst reads as the server's pace, and a smooth stream as before."""
    from voltafleet.hostside.smoke_client import client_rate

    # the server: 20 ms of prompt, then 128 tokens at 500 tok/s (256 ms); the client reads them all at the end
    burst = client_rate(t0=0.0, first=0.27599, last=0.276, chunks=128, predicted=128, prompt_ms=20.0)
    assert burst == pytest.approx(500, rel=0.01)
    # a smooth stream: first token at 22 ms, the last 254 ms later
    smooth = client_rate(t0=0.0, first=0.022, last=0.276, chunks=128, predicted=128, prompt_ms=20.0)
    assert smooth == pytest.approx(500, rel=0.01)
    # no server timings: the whole request's span, a lower bound
    assert client_rate(0.0, 0.27599, 0.276, 128, 128, None) == pytest.approx(128 / 0.276)
    assert client_rate(0.0, 0.1, 0.1, 1, 1, 20.0) is None
