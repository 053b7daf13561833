"""The VRAM planner: the seed's table, the ladder, and the H200 truth check."""
import json
from pathlib import Path

import pytest

from voltafleet.models.gguf_header import from_json
from voltafleet.planning.vram import MIB, ModelShape, choose, plan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf"
BENCH = Path(__file__).resolve().parents[2] / "bench" / "records"  # the raw benchmark records
GB = 1e9
V100_16 = 16384  # MiB, nvidia-smi memory.total of a V100 16 GB


def seed_27b(file_gb: float) -> ModelShape:
    """The seed's dense Qwen 27B (qwen2 shape: 64 layers, 5120 embd, 40/8 heads, GQA);
    the token embedding (~2.5 % of the file) stays in host memory."""
    return ModelShape("qwen2", 64, 5120, 21760, 40, 8, 128, 128, 32768, int(file_gb * GB * 0.975),
                      tuple(range(64)))


def v100(model, ctx, np_, k, v, headroom=512, overhead=400):
    return plan(model, ctx, np_, k, v, V100_16, headroom, overhead)


def test_seed_stage3_q4ks_8k_q8_kv_fits_16gb():
    p = v100(seed_27b(15.2), 8192, 4, "q8_0", "q8_0")
    assert p.fits, p.describe()
    assert 15_000 * MIB < p.needed < 16_000 * MIB  # the seed saw ~15.8 GB in use
    assert round(p.kv / MIB) == 1088  # 64 layers x 8 KV heads x 128 x 8192 cells at q8_0 (34/32 bytes)


def test_seed_config_does_not_fit_with_a_full_gib_of_headroom():
    assert not v100(seed_27b(15.2), 8192, 4, "q8_0", "q8_0", headroom=1024).fits


def test_q4km_16k_f16_kv_does_not_fit_and_says_by_how_much():
    p = v100(seed_27b(16.3), 16384, 4, "f16", "f16")
    assert not p.fits
    assert round(p.kv / MIB) == 4096
    assert "short by" in p.describe() and "of 16,384 MiB" in p.describe()


def test_q8_0_27b_does_not_fit_at_all():
    assert not v100(seed_27b(27.0), 4096, 1, "q8_0", "q8_0").fits


def test_q3km_leaves_room_for_a_longer_context_than_q4ks():
    q3 = choose(seed_27b(13.5), None, 4, "q8_0", "q8_0", V100_16, 512, 400)
    q4 = choose(seed_27b(15.2), None, 4, "q8_0", "q8_0", V100_16, 512, 400)
    assert (q3.ctx, q4.ctx) == (16384, 8192)
    assert q3.fits and q4.fits


def test_ladder_picks_ctx_first_then_slots():
    p = choose(seed_27b(15.2), None, None, "q8_0", "q8_0", V100_16, 512, 400)
    assert (p.ctx, p.parallel) == (8192, 8)
    p32 = choose(seed_27b(15.2), None, None, "q8_0", "q8_0", 32768, 1024, 400)
    assert (p32.ctx, p32.parallel) == (16384, 8)


def test_nothing_on_the_ladder_fits_returns_a_refusable_plan():
    p = choose(seed_27b(27.0), None, None, "q8_0", "q8_0", V100_16, 512, 400)
    assert not p.fits and (p.ctx, p.parallel) == (4096, 1)


def test_hybrid_attention_counts_only_attention_layers_and_adds_recurrent_state():
    from voltafleet.models.gguf_header import Header, Tensor
    meta = {"general.architecture": "qwen35", "qwen35.block_count": 64, "qwen35.embedding_length": 5120,
            "qwen35.feed_forward_length": 17408, "qwen35.attention.head_count": 24,
            "qwen35.attention.head_count_kv": 4, "qwen35.attention.key_length": 256,
            "qwen35.attention.value_length": 256, "qwen35.full_attention_interval": 4,
            "qwen35.ssm.state_size": 128, "qwen35.ssm.inner_size": 6144, "qwen35.ssm.group_count": 16,
            "qwen35.ssm.time_step_rank": 48, "qwen35.ssm.conv_kernel": 4, "qwen35.context_length": 262144}
    h = Header(3, meta, [Tensor("token_embd.weight", [5120, 248320], 12), Tensor("output.weight", [5120, 248320], 14)])
    m = ModelShape.from_header(h)
    assert len(m.attn_layers) == 16 and m.attn_layers[:2] == (3, 7)
    # 16 layers x 4 KV heads x (256 + 256) x 8192 cells x 2 bytes
    assert plan(m, 8192, 1, "f16", "f16", 16384).kv == 16 * 4 * 512 * 8192 * 2
    assert m.recurrent_bytes_per_seq > 48 * 3 * MIB  # 48 recurrent layers, ~3 MiB of state each
    assert m.weights_gpu == h.tensors[1].nbytes  # untied: the input embedding stays on the CPU


