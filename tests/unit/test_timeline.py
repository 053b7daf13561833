"""The timeline model of `python -m rollout --plan` (voltafleet.planning.timeline): which host compiles,
which installs, and how the seconds add up (hosts of a batch in parallel, step by step;
instances of a host one at a time; batches one after the other)."""
import pytest

from tests.fixture_vars import all_yml_settings
from voltafleet.planning.timeline import (COMPILE, INSTALL, KEEP, MIB, MISSING, SWITCH, Constants, Release, Work,
                                 duration, estimate, host_steps, release_actions)

C = Constants(run_s=10, toolchain_s=200, driver_s=300, compile_s=500, ship_s=20, model_mib_s=100, drain_s=4,
              restart_s=6, smoke_s=30, probe_s=3)


def work(host, **kw):
    return Work(host, consts=kw.pop("consts", C), **kw)


def test_compile_is_counted_once_per_fingerprint():
    batches = [["a"], ["b", "c", "d"]]
    rel = {h: Release("fp1") for h in "abc"} | {"d": Release("fp2")}
    acts = release_actions(batches, rel)
    assert {h: a for h, (a, _) in acts.items()} == {"a": COMPILE, "b": INSTALL, "c": INSTALL, "d": COMPILE}
    assert "controller's release cache" in acts["b"][1]  # the canary's compile filled the cache
    w = {h: work(h, release=acts[h][0]) for h in rel}
    est = estimate(batches, w, gateway=False)
    assert est.batches[0].compiles == ["a"] and est.batches[1].compiles == ["d"]
    # batch 1: d compiles (500) while b and c wait, then b and c install (20), then the probe: not 3 compiles
    assert est.batches[1].seconds == 10 + 500 + 20 + 3
    assert sum(b.steps["compile"] for b in est.batches) == 1000


def test_same_batch_hosts_install_from_their_builder_and_the_cache_counts():
    rel = {h: Release("fp1") for h in "abc"}
    acts = release_actions([["a", "b", "c"]], rel)
    assert [acts[h][0] for h in "abc"] == [COMPILE, INSTALL, INSTALL] and "from a" in acts["b"][1]
    acts = release_actions([["a", "b", "c"]], rel, cached={"fp1"})
    assert [acts[h][0] for h in "abc"] == [INSTALL] * 3
    per_host = {h: Release("fp1", shared=False) for h in "ab"}
    assert [a for a, _ in release_actions([["a", "b"]], per_host).values()] == [COMPILE, COMPILE]


def test_a_host_keeps_or_switches_a_release_it_has():
    rel = {"a": Release("fp1", current=True, present=True), "b": Release("fp1", present=True)}
    acts = release_actions([["a", "b"]], rel)
    assert acts["a"][0] == KEEP and acts["b"][0] == SWITCH


def test_a_builder_in_a_later_batch_is_a_missing_release_not_an_install():
    """The fleet plan elects builders in inventory order; a canary that is not the first host
    of its fingerprint would wait for a release nobody built in its run."""
    rel = {h: Release("fp1") for h in "abc"}
    acts = release_actions([["c"], ["a", "b"]], rel, builders={"fp1": "a"})
    assert acts["c"][0] == MISSING and "later batch (1)" in acts["c"][1]
    assert acts["a"][0] == COMPILE and acts["b"][0] == INSTALL
    # a builder that already had it in an earlier batch filled no cache
    rel["a"] = Release("fp1", current=True, present=True)
    acts = release_actions([["a"], ["b"]], rel, builders={"fp1": "a"})
    assert acts["b"][0] == MISSING and "cache lacks it" in acts["b"][1] and "Fix:" in acts["b"][1]


def test_pending_fingerprints_compile_once_per_batch():
    rel = {h: Release("pending-x", pending=True) for h in "abc"}
    acts = release_actions([["a", "b"], ["c"]], rel)
    assert [acts[h][0] for h in "abc"] == [COMPILE, INSTALL, INSTALL]


def test_a_batch_is_the_slowest_host_not_the_sum():
    gib = 1024 * MIB
    w = {"a": work("a", model_bytes=10 * gib, restarts=1, instances=1),
         "b": work("b", model_bytes=20 * gib, restarts=1, instances=1)}
    est = estimate([["a", "b"]], w, gateway=False)
    download_b = 20 * 1024 / 100  # MiB at 100 MiB/s
    assert est.batches[0].steps["model"] == pytest.approx(download_b, abs=0.1)
    assert est.batches[0].seconds == pytest.approx(10 + download_b + 6 + 30, abs=0.1)
    assert est.hosts["a"] < est.hosts["b"] == pytest.approx(est.batches[0].seconds, abs=0.1)


def test_step_by_step_max_is_more_than_any_host_alone():
    """pyinfra waits for every host at each operation: one host's compile and another's
    download do not overlap."""
    w = {"a": work("a", release=COMPILE), "b": work("b", model_bytes=500 * 100 * MIB)}
    est = estimate([["a", "b"]], w, gateway=False)
    assert est.batches[0].seconds == 10 + 500 + 500 + 3  # run, compile, download, b's probe
    assert est.batches[0].seconds > max(est.hosts.values())


def test_instances_restart_one_at_a_time_each_drained():
    w = work("a", restarts=4, instances=4)
    assert host_steps(w, gateway=True)["activate"] == 4 * (4 + 6) + 30
    assert host_steps(w, gateway=False)["activate"] == 4 * 6 + 30   # --no-gateway: no drain
    assert host_steps(work("a", restarts=2, smoke=False), gateway=True)["activate"] == 2 * 10


def test_a_converged_host_is_only_probed():
    steps = host_steps(work("a", instances=8), gateway=True)
    assert steps == {"toolchain": 0, "driver": 0, "compile": 0, "ship": 0, "model": 0, "activate": 3}
    assert host_steps(work("a", probe=False), gateway=True)["activate"] == 0


def test_a_driver_change_drains_every_instance_then_reboots():
    w = work("a", driver=True, instances=8, restarts=8)
    steps = host_steps(w, gateway=True)
    assert steps["driver"] == 8 * 4 + 300 and steps["activate"] == 8 * 10 + 30


def test_total_is_preflight_gateway_and_batches_in_sequence():
    w = {h: work(h, restarts=1, instances=1) for h in "abc"}
    est = estimate([["a"], ["b"], ["c"]], w, gateway=True)
    one = 10 + 4 + 6 + 30
    assert [b.seconds for b in est.batches] == [one] * 3
    assert est.total_s == 10 + 10 + 3 * one
    assert estimate([["a"], ["b"], ["c"]], w, gateway=False).gateway_s == 0


def test_refused_hosts_count_for_nothing_and_constants_are_per_host():
    slow = Constants(**{**C.__dict__, "restart_s": 100})
    w = {"a": work("a", restarts=1, instances=1), "b": work("b", restarts=1, instances=1, consts=slow)}
    est = estimate([["a", "b", "refused"]], w, gateway=False)
    assert est.batches[0].seconds == 10 + 100 + 30 and "refused" not in est.hosts


def test_constants_come_from_plan_variables():
    cfg = all_yml_settings(**{f"plan_{k}": v for k, v in C.__dict__.items()})
    assert Constants.from_cfg(cfg) == C
    assert Constants.from_dict({"compile_s": 7, "unknown": 1}).compile_s == 7


def test_durations_read_well():
    assert [duration(s) for s in (None, 4.6, 65, 3725)] == ["-", "5 s", "1 min 05 s", "1 h 02 min"]
