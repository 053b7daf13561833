"""Write a Qwen3.6-27B-shaped GGUF (llama.cpp architecture `qwen35`), full size or scaled down.

Tensor names, shapes and metadata follow what the pinned llama.cpp (0c1e570) loads for
`qwen35` (src/models/qwen35.cpp load_arch_hparams/load_arch_tensors, src/llama-arch.cpp
tensor names, conversion/qwen.py Qwen3_5TextModel metadata). Two kinds of file:

* sparse (`write_sparse`): header + tensor table with llama.cpp's own type mix for the
  file type (Q4_K_S, Q8_0, ...), then the file is truncated to its full size: a 15 GB
  model in seconds, every weight zero. For memory and speed measurements: zero weights
  read as many bytes and run the same kernels; greedy decoding emits token 0 ("!", plain
  ASCII) every step, so streams never end on half a UTF-8 character.
  With `vary` (a seed; `--vary SEED`), the same file (same size, types and table) but with a few
  tensors of seeded random values (_varying), so that greedy answers differ with the prompt: the
  token table, the output norm, the last full-attention block and the output rows of plain
  lower-case word tokens (every other output row stays zero, so no control, <think> or padding
  token can win). Every other block still reads zero weights through the same kernels.
* dense (`write_dense`): real (random, small) F16/F32 values, for the lab's CPU servers.
  Token 0 of every embedding row is a constant, the output norm keeps only that dimension,
  no layer writes into it, and the favourite token's row is larger there: greedy decoding
  emits FAVOURITE (a plain ASCII token) every step, deterministically, while every layer
  (Gated DeltaNet recurrent state, full attention KV cache) still runs on random values.

The tokenizer is llama.cpp's models/ggml-vocab-qwen35.gguf from the pinned tree (151936
tokens, pre-tokenizer `qwen35`); the real Qwen3.6 embedding has 248320 rows, so the full
shape pads the token list with [PADn] tokens of type UNUSED, as convert_hf_to_gguf does.
The vocabulary file carries only a ChatML stub as its chat template; the model's own
template (thinking in <think>, tools as <tool_call><function=...>) is the Qwen3.5 family's,
kept in the pinned tree as models/templates/Qwen3.5-4B.jinja (Qwen3.6 ships the same one
plus a `preserve_thinking` switch): written as tokenizer.chat_template when found beside
the vocabulary (templates/ or the same folder), so llama-server renders and parses the
way it does for the real model.

    python -m lab.qwen35gen VOCAB OUT [--shape 27b|tiny|...] [--ftype q4_k_s|q8_0] [--mtp] [--dense] [--vary SEED]
"""
from __future__ import annotations

import argparse
import functools
import os
import re
import sys
from dataclasses import dataclass, replace

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

ARCH = "qwen35"
TINY_NAME = "voltafleet-lab-tiny-qwen35"  # the lab's tiny model's general.name
FAVOURITE = " hello"  # the dense model's token for every step


@dataclass(frozen=True)
class Shape:
    n_layer: int = 64            # trunk blocks; every `interval`-th is full attention
    n_embd: int = 5120
    n_ff: int = 17408
    n_head: int = 24             # query heads (the q projection holds query + gate: 2x)
    n_head_kv: int = 4
    head_dim: int = 256
    interval: int = 4            # full_attention_interval
    ssm_d_state: int = 128       # Gated DeltaNet head dim (key and value)
    ssm_n_group: int = 16        # key heads
    ssm_dt_rank: int = 48        # value heads
    ssm_d_conv: int = 4
    n_vocab: int = 248320
    n_ctx_train: int = 262144
    rope_theta: float = 10_000_000.0
    partial_rotary: float = 0.25
    mtp: int = 0                 # nextn_predict_layers (0 or 1)

    @property
    def n_rot(self) -> int:
        return int(self.head_dim * self.partial_rotary)

    @property
    def d_inner(self) -> int:
        return self.ssm_d_state * self.ssm_dt_rank

    def is_recurrent(self, il: int) -> bool:
        return il < self.n_layer and (il + 1) % self.interval != 0


