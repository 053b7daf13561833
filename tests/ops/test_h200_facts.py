"""What voltafleet's preflight facts read on a real NVIDIA H200 (driver 580, nvcc 13.0),
recorded by bench/gpu/gpu_run.sh into tests/fixtures/h200-facts.json, through the same
parsers and refusal rules as a rollout."""
import json
from pathlib import Path

from roles.facts import FreeDisk, Gpus, HostBasics, NvccVersion
from voltafleet.planning import hostplan
from voltafleet.gpu import nvidia

FACTS = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "h200-facts.json").read_text())


def lines(name):
    return FACTS[name].splitlines()


def test_gpu_fact_reads_the_h200():
    gpus = Gpus().process(lines("Gpus"))
    assert gpus == [{"index": 0, "name": "NVIDIA H200", "compute_cap": "9.0", "memory_mib": 143771,
                     "driver_version": "580.159.04"}]


def test_nvcc_and_host_facts():
    assert NvccVersion().process(lines("NvccVersion")) == "13.0.88"
    basics = HostBasics().process(lines("HostBasics"))
    assert basics["os"] == "ubuntu-24.04" and basics["cpus"] == 16 and basics["cxx"].startswith("13.3.0")
    assert FreeDisk().process(lines("FreeDisk"))["free"] > 10 * 2 ** 30


def test_h200_with_cuda_13_passes_the_volta_rules_and_plans_sm_90(cfg):
    cfg = cfg.replace(cuda_toolkit_version="13.0", llama_cpp_cuda_archs=None)
    gpus = Gpus().process(lines("Gpus"))
    assert nvidia.refusals("h200", cfg, gpus, NvccVersion().process(lines("NvccVersion")), "580.159.04") == []
    assert hostplan.cuda_archs(cfg, gpus) == [90]


def test_the_same_cuda_13_on_a_v100_is_refused(cfg):
    v100 = [{"index": 0, "name": "Tesla V100-SXM2-16GB", "compute_cap": "7.0", "memory_mib": 16384,
             "driver_version": "580.159.04"}]
    errs = nvidia.refusals("v100", cfg, v100, NvccVersion().process(lines("NvccVersion")), "580.159.04")
    assert len(errs) == 1 and "the installed CUDA toolkit is 13.0.88" in errs[0]
