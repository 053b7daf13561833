from voltafleet.smoke import table, verdict


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
    cfg["voltafleet_backend"] = "cpu"
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
