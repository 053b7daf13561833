"""The real model's shape: the generator, the planner against the H200 truth, the V100 choices,
the preflight decision (header, MTP) and the flags they render."""
import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from voltafleet.inputs.settings import Settings

from lab import qwen35gen as gen
from voltafleet.planning.flags import check_against_help, server_args
from voltafleet.models.gguf_header import from_json, read_file
from voltafleet.planning.vram import MIB, ModelShape, decide, plan

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
RUN1 = json.loads((ROOT / "bench" / "records" / "qwen35-h200-run1.json").read_text())
V100_16, V100_32 = 16160, 32480  # MiB, nvidia-smi memory.total of V100-SXM2-16GB / -32GB
T = gen.T


def shape(name="qwen35-27b-q4ks"):
    return ModelShape.from_header(from_json(json.loads((FIXTURES / "gguf" / f"{name}.json").read_text())))


def test_tensor_table_is_the_qwen35_loaders():
    s = gen.SHAPES["27b"]
    names = dict(gen.tensor_shapes(s))
    assert names["blk.0.attn_qkv.weight"] == (5120, 10240)      # 2 x 16 key heads x 128 + 48 value heads x 128
    assert names["blk.0.ssm_conv1d.weight"] == (4, 10240)
    assert names["blk.3.attn_q.weight"] == (5120, 24 * 256 * 2)  # query + gate
    assert names["blk.3.attn_k.weight"] == (5120, 4 * 256)
    assert names["blk.0.ffn_down.weight"] == (17408, 5120)
    assert names["output.weight"] == (5120, 248320)
    assert sum(1 for n in names if n.endswith("attn_q.weight")) == 16
    assert sum(1 for n in names if n.endswith("ssm_out.weight")) == 48
    assert not any(n.startswith("blk.64.") for n in names)
    mtp = dict(gen.tensor_shapes(replace(s, mtp=1)))
    assert mtp["blk.64.nextn.eh_proj.weight"] == (10240, 5120) and "blk.64.attn_q.weight" in mtp


def test_q4_k_s_mix_mirrors_llama_quant():
    s = gen.SHAPES["27b"]
    mix = gen.type_mix(s, "q4_k_s")
    assert mix["output.weight"] == T.Q6_K and mix["token_embd.weight"] == T.Q4_K
    # the first 4 "attention-v-like" tensors in file order (3 Gated DeltaNet qkv, then attn_v)
    assert [n for n, t in mix.items() if t == T.Q5_K and "attn" in n] == \
        ["blk.0.attn_qkv.weight", "blk.1.attn_qkv.weight", "blk.2.attn_qkv.weight", "blk.3.attn_v.weight"]
    assert [n for n, t in mix.items() if t == T.Q5_K and "ffn_down" in n] == \
        [f"blk.{i}.ffn_down.weight" for i in range(8)]                     # n_layer_all / 8
    assert mix["blk.0.ssm_conv1d.weight"] == T.F32 and mix["blk.0.ssm_a"] == T.F32
    assert mix["blk.0.ssm_beta.weight"] == T.Q4_K
    total = sum(gen.nbytes(ne, mix[n]) for n, ne in gen.tensor_shapes(s))
    assert 15.4e9 < total < 15.7e9  # unsloth's Q4_K_S of Qwen3.6-27B: ~15.6 GB


def test_sparse_file_reads_back_with_the_planned_sizes(tmp_path):
    vocab = tmp_path / "vocab.gguf"
    small = replace(gen.SHAPES["tiny"], n_embd=256, n_ff=512, n_vocab=600, mtp=1)
    _vocab(vocab, 500)
    size = gen.write_sparse(str(vocab), str(tmp_path / "m.gguf"), small, "q4_k_s")
    h = read_file(str(tmp_path / "m.gguf"))
    assert h.arch == "qwen35" and h.get("block_count") == 5 and h.get("nextn_predict_layers") == 1
    assert h.meta["tokenizer.ggml.tokens"] == {"array_len": 600}  # padded with [PADn] to the embedding rows
    assert size >= h.header_bytes + h.tensor_bytes()
    m = ModelShape.from_header(h)
    assert m.nextn_layers == 1 and m.attn_layers == (3,) and m.mtp_bytes > 0