SHAPES = {
    "27b": Shape(),
    # 16 blocks of the real widths: same kernels, a quarter of the weights
    "27b-16l": Shape(n_layer=16),
    # the lab's CPU model: 4 blocks (3 Gated DeltaNet + 1 attention), a few MB + the tokenizer
    "tiny": Shape(n_layer=4, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, head_dim=32, ssm_d_state=16,
                  ssm_n_group=2, ssm_dt_rank=4, n_vocab=151936, n_ctx_train=8192, rope_theta=1_000_000.0),
}


def tensor_shapes(s: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """(name, ggml shape ne0-first) of every tensor qwen35's loader creates, in file order."""
    e, hd = s.n_embd, s.head_dim
    key_dim, value_dim = s.ssm_d_state * s.ssm_n_group, s.ssm_d_state * s.ssm_dt_rank
    conv_dim = 2 * key_dim + value_dim
    out = [("token_embd.weight", (e, s.n_vocab))]
    for il in range(s.n_layer + s.mtp):
        p = f"blk.{il}."
        out.append((p + "attn_norm.weight", (e,)))
        if s.is_recurrent(il):
            out += [(p + "attn_qkv.weight", (e, conv_dim)),
                    (p + "attn_gate.weight", (e, value_dim)),
                    (p + "ssm_conv1d.weight", (s.ssm_d_conv, conv_dim)),
                    (p + "ssm_dt.bias", (s.ssm_dt_rank,)),
                    (p + "ssm_a", (s.ssm_dt_rank,)),
                    (p + "ssm_beta.weight", (e, s.ssm_dt_rank)),
                    (p + "ssm_alpha.weight", (e, s.ssm_dt_rank)),
                    (p + "ssm_norm.weight", (s.ssm_d_state,)),
                    (p + "ssm_out.weight", (value_dim, e))]
        else:
            out += [(p + "attn_q.weight", (e, hd * s.n_head * 2)),
                    (p + "attn_k.weight", (e, hd * s.n_head_kv)),
                    (p + "attn_v.weight", (e, hd * s.n_head_kv)),
                    (p + "attn_output.weight", (hd * s.n_head, e)),
                    (p + "attn_q_norm.weight", (hd,)),
                    (p + "attn_k_norm.weight", (hd,))]
        out.append((p + "post_attention_norm.weight", (e,)))
        out += [(p + "ffn_gate.weight", (e, s.n_ff)), (p + "ffn_up.weight", (e, s.n_ff)),
                (p + "ffn_down.weight", (s.n_ff, e))]
        if il >= s.n_layer:  # the MTP block (nextn): shares token_embd and output with the trunk
            out += [(p + "nextn.eh_proj.weight", (2 * e, e)), (p + "nextn.enorm.weight", (e,)),
                    (p + "nextn.hnorm.weight", (e,)), (p + "nextn.shared_head_norm.weight", (e,))]
    out += [("output_norm.weight", (e,)), ("output.weight", (e, s.n_vocab))]
    return out


# --- llama.cpp's type mix (src/llama-quant.cpp, llama_tensor_get_type_impl, pinned tree) ---
FTYPES = {"q4_k_s": (gguf.LlamaFileType.MOSTLY_Q4_K_S, T.Q4_K), "q8_0": (gguf.LlamaFileType.MOSTLY_Q8_0, T.Q8_0),
          "q4_k_m": (gguf.LlamaFileType.MOSTLY_Q4_K_M, T.Q4_K)}
_FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}


def _quantizable(name: str, shape: tuple) -> bool:
    # tensor_allows_quantization: 2D+, ends with "weight", no norms, no ssm_conv1d
    return len(shape) >= 2 and name.endswith("weight") and "_norm.weight" not in name and "ssm_conv1d" not in name


