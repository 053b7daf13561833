"""The host plan (issue 38): host memory (voltafleet.planning.hostmem), threads and NUMA placement
(voltafleet.planning.hostcpu), their refusals and fixes in the host's plan, the facts they read, and the
--plan table."""
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from voltafleet.inputs.settings import Settings

from roles.facts import FreeDisk, HostBasics
from tests.gpu_fixtures import health, host_query
from voltafleet.planning import hostcpu, hostmem
from voltafleet.state import dryrun
from voltafleet.inputs.config import ConfigError, settings_of, validate_values
from voltafleet.models.gguf_header import from_json
from voltafleet.planning.hostmem import GIB, MIB
from voltafleet.planning.hostplan import HostFacts, make_plan
from voltafleet.planning.vram import ModelShape, compute_bytes, kv_bytes

REPO = Path(__file__).resolve().parents[2]

ROOT = Path(__file__).resolve().parents[2]
HEADER = from_json(json.loads((ROOT / "tests" / "fixtures" / "gguf" / "qwen35-27b-q4ks.json").read_text()))
QWEN = ModelShape.from_header(HEADER)  # lab/qwen35gen.py's full Qwen3.6-27B Q4_K_S shape
COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
V100_32 = {"index": 0, "name": "Tesla V100-SXM2-32GB", "compute_cap": "7.0", "memory_mib": 32480,
           "driver_version": "580.95.05"}


def group(cfg: Settings, name: str) -> Settings:
    return cfg.replace(**yaml.safe_load((ROOT / "group_vars" / f"{name}.yml").read_text()))


def v100_32(cfg, **over):
    """v100_32gb at llama.cpp's 32 checkpoints a slot (the worst case the issue measured); the group ships 8."""
    return group(cfg, "v100_32gb").replace(**{"model_sha256": "a" * 64, "server_ctx_checkpoints": 32, **over})


# ---------------------------------------------------------------- the terms


def test_one_checkpoint_is_the_logged_149_626_mib_and_the_term_is_slots_x_n_of_them(cfg):
    c = v100_32(cfg)
    inst = hostmem.instance(c, QWEN)
    # llama-server's log: "created context checkpoint N of 32 (..., size = 149.626 MiB)": planned at or just above
    assert 149.626 <= inst.checkpoint_bytes / MIB < 149.63
    assert inst.slots == c.server.parallel == 16 and inst.checkpoints_per_slot == c.server.ctx_checkpoints == 32
    assert inst.checkpoints == 16 * 32 * inst.checkpoint_bytes
    assert 74.8 < inst.checkpoints / GIB < 74.9  # docs/domain.md: 16 x 32 x 149.6 MiB, ~75 GiB
    # what the kernel cannot reclaim, and the file pages read at every step on top
    # model mapped; the heap's holes where server_malloc_heap is on (the group's)
    assert inst.anonymous == inst.process + inst.host_buffers + inst.checkpoints + inst.cache_ram + inst.heap
    assert inst.held == inst.anonymous + inst.anonymous // 512 + inst.kernel  # page tables: 8 bytes a 4 KiB page
    assert inst.total == inst.held + inst.program + inst.model
    assert inst.process == int((c.server.hostmem_process_mib + 16 * c.server.hostmem_slot_mib) * MIB)  # grows with -np
    unmapped = hostmem.instance(c.replace(server_mmap=False), QWEN)  # -lm none: the weights are anonymous memory
    assert unmapped.held == inst.held + inst.model + (inst.anonymous + inst.model) // 512 - inst.anonymous // 512


def test_checkpoints_follow_the_setting_and_speculation_keeps_one_more(cfg):
    c = v100_32(cfg)
    assert hostmem.instance(c.replace(server_ctx_checkpoints=4), QWEN).checkpoints_per_slot == 4
    assert hostmem.instance(c.replace(server_ctx_checkpoints=0), QWEN).checkpoints == 0
    assert hostmem.instance(c.replace(server_ctx_checkpoints=None), QWEN).checkpoints_per_slot == 32  # llama.cpp's
    assert hostmem.instance(c.replace(server_spec_ngram="ngram-mod"), QWEN).checkpoints_per_slot == 33
    dense = replace(QWEN, recurrent_bytes_per_seq=0, swa_layers=(), swa_window=0)
    assert hostmem.instance(c, dense).checkpoints == 0  # nothing to roll back: no checkpoint