def _vocab(path, n):
    import gguf
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list([f"t{i}" for i in range(n)])
    w.add_token_types([1] * n)
    w.add_token_merges(["t 1"])
    w.add_eos_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def test_dense_tiny_model_favours_one_plain_token(tmp_path):
    vocab = tmp_path / "vocab.gguf"
    _vocab(vocab, 300)
    import gguf
    w = gguf.GGUFWriter  # noqa: F841 (the writer is exercised by write_dense)
    toks = [f"t{i}" for i in range(300)]
    toks[42] = "Ġhello"
    _vocab_tokens(vocab, toks)
    gen.write_dense(str(vocab), str(tmp_path / "tiny.gguf"), replace(gen.SHAPES["tiny"], n_vocab=300))
    r = gguf.GGUFReader(str(tmp_path / "tiny.gguf"))
    t = {x.name: x for x in r.tensors}
    assert "output.weight" not in t  # tied to token_embd
    emb = gguf.quants.dequantize(t["token_embd.weight"].data, t["token_embd.weight"].tensor_type)
    assert emb[42, 0] == 4.0 and (abs(emb[:, 0] - 1.0) < 0.2)[[i for i in range(300) if i != 42]].all()
    assert list(t["output_norm.weight"].data[:3]) == [1.0, 0.0, 0.0]
    assert not t["blk.0.ffn_down.weight"].data[0].any()  # no block writes dimension 0


def test_dense_tiny_model_in_q8_0_holds_the_same_weights_quantized(tmp_path):
    """--dense-type q8_0 (the GPU proof's probe model, issue 50): every 2-D weight but the conv in Q8_0 from the same
    seeded values (within Q8_0's step), the token table Q4_0 as before, the file type Q8_0. The f16 file and the
    q8_0 file of one seed hold the same numbers to within the quantization."""
    import gguf
    import numpy as np
    toks = [f"t{i}" for i in range(300)]
    toks[42] = "Ġhello"
    vocab = tmp_path / "vocab.gguf"
    _vocab_tokens(vocab, toks)
    shape = replace(gen.SHAPES["tiny"], n_vocab=300)
    gen.write_dense(str(vocab), str(tmp_path / "f16.gguf"), shape)
    gen.write_dense(str(vocab), str(tmp_path / "q8.gguf"), shape, weights="q8_0")
    f16 = {x.name: x for x in gguf.GGUFReader(str(tmp_path / "f16.gguf")).tensors}
    q8r = gguf.GGUFReader(str(tmp_path / "q8.gguf"))
    q8 = {x.name: x for x in q8r.tensors}
    assert f16.keys() == q8.keys()
    types = {n: t.tensor_type for n, t in q8.items()}
    assert types["token_embd.weight"] == gguf.GGMLQuantizationType.Q4_0
    two_d = [n for n, t in f16.items() if t.tensor_type == gguf.GGMLQuantizationType.F16]
    assert two_d and all(types[n] == gguf.GGMLQuantizationType.Q8_0 for n in two_d)
    assert all(types[n] == gguf.GGMLQuantizationType.F32 for n in f16 if "ssm_conv1d" in n)
    for n in two_d:
        a = f16[n].data.astype(np.float32)
        b = gguf.quants.dequantize(q8[n].data, q8[n].tensor_type).reshape(a.shape)
        assert np.abs(a - b).max() <= np.abs(a).max() / 127 + 1e-6, n  # one Q8_0 step of its largest block at most
    ftype = q8r.fields["general.file_type"]
    assert int(ftype.parts[ftype.data[0]][0]) == gguf.LlamaFileType.MOSTLY_Q8_0


def _vocab_tokens(path, tokens):
    import gguf
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_merges(["t 1"])
    w.add_eos_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def truth():
    for r in RUN1["ladder"]:
        yield pytest.param(r, id=r["name"])


@pytest.mark.parametrize("load", truth())
def test_each_term_and_the_total_within_3_percent_of_the_h200(load):
    """bench/records/qwen35-h200-run1.json: llama-server's own CUDA0 buffers and nvidia-smi's process
    memory after the first request, at the project's rendered argv (bench/gpu/qwen35_prep.py)."""
    p = plan(shape(), load["ctx"], load["parallel"], load["kv"], load["kv"], 143771)
    buf = {k: v for d, k, v in load["buffers"] if d == "CUDA0"}
    for term, measured in (("weights", buf["model"]), ("kv", buf["KV"]), ("recurrent", buf["RS"]),
                           ("compute", buf["compute"])):
        assert abs(getattr(p, term) / MIB - measured) / measured < 0.03, (term, getattr(p, term) / MIB, measured)
    measured = load["mem_after"]["proc_mib"]
    assert abs(p.needed / MIB - measured) / measured < 0.03
    assert any("offloaded 65/65 layers to GPU" in l for l in load["log"])