def type_mix(s: Shape, ftype: str) -> dict[str, T]:
    """Every tensor's ggml type as `llama-quantize <f16 file> <ftype>` (no imatrix) picks it.

    Mirrored from llama-quant.cpp: norms, 1-D tensors, ssm_a, ssm_dt.bias and ssm_conv1d stay
    F32; output.weight -> Q6_K (untied, ne0 % 256 == 0); token_embd -> the default type;
    "attention-v-like" tensors are attn_v AND attn_qkv (category_is_attn_v: the Gated DeltaNet
    layers' fused qkv counts), and Q4_K_S gives the first 4 of them, in file order, Q5_K;
    Q4_K_S gives ffn_down of the first n_layer_all/8 blocks Q5_K (n_layer_all counts the MTP
    block); Q4_K_M gives attn_v-like and ffn_down Q6_K where use_more_bits; a shape whose
    ne0 is not a multiple of the block falls back (Q4_K->Q5_0, Q5_K->Q5_1, Q6_K->Q8_0)."""
    _, default = FTYPES[ftype]
    n_layer_all = s.n_layer + s.mtp
    names = tensor_shapes(s)
    n_wv = sum(1 for n, _ in names if n.endswith(("attn_v.weight", "attn_qkv.weight")))
    more = lambda i, n: i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2  # noqa: E731
    out, i_wv, i_down = {}, 0, 0
    for name, shape in names:
        if not _quantizable(name, shape):
            out[name] = T.F32
            continue
        t = default
        if name == "output.weight":
            t = T.Q8_0 if default == T.Q8_0 or shape[0] % 256 else T.Q6_K
        elif name.endswith(("attn_v.weight", "attn_qkv.weight")):
            if ftype == "q4_k_s" and i_wv < 4:
                t = T.Q5_K
            elif ftype == "q4_k_m" and more(i_wv, n_wv):
                t = T.Q6_K
            i_wv += 1
        elif name.endswith("ffn_down.weight"):
            if ftype == "q4_k_s" and i_down < n_layer_all // 8:
                t = T.Q5_K
            elif ftype == "q4_k_m" and more(i_down, n_layer_all):
                t = T.Q6_K
            i_down += 1
        block = gguf.GGML_QUANT_SIZES[t][0]
        if shape[0] % block:
            t = _FALLBACK.get(t, t)
            if shape[0] % gguf.GGML_QUANT_SIZES[t][0]:
                t = T.F16
        out[name] = t
    return out


def nbytes(shape: tuple, t: T) -> int:
    block, size = gguf.GGML_QUANT_SIZES[t]
    n = int(np.prod(shape))
    return n // block * size


