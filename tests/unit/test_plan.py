from tests.gpu_fixtures import health, host_query
from voltafleet import hostplan as plan
from voltafleet.hostplan import HostFacts

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
    cfg["server_instances"] = 2
    assert len(plan.instances(cfg, gpus(8))) == 2
    cfg["voltafleet_backend"] = "cpu"
    assert len(plan.instances(cfg, [])) == 2


def test_cuda_archs_from_the_host_unless_set(cfg):
    assert plan.cuda_archs(cfg, gpus(2) + gpus(1, "9.0")) == [70, 90]
    cfg["llama_cpp_cuda_archs"] = [70]
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
    errs = plan.host_refusals("gpu-01", cfg, facts(free_model=10 * GIB, free_root=10 * GIB))
    assert errs == ["gpu-01: 10.0 GiB free for model (15.3 GiB) plus build (6.0 GiB)"]  # 2 % margin
    # separate filesystems are checked separately
    errs = plan.host_refusals("gpu-01", cfg, facts(same_fs=False, free_model=20 * GIB, free_root=1 * GIB))
    assert len(errs) == 1 and "a build needs 6.0 GiB" in errs[0]


def test_preflight_counts_no_model_bytes_when_present(cfg):
    assert plan.host_refusals("h", cfg, facts(free_model=7 * GIB, free_root=7 * GIB, model_present=True)) == []


def test_preflight_refuses_more_instances_than_gpus(cfg):
    cfg["server_instances"] = 9
    assert "server_instances is 9 but the host has 8 GPU(s)" in plan.host_refusals("h", cfg, facts())[0]
