from tests.gpu_fixtures import health, host_query
from voltafleet.planning import hostplan as plan
from voltafleet.planning.hostplan import HostFacts

V100 = {"index": 0, "name": "Tesla V100-SXM2-16GB", "compute_cap": "7.0", "memory_mib": 16384,
        "driver_version": "580.95.05"}
GIB = 1024 ** 3


def gpus(n, cap="7.0"):
    return [{**V100, "index": i, "compute_cap": cap} for i in range(n)]


def facts(**kw):
    base = {"os": "debian-12", "gpus": gpus(8), "nvcc": None, "free_model": 100 * GIB,
            "free_root": 100 * GIB, "same_fs": True, "model_present": False, "model_bytes": 15 * GIB,
            "gpu_health": health(host_query(8))}
    return HostFacts(**{**base, **kw})


def test_one_instance_per_gpu_with_consecutive_ports(cfg):
    inst = plan.instances(cfg, gpus(8))
    assert [(i.index, i.port) for i in inst] == [(n, 8080 + n) for n in range(8)]
    assert inst[3].unit == "llama-server@3.service"


def test_instances_capped_by_setting_and_cpu_count(cfg):
    cfg = cfg.replace(server_instances=2)
    assert len(plan.instances(cfg, gpus(8))) == 2
    cfg = cfg.replace(voltafleet_backend="cpu")
    assert len(plan.instances(cfg, [])) == 2


def test_cuda_archs_from_the_host_unless_set(cfg):
    assert plan.cuda_archs(cfg, gpus(2) + gpus(1, "9.0")) == [70, 90]
    cfg = cfg.replace(llama_cpp_cuda_archs=[70])
    assert plan.cuda_archs(cfg, gpus(1, "9.0")) == [70]


def test_preflight_passes_a_good_host(cfg):
    assert plan.host_refusals("gpu-01", cfg, facts()) == []


def test_preflight_refuses_cuda_host_without_gpu(cfg):
    errs = plan.host_refusals("gpu-01", cfg, facts(gpus=[]))
    assert errs == [e for e in errs if e.startswith("gpu-01: ")] and "0 GPUs" in errs[0]


def test_preflight_refuses_unsupported_os(cfg):
    errs = plan.host_refusals("gpu-01", cfg, facts(os="centos-7"))
    assert "OS centos-7 is not one of" in errs[0]


def test_preflight_refuses_too_little_disk_with_numbers(cfg):
    cfg = cfg.replace(preflight_release_mib=512)
    errs = plan.host_refusals("gpu-01", cfg, facts(free_model=10 * GIB, free_root=10 * GIB))
    # 2 % margin on the model; new, current and last good releases (keep 0), none on the host yet
    assert len(errs) == 1 and errs[0].startswith("gpu-01: 10.0 GiB free for model (15.3 GiB) plus build (6.0 GiB, "
                                                 "preflight_build_disk_gb) and 3 more release(s) kept (1.5 GiB")
    assert errs[0].endswith("= 22.8 GiB. Fix: free disk space")
    # separate filesystems are checked separately
    errs = plan.host_refusals("gpu-01", cfg, facts(same_fs=False, free_model=20 * GIB, free_root=1 * GIB))
    assert len(errs) == 1 and "free in /opt/voltafleet, a build (6.0 GiB" in errs[0] and "need 7.5 GiB" in errs[0]


def test_preflight_counts_no_model_bytes_when_present(cfg):
    cfg = cfg.replace(preflight_release_mib=512)
    # the model is there (not counted again); 2 releases on the host: one more (the new one) = 6.5 GiB
    assert plan.host_refusals("h", cfg, facts(free_model=7 * GIB, free_root=7 * GIB, model_present=True,
                                              releases=2)) == []
    errs = plan.host_refusals("h", cfg, facts(free_model=6 * GIB, free_root=6 * GIB, model_present=True, releases=2))
    assert errs and "free for model (0.0 GiB) plus build (6.0 GiB" in errs[0] and "1 more release(s)" in errs[0]


def test_disk_counts_the_kept_releases_not_yet_on_the_host(cfg):
    cfg = cfg.replace(preflight_release_mib=1024, llama_cpp_keep_releases=2)
    assert plan.releases_needed(cfg, facts(releases=None)) == 5      # new, current, last good and 2 kept
    assert plan.releases_needed(cfg, facts(releases=3)) == 2
    assert plan.releases_needed(cfg, facts(releases=9)) == 1         # the new one at least, before the prune
    # 6 GiB build + 5 releases of 1 GiB beside a present model: 11 GiB needed
    assert plan.host_refusals("h", cfg, facts(free_model=11 * GIB, free_root=11 * GIB, model_present=True)) == []
    errs = plan.host_refusals("h", cfg, facts(free_model=10 * GIB, free_root=10 * GIB, model_present=True))
    assert len(errs) == 1 and "5 more release(s) kept (5.0 GiB" in errs[0] and "llama_cpp_keep_releases 2" in errs[0]
    assert errs[0].endswith("Fix: free disk space, or lower llama_cpp_keep_releases")


def test_preflight_refuses_more_instances_than_gpus(cfg):
    cfg = cfg.replace(server_instances=9)
    assert "server_instances is 9 but the host has 8 GPU(s)" in plan.host_refusals("h", cfg, facts())[0]


def test_the_plan_carries_what_it_decided_and_leaves_the_settings_as_set(cfg):
    """Typed decisions out (issue 53): -np and -c that the VRAM plan picks are the plan's own fields, read
    by the argv, the host-memory plan, the preflight record and the gateway; the settings keep the
    user's empty values (no second meaning under server_parallel)."""
    import json
    from pathlib import Path

    from voltafleet.models.gguf_header import from_json

    header = from_json(json.loads((Path(__file__).resolve().parents[1] / "fixtures/gguf/qwen35-27b-q4ks.json").read_text()))
    gpus = [{"index": i, "name": "Tesla V100-SXM2-32GB", "compute_cap": "7.0", "memory_mib": 32768,
             "driver_version": "580.95.05"} for i in range(2)]
    unset = cfg.replace(server_parallel=None, server_ctx=None, llama_cpp_cuda_archs=None)
    p = plan.make_plan("gpu-01", unset, HostFacts(os="debian-12", gpus=gpus), header, "0" * 40)
    assert (p.settings.server.parallel, p.settings.server.ctx) == (None, None)
    assert p.backend == "cuda" and p.slots > 1 and p.ctx and p.ctx % p.slots == 0
    argv = p.argv[0]
    assert argv[argv.index("-np") + 1] == str(p.slots) and argv[argv.index("-c") + 1] == str(p.ctx)
    assert p.hostmem.instance.slots == p.slots
    assert plan.decided_slots_ctx(unset, gpus, header)[:2] == (p.slots, p.ctx)  # the gateway's plain run
    assert set(p.placement) == {0, 1} and p.placement[0] == []  # one NUMA node (not read): not placed
    set_ = plan.make_plan("gpu-01", cfg.replace(server_parallel=2, server_ctx=16384), HostFacts(os="debian-12"), None, "0" * 40)
    assert (set_.slots, set_.ctx) == (2, 16384)  # no GPU to plan for: the settings' own