def test_a_sliding_window_checkpoint_copies_the_window_cells(cfg):
    c = v100_32(cfg).replace(server_cache_type_k="f16", server_cache_type_v="f16")
    swa = replace(QWEN, recurrent_bytes_per_seq=0, swa_layers=(0, 1), swa_window=1024)
    one = hostmem.checkpoint_bytes(swa, c.server.ctx, 16, "f16", "f16", 512)
    cells = 1024 + 512  # the window and one ubatch (8K a slot is more)
    assert one == 2 * cells * swa.n_head_kv * (swa.head_k + swa.head_v) * 2 + hostmem.STATE_HEADER * swa.n_layer
    assert hostmem.instance(c, swa).checkpoints_per_slot == 32


def test_the_host_cache_is_llama_cpps_8_gib_when_null_off_at_0_and_unbounded_at_minus_1(cfg):
    c = v100_32(cfg)
    assert hostmem.instance(c.replace(server_cache_ram=None), QWEN).cache_ram == 8192 * MIB
    assert hostmem.instance(c.replace(server_cache_ram=0), QWEN).cache_ram == 0
    assert hostmem.instance(c.replace(server_cache_ram=2048), QWEN).cache_ram == 2048 * MIB
    p = hostmem.plan(c.replace(server_cache_ram=-1), QWEN, 4, 1 << 50)
    assert p.cache_unbounded and "server_cache_ram: is -1" in p.refusal("h") and "Fix: set server_cache_ram" in p.refusal("h")