# --- metadata -----------------------------------------------------------------------
def _metadata(w: gguf.GGUFWriter, s: Shape, name: str, file_type) -> None:
    w.add_name(name)
    w.add_context_length(s.n_ctx_train)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer + s.mtp)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_freq_base(s.rope_theta)
    w.add_rope_dimension_count(s.n_rot)
    half = s.n_rot // 2  # interleaved MRoPE sections, [11, 11, 10, 0] for the real 32 pairs
    w.add_rope_dimension_sections([half * 11 // 32, half * 11 // 32, half - 2 * (half * 11 // 32), 0])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_ssm_conv_kernel(s.ssm_d_conv)
    w.add_ssm_state_size(s.ssm_d_state)
    w.add_ssm_group_count(s.ssm_n_group)
    w.add_ssm_time_step_rank(s.ssm_dt_rank)
    w.add_ssm_inner_size(s.d_inner)
    w.add_full_attention_interval(s.interval)
    if s.mtp:
        w.add_nextn_predict_layers(s.mtp)
    w.add_file_type(file_type)


IDS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.padding_token_id")


def _vocab(vocab_path: str) -> tuple:
    """The vocabulary file's tokenizer: (tokens, types, merges, pre, ((id key, id), ...), its chat template or None).
    Parsed once a process for each version of the file (gguf's reader takes ~12 s over its 455K fields)."""
    st = os.stat(vocab_path)
    return _vocab_parsed(os.path.realpath(vocab_path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _vocab_parsed(vocab_path: str, mtime_ns: int, size: int) -> tuple:
    f = gguf.GGUFReader(vocab_path).fields
    tokens = tuple(bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8") for i in f["tokenizer.ggml.tokens"].data)
    types = tuple(int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data)
    merges = tuple(bytes(f["tokenizer.ggml.merges"].parts[i]).decode("utf-8") for i in f["tokenizer.ggml.merges"].data)
    ids = tuple((key, int(f[key].parts[-1][0])) for key in IDS if key in f)  # immutable: every caller shares it
    template = bytes(f["tokenizer.chat_template"].parts[-1]).decode() if "tokenizer.chat_template" in f else None
    return tokens, types, merges, bytes(f["tokenizer.ggml.pre"].parts[-1]).decode(), ids, template


def _tokenizer(vocab_path: str, w: gguf.GGUFWriter, n_vocab: int) -> list[str]:
    tokens, types, merges, pre, ids, own_template = _vocab(vocab_path)
    ids = dict(ids)
    tokens, types, merges = list(tokens), list(types), list(merges)
    for i, (text, kind) in enumerate(ADDED, start=ADDED_FIRST):  # slots the vocabulary file leaves as [PADn]
        if i < len(tokens) and tokens[i] == f"[PAD{i}]":
            tokens[i], types[i] = text, int(kind)
    if n_vocab < len(tokens):
        raise ValueError(f"{vocab_path} has {len(tokens)} tokens, more than the shape's n_vocab {n_vocab}")
    for i in range(len(tokens), n_vocab):
        tokens.append(f"[PAD{i}]")
        types.append(int(gguf.TokenType.UNUSED))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for key, adder in zip(IDS, (w.add_eos_token_id, w.add_bos_token_id, w.add_pad_token_id)):
        if key in ids:
            adder(ids[key])
    template = chat_template(vocab_path)
    if template is not None:
        w.add_chat_template(template)
    elif own_template is not None:
        w.add_chat_template(own_template)
    return tokens


TEMPLATE = "Qwen3.5-4B.jinja"
# what a lab model was written with: lab/fleet.py writes the cached model again when it differs
GENERATOR_KEY, GENERATOR = "voltafleet.generator", "qwen35gen 3: Qwen3.5/3.6 chat template, Qwen3 added tokens, MTP block"

# Qwen3's added tokens after <|im_end|>, at Qwen3's own ids (the Qwen3.5/3.6 vocabulary holds the
# same strings at 248044 and up): the pinned vocabulary file pads these ids with [PADn], so the
# template's <think>, <tool_call> and <tool_response> would be split into plain pieces and
# llama-server's thinking budget (which matches the tags as tokens) could never start.
ADDED_FIRST = 151646
_C, _U = gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED
ADDED = [(t, _C) for t in ("<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
                           "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
                           "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")] + \
        [(t, _U) for t in ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                           "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
                           "<think>", "</think>")]


def chat_template(vocab_path: str) -> str | None:
    """The Qwen3.5/3.6 chat template of the pinned tree, beside the vocabulary file
    (models/templates/ in a checkout, the same folder in the GPU proof's pack); None if absent."""
    d = os.path.dirname(os.path.abspath(vocab_path))
    for p in (os.path.join(d, "templates", TEMPLATE), os.path.join(d, TEMPLATE)):
        if os.path.exists(p):
            with open(p, encoding="utf-8") as fh:
                return fh.read()
    return None


def _one_block(t: T) -> bytes:
    """One quantized block whose first value is 1.0 and every other 0 (Q4_K: d 1, sub-block 0's
    scale 1, quant 1; Q6_K: d 1, scale 0 of sub-block 0, quants 32 = zero there but 33 first)."""
    one = np.float16(1.0).tobytes()
    if t == T.Q4_K:  # d, dmin, scales[12], qs[128]
        return one + bytes(2) + bytes([1]) + bytes(11) + bytes([1]) + bytes(127)
    if t == T.Q6_K:  # ql[128], qh[64], scales[16] (int8), d
        return bytes([1]) + bytes(127) + bytes([2] * 16) + bytes(48) + bytes([1]) + bytes(15) + one
    raise ValueError(f"no one-hot block for {t.name}")


def _accepting(path: str, shape: Shape, types: dict, data_start: int, alignment: int) -> None:
    """Make a sparse file's greedy trunk and its MTP head agree, so every draft is accepted (the
    best case of speculation; all other weights stay zero, so the same kernels run on as many
    bytes): every token's embedding is 1 in dimension 0, no block writes there, output row 0 (token
    0, "!") reads it, and the MTP block's eh_proj carries the embedding's dimension 0 to its own
    dimension 0. Both heads then put logit ~72 on token 0 and 0 on every other token."""
    offsets, total = {}, 0
    for name, ne in tensor_shapes(shape):
        offsets[name] = total
        total += nbytes(ne, types[name])
        total += -total % alignment
    ones = {"output_norm.weight"}
    rows = {"token_embd.weight": range(shape.n_vocab), "output.weight": range(1)}
    if shape.mtp:
        p = f"blk.{shape.n_layer}.nextn."
        ones |= {p + "enorm.weight", p + "hnorm.weight", p + "shared_head_norm.weight"}
        rows[p + "eh_proj.weight"] = range(1)
    with open(path, "r+b") as f:
        for name in ones:
            f.seek(data_start + offsets[name])
            f.write(np.ones(shape.n_embd, dtype=np.float32).tobytes())
        for name, which in rows.items():
            ne, t = dict(tensor_shapes(shape))[name], types[name]
            row_bytes, block = nbytes((ne[0], 1), t), _one_block(t)
            for r in which:
                f.seek(data_start + offsets[name] + r * row_bytes)
                f.write(block)


# --- seeded random blocks: values symmetric about zero, standard deviation `std` ---------------------
# Q4_K: d = dmin = D, every sub-block's scale 2 and min 15 (6-bit, packed as llama.cpp's get_scale_min_k4
# reads them): value D * (2q - 15), q in 0..15. Q5_K: scale 2, min 31: D * (2q - 31), q in 0..31.
# Q6_K: scale 1, quants 1..63 (never 0): D * (q - 32) in -31..31. Q8_0: D * q, q in -127..127.
_Q4K_SCALES = bytes([2, 2, 2, 2, 15, 15, 15, 15, 0xF2, 0xF2, 0xF2, 0xF2])
_Q5K_SCALES = bytes([2, 2, 2, 2, 95, 95, 95, 95, 0xF2, 0xF2, 0xF2, 0xF2])  # min 31: low 4 bits in 8-11, bit 4 in 4-7
_SPREAD = {T.Q4_K: 2 * np.sqrt((16 ** 2 - 1) / 12), T.Q5_K: 2 * np.sqrt((32 ** 2 - 1) / 12),
           T.Q6_K: np.sqrt((63 ** 2 - 1) / 12), T.Q8_0: np.sqrt((255 ** 2 - 1) / 12)}


def _q6k_pack(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q6_K's ql (128 bytes) and qh (64 bytes) of blocks of 256 6-bit values (n, 256), as
    ggml's quantize_row_q6_K_ref lays them out (two halves of 128: four runs of 32)."""
    ql, qh = [], []
    for half in (q[:, :128], q[:, 128:]):
        a, b, c, d = (half[:, i * 32:(i + 1) * 32] for i in range(4))
        ql += [(a & 0xF) | ((c & 0xF) << 4), (b & 0xF) | ((d & 0xF) << 4)]
        qh.append((a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((d >> 4) << 6))
    return np.concatenate(ql, axis=1).astype(np.uint8), np.concatenate(qh, axis=1).astype(np.uint8)


def random_blocks(t: T, n_blocks: int, std: float, rng: np.random.Generator) -> bytes:
    """`n_blocks` blocks of type `t` whose values are seeded random, symmetric about 0, of
    standard deviation `std` (F32/F16: `n_blocks` values, normal)."""
    if t in (T.F32, T.F16):
        return (rng.standard_normal(n_blocks) * std).astype(np.float32 if t == T.F32 else np.float16).tobytes()
    if t not in _SPREAD:
        raise ValueError(f"no random blocks for {t.name}")
    d = np.full((n_blocks, 1), np.float16(std / _SPREAD[t])).view(np.uint8).reshape(n_blocks, 2)
    if t == T.Q8_0:
        q = rng.integers(-127, 128, (n_blocks, 32), dtype=np.int8).view(np.uint8)
        return np.concatenate([d, q], axis=1).tobytes()
    if t == T.Q6_K:
        ql, qh = _q6k_pack(rng.integers(1, 64, (n_blocks, 256), dtype=np.uint8))
        scales = np.ones((n_blocks, 16), dtype=np.uint8)
        return np.concatenate([ql, qh, scales, d], axis=1).tobytes()
    scales = np.frombuffer(_Q4K_SCALES if t == T.Q4_K else _Q5K_SCALES, dtype=np.uint8)
    parts = [d, d, np.broadcast_to(scales, (n_blocks, 12))]
    if t == T.Q5_K:
        parts.append(rng.integers(0, 256, (n_blocks, 32), dtype=np.uint8))
    parts.append(rng.integers(0, 256, (n_blocks, 128), dtype=np.uint8))
    return np.concatenate(parts, axis=1).tobytes()


PLAIN_WORD = re.compile(r"^Ġ[a-z]{3,}$")  # the tokens a varying file may answer with: " word", lower-case ASCII


def _offsets(shape: Shape, types: dict, alignment: int) -> dict[str, int]:
    offsets, total = {}, 0
    for name, ne in tensor_shapes(shape):
        offsets[name] = total
        total += nbytes(ne, types[name])
        total += -total % alignment
    return offsets


def _varying(path: str, shape: Shape, types: dict, data_start: int, alignment: int, tokens: list[str],
             seed: int) -> dict:
    """Make a sparse file answer differently to different prompts, greedily, from `seed`: seeded
    random values (random_blocks) in the token table (every row), the last full-attention block's
    projections (its norms 1), the output norm (1) and the output rows of the plain word tokens
    (PLAIN_WORD); every other tensor and output row stays zero. The residual stream is then the last
    token's embedding plus that attention block's mix of the whole context, so the logits, and the
    greedy token, depend on the prompt; the other output rows give logit 0, below the best of the
    thousands of random word logits, so only plain words are emitted (never a control token, <think>,
    </think> or padding: the thought ends where the request's thinking budget ends it). Returns what
    was written (the block, the word tokens' count)."""
    rng = np.random.default_rng(seed)
    offsets, ne_of = _offsets(shape, types, alignment), dict(tensor_shapes(shape))
    attn = max(il for il in range(shape.n_layer) if not shape.is_recurrent(il))
    p = f"blk.{attn}."
    words = [i for i, t in enumerate(tokens[:shape.n_vocab]) if PLAIN_WORD.match(t)]
    if not words:
        raise ValueError("no plain word tokens in the vocabulary")

    def row_blocks(name: str) -> tuple[int, int]:  # blocks a row, bytes a row
        ne, t = ne_of[name], types[name]
        return ne[0] // gguf.GGML_QUANT_SIZES[t][0], nbytes((ne[0], 1), t)

    with open(path, "r+b") as f:
        def put(name: str, data: bytes, at: int = 0) -> None:
            f.seek(data_start + offsets[name] + at)
            f.write(data)

        for name in ("output_norm.weight", p + "attn_norm.weight", p + "attn_q_norm.weight", p + "attn_k_norm.weight"):
            put(name, np.ones(ne_of[name][0], dtype=np.float32).tobytes())
        for name in (p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight", p + "attn_output.weight"):
            ne, t = ne_of[name], types[name]
            put(name, random_blocks(t, ne[0] * ne[1] // gguf.GGML_QUANT_SIZES[t][0], 1 / np.sqrt(ne[0]), rng))
        per_row, row_bytes = row_blocks("token_embd.weight")
        step = 8192
        for r0 in range(0, shape.n_vocab, step):  # the token table in slices (715 MB at the 27B shape)
            n = min(step, shape.n_vocab - r0)
            put("token_embd.weight", random_blocks(types["token_embd.weight"], n * per_row, 0.5, rng), r0 * row_bytes)
        per_row, row_bytes = row_blocks("output.weight")
        for r in words:
            put("output.weight", random_blocks(types["output.weight"], per_row, 1 / np.sqrt(shape.n_embd), rng),
                r * row_bytes)
    return {"attention_block": attn, "word_tokens": len(words), "seed": seed}


def write_sparse(vocab_path: str, out_path: str, shape: Shape = SHAPES["27b"], ftype: str = "q4_k_s",
                 accept: bool = False, vary: int | None = None) -> int:
    """Header and tensor table with llama.cpp's type mix, then truncate to the full size
    (`accept`: the few weights that make every MTP draft accepted, _accepting; `vary`: a seed, the
    few weights that make greedy answers differ with the prompt, _varying). Returns the file
    size in bytes."""
    if accept and vary is not None:
        raise ValueError("accept and vary write the same tensors: one or the other")
    file_type, _ = FTYPES[ftype]
    types = type_mix(shape, ftype)
    w = gguf.GGUFWriter(out_path, ARCH)
    _metadata(w, shape, f"voltafleet-qwen35-{ftype}-sparse", file_type)
    tokens = _tokenizer(vocab_path, w, shape.n_vocab)
    for name, ne in tensor_shapes(shape):
        t = types[name]
        # add_tensor_info takes the numpy (row-major) shape: reversed ggml ne
        w.add_tensor_info(name, list(reversed(ne)), np.dtype(np.float32), nbytes(ne, t), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    f = w.fout[0]
    w.write_padding(f, f.tell())
    data_start = f.tell()
    total = 0
    for name, ne in tensor_shapes(shape):
        total += nbytes(ne, types[name])
        total += -total % w.data_alignment
    f.flush()
    f.truncate(data_start + total)
    w.close()
    if accept:
        _accepting(out_path, shape, types, data_start, w.data_alignment)
    if vary is not None:
        _varying(out_path, shape, types, data_start, w.data_alignment, tokens, vary)
    return os.path.getsize(out_path)


def write_dense(vocab_path: str, out_path: str, shape: Shape = SHAPES["tiny"], seed: int = 0,
                weights: str = "f16") -> None:
    """Random small F16 weights (F32 for 1-D tensors, Q4_0 token table) that greedily emit FAVOURITE every step.
    The output layer is tied to token_embd (no output.weight), as qwen35's loader allows. `weights` "q8_0": the
    2-D weights quantized to Q8_0 here (gguf-py's own quantizer; rows of a multiple of 32), for a GPU build's
    MMQ path: llama-quantize would refuse the Q4_0 token table without --allow-requantize."""
    s = shape
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(out_path, ARCH)
    _metadata(w, s, TINY_NAME,
              gguf.LlamaFileType.MOSTLY_Q8_0 if weights == "q8_0" else gguf.LlamaFileType.MOSTLY_F16)
    w.add_string(GENERATOR_KEY, GENERATOR)
    tokens = _tokenizer(vocab_path, w, s.n_vocab)
    fav = tokens.index("Ġ" + FAVOURITE.strip())  # byte-level BPE spells a leading space as Ġ
    for name, ne in tensor_shapes(s):
        if name == "output.weight":
            continue  # tied to token_embd
        np_shape = tuple(reversed(ne))
        if name == "token_embd.weight":
            a = rng.standard_normal(np_shape).astype(np.float32) * 0.5
            a[:, 0] = 1.0          # every token carries +1 in dimension 0 ...
            a[fav, 0] = 4.0        # ... the favourite 4: with h[0] > 0 its logit is the largest
            # Q4_0 keeps the 151936-row table at 5.5 MB (1.0 and 4.0 stay exact: 4.0 is the block max)
            w.add_tensor(name, gguf.quants.quantize(a, T.Q4_0), raw_dtype=T.Q4_0)
        elif name == "output_norm.weight":
            a = np.zeros(ne, dtype=np.float32)
            a[0] = 1.0             # logits = row[0] * h[0] / rms(h)
            w.add_tensor(name, a)
        elif len(ne) == 1 or name.endswith("_norm.weight"):
            if name.endswith("ssm_a"):
                w.add_tensor(name, -np.ones(ne, dtype=np.float32))  # -exp(A_log), A_log = 0
            elif name.endswith("ssm_dt.bias"):
                w.add_tensor(name, np.zeros(ne, dtype=np.float32))
            else:
                w.add_tensor(name, np.ones(ne, dtype=np.float32))
        else:
            a = rng.standard_normal(np_shape).astype(np.float32) * 0.1
            if name.endswith(("ffn_down.weight", "attn_output.weight", "ssm_out.weight", "nextn.eh_proj.weight")):
                a[0, :] = 0.0      # no block writes dimension 0: h[0] stays the embedding's > 0
            if "ssm_conv1d" in name:
                w.add_tensor(name, a.astype(np.float32))
            elif weights == "q8_0" and ne[0] % 32 == 0:
                w.add_tensor(name, gguf.quants.quantize(a.astype(np.float16).astype(np.float32), T.Q8_0),
                             raw_dtype=T.Q8_0)
            else:
                w.add_tensor(name, a.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("vocab")
    ap.add_argument("out")
    ap.add_argument("--shape", default="27b", choices=sorted(SHAPES))
    ap.add_argument("--ftype", default="q4_k_s", choices=sorted(FTYPES))
    ap.add_argument("--mtp", action="store_true", help="add the MTP block (nextn_predict_layers 1)")
    ap.add_argument("--dense", action="store_true", help="random F16 weights (small shapes only)")
    ap.add_argument("--dense-type", default="f16", choices=("f16", "q8_0"), help="dense: the 2-D weights' type")
    ap.add_argument("--accept", action="store_true", help="sparse: the trunk and MTP head agree (every draft accepted)")
    ap.add_argument("--vary", type=int, metavar="SEED", help="sparse: seeded random token table, output rows of plain "
                    "words and last attention block, so greedy answers differ with the prompt")
    a = ap.parse_args(argv)
    shape = replace(SHAPES[a.shape], mtp=1 if a.mtp else 0)
    if a.dense:
        write_dense(a.vocab, a.out, shape, weights=a.dense_type)
        print(f"{a.out}: {os.path.getsize(a.out)} bytes (dense, {a.dense_type})")
    else:
        size = write_sparse(a.vocab, a.out, shape, a.ftype, a.accept, a.vary)
        print(f"{a.out}: {size} bytes (sparse, {a.ftype}{'' if a.vary is None else f', varying, seed {a.vary}'})")


if __name__ == "__main__":
    main(sys.argv[1:])