@pytest.mark.parametrize("name,draft", [("mtp-file-no-spec", 0), ("mtp-spec-n1", 1), ("mtp-spec-n3", 3)])
def test_mtp_speculation_counted_within_3_percent(name, draft):
    load = next(r for r in RUN1["mtp"] if r["name"] == name)
    p = plan(shape("qwen35-27b-q4ks-mtp"), 8192, 4, "q8_0", "q8_0", 143771, spec_draft_max=draft)
    measured = load["mem_after"]["proc_mib"]
    assert abs(p.needed / MIB - measured) / measured < 0.03, (p.describe(), measured)
    model = next(v for d, k, v in load["buffers"] if d == "CUDA0" and k == "model")
    assert round((p.weights + (p.spec and shape("qwen35-27b-q4ks-mtp").mtp_bytes)) / MIB, 1) == round(model, 1)


def group(name):
    cfg = yaml.safe_load((ROOT / "group_vars/all.yml").read_text())
    cfg.update(yaml.safe_load((ROOT / f"group_vars/{name}.yml").read_text()))
    return Settings.of(cfg)


def test_v100_16gb_group_fits_and_the_seeds_four_slots_do_not():
    cfg = group("v100_16gb")
    d = decide(cfg, V100_16, from_json(json.loads((FIXTURES / "gguf/qwen35-27b-q4ks.json").read_text())))
    assert d.error is None and d.plan.fits
    free = V100_16 - d.plan.needed / MIB
    assert 512 <= free <= 1024, free  # docs/domain.md: keep 0.5-1 GB free
    seed = decide(cfg.replace(server_parallel=4), V100_16, _header())
    assert seed.error and "short by" in seed.error


def test_v100_32gb_group_fits_16_slots():
    d = decide(group("v100_32gb"), V100_32, _header())
    assert d.error is None and d.parallel == 16
    assert V100_32 - d.plan.needed / MIB >= 1024


def _header(name="qwen35-27b-q4ks"):
    return from_json(json.loads((FIXTURES / "gguf" / f"{name}.json").read_text()))


def test_unreadable_header_refuses_unless_opted_out():
    cfg = group("v100_16gb")
    d = decide(cfg, V100_16, "URLError: connection refused")
    assert d.error and "vram_plan_required: false" in d.error and "connection refused" in d.error
    d = decide(cfg.replace(vram_plan_required=False), V100_16, "URLError: connection refused")
    assert d.error is None and "not planned" in d.text and (d.ctx, d.parallel) == (8192, 2)
    d = decide(cfg.replace(vram_plan_required=False, server_parallel=None), V100_16, "URLError: x")
    assert d.error  # nothing to plan from


def test_mtp_refused_without_nextn_layers_and_when_it_does_not_fit():
    cfg = group("v100_16gb").replace(server_spec_mtp=True)
    d = decide(cfg, V100_16, _header())
    assert d.error and "server_spec_mtp" in d.error and "nextn" in d.error
    d = decide(cfg, V100_16, _header("qwen35-27b-q4ks-mtp"))
    assert d.error and "MTP speculation" in d.error and "server_spec_mtp: false" in d.error
    # 16 slots with MTP (3 drafts: 64 logits rows a ubatch) on Volta's default build: the output matrix goes
    # through cuBLAS in F16 (2,425 MiB) and it is short by 1,437 MiB at b11434 (1,387 at b11312 and the overhead 610);
    # the MMQ-only build v100_32gb ships fits it
    d = decide(group("v100_32gb").replace(**{"server_spec_mtp": True, "llama_cpp_cmake_extra": []}), V100_32,
               _header("qwen35-27b-q4ks-mtp"))
    assert d.error and "short by 1,437 MiB" in d.error and "server_spec_mtp: false" in d.error
    assert d.plan.route == "volta" and round(d.plan.pool / MIB) == 2425 + 160 + 1  # + 64 F16 input rows
    d = decide(group("v100_32gb").replace(**{"server_spec_mtp": True}), V100_32, _header("qwen35-27b-q4ks-mtp"))
    assert d.error is None and d.plan.spec > 0 and d.plan.route == "mmq" and d.plan.pool == 32 * MIB


def test_new_flags_render_and_are_known_to_the_pinned_server():
    cfg = group("v100_32gb").replace(**{"server_spec_mtp": True})
    args = server_args(cfg, "/m.gguf", port=8080, api_key_file=None)
    joined = " ".join(args)
    assert f"--ctx-checkpoints {cfg.server.ctx_checkpoints}" in joined and "--backend-sampling" in args
    assert "--spec-type draft-mtp --spec-draft-n-max 3" in joined
    help_text = (ROOT / "voltafleet/data/llama-server-help-0c1e57098bba.txt").read_text()
    assert check_against_help(args, help_text) == []
    plain = server_args(group("v100_32gb").replace(**{"server_ctx_checkpoints": None, "server_backend_sampling": False}),
                        "/m.gguf", port=8080, api_key_file=None)
    assert "--ctx-checkpoints" not in plain and "--backend-sampling" not in plain and "--spec-type" not in plain