def test_a_never_trimmed_heap_adds_its_share_of_the_checkpoints_and_cache(cfg):
    """server_malloc_heap: hostmem_heap_share of the live checkpoints and hostmem_cache_heap_share of the prompt
    cache, which its holes keep resident on top (bench/records/proof51 sessions 5-8); 0 with glibc's defaults. A fix
    that lowers either term lowers the heap's with it."""
    c = v100_32(cfg, server_cache_ram=8192)
    on, off = hostmem.instance(c, QWEN), hostmem.instance(c.replace(server_malloc_heap=False), QWEN)
    assert c.server.malloc_heap is True and (c.server.hostmem_heap_share, c.server.hostmem_cache_heap_share) == (0.02, 0.16)
    assert off.heap == 0 and on.heap == math.ceil(0.02 * on.checkpoints + 0.16 * 8192 * MIB)
    assert on.anonymous - off.anonymous == on.heap and on.held - off.held == on.heap + (on.anonymous // 512 - off.anonymous // 512)
    assert replace(on, cache_ram=0).heap == math.ceil(0.02 * on.checkpoints)
    assert replace(on, checkpoints_per_slot=0).heap == math.ceil(0.16 * 8192 * MIB)
    assert f"+ heap {hostmem.size(on.heap)} +" in on.describe() and "heap" not in off.describe()
    assert hostmem.instance(c.replace(hostmem_heap_share=0), QWEN).heap == math.ceil(0.16 * 8192 * MIB)
    no_shares = c.replace(hostmem_heap_share=0, hostmem_cache_heap_share=0)
    assert hostmem.instance(no_shares, QWEN).heap == 1024 * MIB  # the cache's floor stays
    assert hostmem.instance(no_shares.replace(hostmem_cache_heap_floor_mib=0), QWEN).heap == 0
    for key, bad in (("hostmem_heap_share", 1.5), ("hostmem_cache_heap_share", 1.5), ("hostmem_cache_heap_floor_mib", -1),
                     ("hostmem_cache_heap_floor_mib", 0.5)):
        with pytest.raises(ConfigError, match=key) as e:
            validate_values("h1", {**c.flat(), key: bad}, {key: "group_vars/v100_32gb.yml"})
        assert "group_vars/v100_32gb.yml" in str(e.value)


def test_a_small_cache_s_heap_is_planned_at_its_floor(cfg):
    """hostmem_cache_heap_floor_mib: the cache's holes are planned at no less than the floor, whatever the cache's size
    (the 4 GiB cache at 4x kept 711 MiB beyond itself, 17.3 %: bench/records/proof51/session12), so a cache under
    floor / share (6,400 MiB) plans the floor, a larger one its share, and no cache no cache term at all; glibc's
    defaults (server_malloc_heap false) plan no heap."""
    c = v100_32(cfg, server_cache_ram=4096)
    assert c.server.hostmem_cache_heap_floor_mib == 1024
    small = hostmem.instance(c, QWEN)
    ckpt = math.ceil(0.02 * small.checkpoints)
    assert small.heap == math.ceil(0.02 * small.checkpoints + 1024 * MIB) and 0.16 * 4096 < 1024
    at_floor = hostmem.instance(c.replace(server_cache_ram=6554), QWEN)  # 0.16 x 6,554 MiB = 1,048.6: the share's
    assert at_floor.heap == math.ceil(0.02 * at_floor.checkpoints + 0.16 * 6554 * MIB) > ckpt + 1024 * MIB
    assert hostmem.instance(c.replace(server_cache_ram=6400), QWEN).heap == ckpt + 1024 * MIB
    assert hostmem.instance(c.replace(server_cache_ram=0), QWEN).heap == ckpt
    assert hostmem.instance(c.replace(server_malloc_heap=False), QWEN).heap == 0
    assert hostmem.instance(c.replace(hostmem_cache_heap_floor_mib=0), QWEN).heap == math.ceil(
        0.02 * small.checkpoints + 0.16 * 4096 * MIB)


def test_cuda_model_term_is_token_embd_mapped_or_read(cfg):
    c = v100_32(cfg)
    inst = hostmem.instance(c, QWEN)
    assert inst.model == QWEN.tok_embd_bytes and abs(inst.model / MIB - 682.03) < 0.01  # CPU_Mapped model buffer
    assert inst.model_mapped and not hostmem.instance(c.replace(server_mmap=False), QWEN).model_mapped
    partial = hostmem.instance(c.replace(server_gpu_layers=32), QWEN)  # half the trunk on the CPU
    assert partial.model > QWEN.tok_embd_bytes + QWEN.weights_gpu * 0.45


def test_host_buffers_match_the_h200_logs(cfg):
    c = v100_32(cfg)  # -c 131072 -np 16, backend sampling: output 60.63 MiB, CUDA_Host compute 28.28 MiB
    out = hostmem.output_bytes(c, QWEN, 16, 131072)
    assert abs(out / MIB - 60.63) < 0.01
    assert abs(hostmem.output_bytes(c.replace(server_backend_sampling=False), QWEN, 16, 131072) / MIB - 15.16) < 0.01
    compute = hostmem.host_compute_bytes(QWEN, 131072, 16, 512)
    assert 28.28 <= compute / MIB <= 28.28 + 2.5
    for ctx, slots, ub, logged in ((32768, 1, 512, 52.02), (8192, 3, 512, 23.08), (131072, 16, 2048, 112.34),
                                   (8192, 2, 256, 12.27), (4096, 4, 512, 21.28)):
        assert logged <= hostmem.host_compute_bytes(QWEN, ctx, slots, ub) / MIB <= logged + 2.5, (ctx, slots, ub)
    assert hostmem.instance(c, QWEN).host_buffers == out + compute
    # verifying drafts: a row a draft token a slot, at most -b rows
    rows = 16 * 65  # 64 n-gram draft tokens and one a slot
    assert hostmem.output_bytes(c.replace(server_spec_ngram="ngram-mod"), QWEN, 16, 131072) == rows * (16 * QWEN.n_vocab + 4)


def test_cpu_backend_model_term_holds_weights_kv_states_and_compute(cfg):
    c = v100_32(cfg).replace(voltafleet_backend="cpu", server_ctx=8192, server_parallel=4)
    inst = hostmem.instance(c, QWEN)
    expect = (QWEN.file_weights + kv_bytes(QWEN, 8192, 4, "q8_0", "q8_0") + 4 * QWEN.recurrent_bytes_per_seq
              + compute_bytes(QWEN, 8192, 4, "q8_0", "q8_0"))
    assert inst.model == expect and QWEN.file_weights == HEADER.tensor_bytes()
    assert inst.host_buffers == hostmem.output_bytes(c, QWEN, 4, 8192)  # no CUDA_Host buffer


def test_no_header_plans_the_process_and_cache_and_says_what_is_missing(cfg):
    p = hostmem.plan(v100_32(cfg, server_cache_ram=None), None, 4, 256 * GIB)
    assert p.instance.model == p.instance.checkpoints == p.instance.host_buffers == 0
    heap = math.ceil(cfg.server.hostmem_cache_heap_share * 8192 * MIB)  # the group's server_malloc_heap: its share of the cache
    assert p.instance.heap == heap > 0
    anonymous = int((cfg.server.hostmem_process_mib + 16 * cfg.server.hostmem_slot_mib) * MIB) + 8192 * MIB + heap
    assert p.instance.total == (anonymous + anonymous // 512 + (cfg.server.hostmem_kernel_mib + cfg.server.hostmem_program_mib) * MIB)
    assert "not planned: the model" in p.text()


# ---------------------------------------------------------------- the host's sum, ceiling and refusal


def test_need_ceiling_and_text(cfg):
    c = v100_32(cfg, hostmem_reserve_mib=4096, hostmem_ceiling_margin=0.1)
    p = hostmem.plan(c, QWEN, 4, 400 * GIB, 380 * GIB)
    assert p.need == 4 * p.instance.total + 4096 * MIB
    exact = -(-p.instance.total * 11 // 10)  # total x 1.1 rounded up; the plan's float product may add a byte
    assert exact <= p.memory_max <= exact + 1 and not hasattr(p, "memory_high")  # one ceiling
    assert p.fits and p.refusal("h") is None
    assert p.text().startswith("host memory: 4 x 78.5 GiB") and "+ 4.0 GiB reserve" in p.text() and p.text().endswith("fits")
    assert hostmem.plan(c, QWEN, 4).text().endswith("(MemTotal not read: not checked)")
    assert hostmem.plan(c, QWEN, 4).refusal("h") is None


def test_a_host_too_small_is_refused_with_each_fix_that_would_fit(cfg):
    c = v100_32(cfg)  # 16 slots x 32 checkpoints: ~78.5 GiB an instance (the heap's 2 % of them included)
    p = hostmem.plan(c, QWEN, 8, 256 * GIB)
    why = p.refusal("gpu-01")
    assert why.startswith("gpu-01: the servers do not fit") and "of 256.0 GiB (MemTotal): short by" in why
    budget = (256 * GIB - p.reserve) // 8
    fixes = dict(f.split(": ", 1) for f in p.fixes)
    n = int(fixes["server_ctx_checkpoints"].split()[0])
    assert hostmem.instance(c.replace(server_ctx_checkpoints=n), QWEN).total <= budget
    assert hostmem.instance(c.replace(server_ctx_checkpoints=n + 1), QWEN).total > budget
    slots = int(fixes["server_parallel"].split()[0])
    assert hostmem.instance(c.replace(server_ctx=8192 * slots), QWEN, slots=slots).total <= budget
    assert hostmem.instance(c.replace(server_ctx=8192 * (slots + 1)), QWEN, slots=slots + 1).total > budget
    assert "server_instances" in fixes and "server_cache_ram" not in fixes  # the cache is already off
    for key in ("server_ctx_checkpoints", "server_parallel", "server_instances"):
        assert key in why


def test_the_cache_fix_names_the_largest_limit_that_fits(cfg):
    c = v100_32(cfg, server_ctx_checkpoints=0, server_cache_ram=None)
    total = hostmem.instance(c.replace(server_cache_ram=0), QWEN).total
    mem = 2 * (total + 3000 * MIB) + c.server.hostmem_reserve_mib * MIB
    p = hostmem.plan(c, QWEN, 2, mem)
    assert not p.fits
    (fix,) = [f for f in p.fixes if f.startswith("server_cache_ram: ")]
    mib = int(fix.split()[1])  # 3,000 less the page tables (1/512) and the heap's floor (server_malloc_heap; 0.16 is less)
    budget = (mem - c.server.hostmem_reserve_mib * MIB) // 2
    assert 3000 / (1 + 1 / 512) - 1024 - 1 < mib <= 3000 / (1 + 1 / 512) - 1024 and fix == f"server_cache_ram: {mib} or less"
    assert hostmem.instance(c.replace(server_cache_ram=mib), QWEN).total <= budget
    assert hostmem.instance(c.replace(server_cache_ram=mib + 1), QWEN).total > budget
    # without the floor, the share alone: 3,000 less 0.16 of the cache
    c0 = c.replace(hostmem_cache_heap_floor_mib=0)
    (fix0,) = [f for f in hostmem.plan(c0, QWEN, 2, mem).fixes if f.startswith("server_cache_ram: ")]
    assert 3000 / 1.16 / (1 + 1 / 512) - 1 < int(fix0.split()[1]) < 3000 / 1.16


# ---------------------------------------------------------------- CPU


def test_cpu_one_node_fits_without_placement(cfg):
    p = hostcpu.plan(cfg.replace(server_threads=4, hostcpu_reserve=2), [0, 1, 2, 3], cpus=32, nodes={0: "0-31"},
                     gpu_nodes={0: 0, 1: 0, 2: 0, 3: 0})
    assert p.need == 18 and p.refusal("h") is None and p.args(0) == [] and p.text().endswith("of 32 CPUs: fits")


def test_cpu_two_nodes_place_each_instance_on_its_gpus_node(cfg):
    nodes = {0: "0-15,32-47", 1: "16-31,48-63"}
    gpu_nodes = {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}
    p = hostcpu.plan(cfg.replace(server_threads=4), list(range(8)), cpus=64, nodes=nodes, gpu_nodes=gpu_nodes)
    assert p.refusal("h") is None and p.on_node(1) == [4, 5, 6, 7]
    node0 = format(sum(1 << c for c in [*range(16), *range(32, 48)]), "x")
    assert p.args(1) == ["-C", node0, "-Cb", node0] and p.args(1)[1] == "ffff0000ffff"
    assert p.args(5)[1] == "ffff0000ffff0000"
    assert "node 1 (CPUs 16-31,48-63): instances 4, 5, 6, 7" in p.text()
    # the instance's argv carries them
    plan = make_plan("h", cfg.replace(model_sha256="a" * 64, server_threads=4), HostFacts(
        os="debian-12", gpus=[{**V100_32, "index": i} for i in range(8)], gpu_health=health(host_query(8)),
        cpus=64, numa_nodes=nodes, gpu_numa=gpu_nodes), None, COMMIT)
    args = plan.argv[5]
    assert args[args.index("-C") + 1] == "ffff0000ffff0000" and args[args.index("-Cb") + 1] == "ffff0000ffff0000"


def test_cpu_too_many_threads_is_refused_with_the_largest_that_fits(cfg):
    c = cfg.replace(server_threads=8, server_threads_batch=12, hostcpu_reserve=2)
    p = hostcpu.plan(c, [0, 1, 2, 3], cpus=40)
    assert p.threads == 12 and p.need == 50
    why = p.refusal("gpu-01")
    assert "4 instances x 12 threads + 2 reserved (hostcpu_reserve) = 50 of 40 CPUs" in why
    assert "set server_threads (and server_threads_batch) to 9 or fewer" in why
    assert hostcpu.plan(c.replace(server_threads=9, server_threads_batch=None), [0, 1, 2, 3], cpus=40).refusal("h") is None


def test_cpu_a_crowded_node_is_refused_though_the_host_fits(cfg):
    nodes = {0: "0-7", 1: "8-39"}
    p = hostcpu.plan(cfg.replace(server_threads=4, hostcpu_reserve=0), [0, 1, 2, 3], cpus=40, nodes=nodes,
                     gpu_nodes={0: 0, 1: 0, 2: 0, 3: 1})
    why = p.refusal("h")
    assert "NUMA node 0 (CPUs 0-7): instances 0, 1, 2 (their GPUs' node) x 4 threads = 12 of 8 CPUs" in why
    assert "to 2 or fewer" in why


def test_cpu_unknown_topology_is_not_placed_nor_checked(cfg):
    p = hostcpu.plan(cfg.replace(server_threads=64), [0, 1])
    assert p.refusal("h") is None and p.args(0) == [] and "CPUs not read" in p.text()
    two = hostcpu.plan(cfg, [0, 1], cpus=64, nodes={0: "0-31", 1: "32-63"}, gpu_nodes={0: 0})  # GPU 1's node unknown
    assert two.placement == {} and two.args(0) == [] and "GPUs' nodes unknown: no placement" in two.text()


def test_gpu_nodes_by_address_or_bus_order():
    sysfs = {"0000:86:00.0": 1, "0000:3b:00.0": 0, "0000:af:00.0": -1}
    assert hostcpu.gpu_nodes(sysfs) == {0: 0, 1: 1}  # bus order; -1: no NUMA information
    assert hostcpu.gpu_nodes(sysfs, {0: "0000:86:00.0", 1: "0000:3B:00.0"}) == {0: 1, 1: 0}


# ---------------------------------------------------------------- the host's plan, the facts, the table


def test_make_plan_refuses_a_host_whose_memory_does_not_fit_or_warns_when_not_required(cfg):
    c = v100_32(cfg, server_threads=4)
    facts = HostFacts(os="debian-12", gpus=[{**V100_32, "index": i} for i in range(8)], gpu_health=health(host_query(8)),
                      mem_total=256 * GIB, mem_available=250 * GIB, cpus=80)
    plan = make_plan("gpu-01", c, facts, HEADER, COMMIT)
    assert plan.hostmem.instances == 8 and plan.hostmem.instance.slots == 16
    assert [r for r in plan.refusals if "do not fit the host's memory" in r]
    assert plan.hostcpu.refusal("gpu-01") is None
    warned = make_plan("gpu-01", c.replace(hostmem_plan_required=False), facts, HEADER, COMMIT)
    assert not [r for r in warned.refusals if "memory" in r] and [w for w in warned.warnings if "memory" in w]
    lines = plan.resource_lines()
    assert lines[0].startswith("host memory: 8 x") and lines[1].startswith("per instance: process")
    assert "MemoryMax" in lines[1] and lines[2].startswith("CPU: 8 x 4 threads")


def test_make_plan_refuses_too_many_threads(cfg):
    facts = HostFacts(os="debian-12", gpus=[{**V100_32, "index": i} for i in range(8)], gpu_health=health(host_query(8)),
                      cpus=40)
    plan = make_plan("gpu-01", v100_32(cfg, server_threads=8), facts, HEADER, COMMIT)
    assert [r for r in plan.refusals if "threads do not fit" in r and "to 4 or fewer" in r]


def test_threads_batch_and_mmap_render(cfg):
    plan = make_plan("h", cfg.replace(model_sha256="a" * 64, server_threads=4, server_threads_batch=6, server_mmap=False, server_ctx=8192, server_parallel=2, voltafleet_backend="cpu", server_instances=1), HostFacts(os="debian-12"), None, COMMIT)
    args = plan.argv[0]
    assert args[args.index("-tb") + 1] == "6" and args[args.index("-lm") + 1] == "none" and "-C" not in args
    assert plan.hostcpu.threads == 6


def test_lab_hosts_fit_the_lab_machine(cfg):
    """group_vars/lab.yml on a lab host: the machine's 2 CPUs and its 23.5 GiB MemTotal, the tiny
    qwen35 model's header or none."""
    lab = settings_of("vf-lab-1", group(cfg, "lab").replace(model_sha256="a" * 64))
    facts = HostFacts(os="debian-12", systemd=252, mem_total=24683664 * 1024, cpus=2, numa_nodes={0: "0-1"})
    plan = make_plan("vf-lab-1", lab, facts, None, COMMIT)
    assert plan.refusals == (), plan.refusals
    assert plan.hostmem.fits and plan.hostcpu.need == 2 and "-C" not in plan.argv[0]


@pytest.mark.parametrize("kv", [None, "q4_0"])  # the lab's KV cache type, and the probe test's bad host's
def test_lab_hosts_fit_the_lab_machine_with_gemma(cfg, kv):
    """The largest model the lab rolls (tests/lab/test_probe.py): Gemma 3 270M, a sliding-window model, so 32
    checkpoints a slot of its window cells beside the 8 GiB default cache and the heap's shares of both. It must fit
    the CI machine's MemTotal (24,105 MiB: 2 cores, 24 GB) or preflight refuses the probe's rollout."""
    gemma = from_json(json.loads((ROOT / "tests/fixtures/gguf/gemma3-270m-q4km.json").read_text()))
    kv_over = {"server_cache_type_k": kv, "server_cache_type_v": kv} if kv else {}
    lab = settings_of("vf-lab-1", group(cfg, "lab").replace(model_sha256="a" * 64, **kv_over))
    facts = HostFacts(os="debian-12", systemd=252, mem_total=24105 * MIB, cpus=2, numa_nodes={0: "0-1"})
    plan = make_plan("vf-lab-1", lab, facts, gemma, COMMIT)
    assert plan.refusals == (), plan.refusals
    inst = plan.hostmem.instance
    assert inst.checkpoints_per_slot == 32 and inst.checkpoints > 0 and inst.cache_ram == 8192 * MIB
    assert plan.hostmem.need <= 24105 * MIB - 512 * MIB, plan.hostmem.text()  # half a GiB to spare at least


def test_facts_parse_memory_nodes_gpus_and_releases():
    basics = HostBasics().process(["os=ubuntu-24.04", "cpus=80", "mem_kib=527000000", "mem_available_kib=500000000",
                                   "systemd=255", "cxx=13.2.0 x86_64-linux-gnu", "node=0 0-19,40-59",
                                   "node=1 20-39,60-79", "gpu_numa=0000:3b:00.0 0", "gpu_numa=0000:d8:00.0 1"])
    assert basics["cpus"] == 80 and basics["mem_total_kib"] == 527000000 and basics["mem_available_kib"] == 500000000
    assert basics["nodes"] == {0: "0-19,40-59", 1: "20-39,60-79"} and basics["cxx"] == "13.2.0 x86_64-linux-gnu"
    assert basics["gpu_numa"] == {"0000:3b:00.0": 0, "0000:d8:00.0": 1}
    old = HostBasics().process(["os=debian-12", "cxx=12.2.0 x86_64-linux-gnu"])  # an answer without them
    assert old["cpus"] is None and old["mem_total_kib"] is None and old["nodes"] == {} and old["gpu_numa"] == {}
    assert FreeDisk().process(["2049 900", "releases=2"]) == {"dev": "2049", "free": 900, "releases": 2}
    assert FreeDisk().process(["2049 900"])["releases"] is None
    assert "releases=" in FreeDisk().command(path="/opt/voltafleet", releases="/opt/voltafleet/releases")


def test_plan_table_shows_host_resources_per_group(cfg):
    c = cfg.replace(voltafleet_backend="cpu", server_instances=2, llama_cpp_targets=["llama-server"], server_threads=1, server_ctx=4096, server_parallel=4, model_sha256="a" * 64, hostcpu_reserve=0)
    ok = make_plan("h1", c, HostFacts(os="debian-12", systemd=252, mem_total=64 * GIB, cpus=2), None, COMMIT)
    small = make_plan("h2", c, HostFacts(os="debian-12", systemd=252, mem_total=8 * GIB, cpus=2), None, COMMIT)
    assert not ok.refusals and small.refusals
    changes = {"h1": dryrun.host_change(ok, dryrun.Observed(compiler=True), "unit"),
               "h2": dryrun.refused("h2", list(small.refusals), small.resource_lines())}
    report = dryrun.fleet_report([["h1", "h2"]], changes)
    report.update(records={h: ch.to_dict() for h, ch in changes.items()}, groups={"h1": ["lab"], "h2": ["lab"]})
    text = dryrun.table(report)
    process = hostmem.size(hostmem.instance(c, None).process)
    assert "host resources" in text and f"group lab (h1, h2): per instance: process {process}" in text
    assert "h1: host memory: 2 x" in text and "of 64.0 GiB (MemTotal): fits; not planned" in text
    assert "(no GGUF header); CPU: 2 x 1 threads + 0 reserved = 2 of 2 CPUs: fits" in text
    assert "h2 (REFUSED): host memory:" in text and "short by" in text
    assert "refused: the servers do not fit the host's memory" in text
    assert dryrun.HostChange.from_dict(changes["h1"].to_dict()).resources == ok.resource_lines()


@pytest.mark.parametrize("key", ["hostmem_process_mib", "hostmem_reserve_mib", "hostcpu_reserve", "preflight_release_mib"])
def test_new_counts_refuse_a_negative_value(cfg, key):
    from voltafleet.inputs.config import ConfigError

    with pytest.raises(ConfigError, match=key):
        validate_values("h", {**cfg.flat(), "model_sha256": "a" * 64, key: -1})


def test_the_shipped_v100_32gb_fits_eight_gpus_in_128_gib_and_llama_cpps_default_would_not(cfg):
    shipped = group(cfg, "v100_32gb").replace(model_sha256="a" * 64)
    assert shipped.server.ctx_checkpoints == 4
    p = hostmem.plan(shipped, QWEN, 8, mem_total=128 * GIB)
    assert p.fits and 100 < p.need / GIB < 101, p.text()  # 99 before the heap's term (server_malloc_heap)
    assert not hostmem.plan(shipped.replace(server_ctx_checkpoints=8), QWEN, 8, mem_total=128 * GIB).fits
    assert not hostmem.plan(shipped.replace(server_ctx_checkpoints=32), QWEN, 8, mem_total=256 * GIB).fits


def test_docs_host_md_quotes_the_plan_as_it_is_computed_today():
    """docs/host.md's figures for 8 V100-32GB and each group's MemoryMax, recomputed from group_vars (at the
    shipped llama_cpp_ref, whose compute graph the plan follows) and the model's header."""
    import json

    import yaml

    from bench.gpu.gpu_proof import group_cfg
    from voltafleet.models.gguf_header import from_json
    from voltafleet.planning import vram

    shape = vram.ModelShape.from_header(from_json(json.loads((REPO / "tests/fixtures/gguf/qwen35-27b-q4ks.json").read_text())))

    shipped = yaml.safe_load((REPO / "group_vars/all.yml").read_text())["llama_cpp_ref"]

    def plan(group, **over):
        return hostmem.plan(group_cfg(group, ref=shipped).replace(**{"voltafleet_backend": "cuda", **over}), shape, 8,
                            128 * GIB)
    v32 = {"server_ctx": 8192 * 16, "server_parallel": 16}
    ck4, ck8, ck32 = (plan("v100_32gb", **v32, server_ctx_checkpoints=n) for n in (4, 8, 32))
    text = " ".join((REPO / "docs/host.md").read_text().split())
    assert (f"({ck4.instance.total / GIB:.1f} GiB an instance at 16 slots, {ck4.need / GIB:.1f} GiB for 8 V100-32GB "
            f"against {ck8.need / GIB:.1f} at 8 and {ck32.need / GIB:.1f} at llama.cpp's 32)") in text
    comment = (f"host at {shipped}: {ck4.instance.total / GIB:.1f} GiB an instance, {ck4.need / GIB:.1f} GiB for 8 V100-32GB "
               f"(fits 128 GiB; 8: {ck8.need / GIB:.1f}, 32: {ck32.need / GIB:.1f}; docs/host.md)")
    assert comment in (REPO / "group_vars/v100_32gb.yml").read_text(), comment
    m32, m16 = (-(-plan(g, **(v32 if g == "v100_32gb" else {})).memory_max // MIB) for g in ("v100_32gb", "v100_16gb"))
    assert f"({m32:,} MiB for v100_32gb, {m16:,} for v100_16gb:" in text