def truth_rows():
    runs = [("gpu-loads-run1.json", {"q4ks": "qwen2-1p5b-q4ks", "q8": "qwen2-1p5b-q8"}),
            ("gpu-loads-run2.json", {"q4ks": "qwen2-4b-q4ks"})]
    for run, models in runs:
        for r in json.loads((BENCH / run).read_text()):
            yield pytest.param(models[r["model"]], r, id=f"{models[r['model']]}-{r['name']}")


@pytest.mark.parametrize("fixture,load", truth_rows())
def test_prediction_within_1_percent_of_h200_measurement(fixture, load):
    """Measured on the H200 (bench/gpu/gpu_run.sh): llama-server's process memory after load."""
    shape = ModelShape.from_header(from_json(json.loads((FIXTURES / f"{fixture}.json").read_text())))
    # these rows were read right after load: the CUDA context alone (592 MiB), without the 18 MiB
    # the first request adds (vram_cuda_overhead_mib 610 = both, bench/VRAM_TRUTH.md)
    p = plan(shape, load["ctx"], load["parallel"], load["k"], load["v"], 143771, overhead_mib=592)
    predicted = (p.needed - p.pool) / MIB  # after load: the pool is still empty (no request has run)
    measured = int(load["apps"].split(",")[1])
    assert abs(predicted - measured) / measured < 0.01, (predicted, measured)  # README: within 1 %


def test_weights_match_llama_cpp_model_buffer():
    """run 2 logged `CUDA0 model buffer size = 2065.13 MiB`; the header says the same."""
    shape = ModelShape.from_header(from_json(json.loads((FIXTURES / "qwen2-4b-q4ks.json").read_text())))
    assert round(shape.weights_gpu / MIB, 2) == 2065.13


def test_the_ubatch_scales_the_compute_buffer_and_the_cublas_op():
    """-ub: one prompt step's activations, its KQ mask and, on a cuBLAS route, its F16 input rows."""
    from voltafleet.planning.vram import pool_bytes
    m = seed_27b(16.0)
    m = ModelShape(**{**m.__dict__, "n_vocab": 152064, "trunk_mat": (21760, 5120)})
    base = plan(m, 8192, 4, "q8_0", "q8_0", V100_16, how="volta")
    big = plan(m, 8192, 4, "q8_0", "q8_0", V100_16, how="volta", ubatch=1024)
    act = 512 * 4 * (3 * m.n_ff + 4 * m.n_embd)  # the dense shape's activations of 512 more tokens
    assert big.compute - base.compute == act
    assert big.pool - base.pool == pool_bytes(m, "volta", 4, ubatch=1024) - pool_bytes(m, "volta", 4) == 512 * 21760 * 2
    assert big.kv == base.kv and big.ubatch == 1024 and " -ub 1024 " in big.describe() and "-ub" not in base.describe()

    # below Volta's 64 rows a prompt step goes through MMQ: no F16 copy of the trunk's matrix in the pool
    assert pool_bytes(m, "volta", 4, ubatch=32) < pool_bytes(m, "volta", 4, ubatch=64) - 21760 * 5120 * 2
    # a sliding-window layer keeps window x slots + one ubatch of cells
    swa = ModelShape(**{**m.__dict__, "swa_layers": (0,), "swa_window": 1024})
    assert plan(swa, 65536, 4, "f16", "f16", V100_16, ubatch=1024).kv - plan(swa, 65536, 4, "f16", "f16", V100_16).kv \
        == 512 * m.n_head_kv * (m.head_k + m.head_v) * 2  # 512 more cells in layer 0
