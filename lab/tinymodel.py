"""Write a small but real qwen2 GGUF that llama-server can load and generate from.

The tokenizer is Qwen2's own (copied from llama.cpp's models/ggml-vocab-qwen2.gguf);
the weights are random. An output bias makes one plain ASCII token win every step,
so a stream never ends on half a UTF-8 character and tok/s numbers are stable.

    python -m lab.tinymodel VOCAB_GGUF OUT_GGUF
"""
from __future__ import annotations

import sys

import numpy as np
import gguf

SHAPE = dict(n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=384, n_ctx=4096)  # head dim 32: q8_0 KV blocks fit
FAVOURITE = " hello"  # the token every step emits


def _copy_tokenizer(vocab: gguf.GGUFReader, w: gguf.GGUFWriter) -> tuple[int, int]:
    tokens = [bytes(vocab.fields["tokenizer.ggml.tokens"].parts[i]).decode("utf-8")
              for i in vocab.fields["tokenizer.ggml.tokens"].data]
    types = [int(vocab.fields["tokenizer.ggml.token_type"].parts[i][0])
             for i in vocab.fields["tokenizer.ggml.token_type"].data]
    merges = [bytes(vocab.fields["tokenizer.ggml.merges"].parts[i]).decode("utf-8")
              for i in vocab.fields["tokenizer.ggml.merges"].data]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for key, adder in (("tokenizer.ggml.eos_token_id", w.add_eos_token_id),
                       ("tokenizer.ggml.bos_token_id", w.add_bos_token_id),
                       ("tokenizer.ggml.padding_token_id", w.add_pad_token_id)):
        if key in vocab.fields:
            adder(int(vocab.fields[key].parts[-1][0]))
    favourite = "Ġ" + FAVOURITE.strip()  # byte-level BPE spells a leading space as Ġ
    return len(tokens), tokens.index(favourite)


def write(vocab_path: str, out_path: str, seed: int = 0, shape: dict | None = None) -> None:
    s = shape or SHAPE
    rng = np.random.default_rng(seed)
    vocab = gguf.GGUFReader(vocab_path)
    w = gguf.GGUFWriter(out_path, "qwen2")
    w.add_name("voltafleet-lab-tiny-qwen2")
    w.add_context_length(s["n_ctx"])
    w.add_embedding_length(s["n_embd"])
    w.add_block_count(s["n_layer"])
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    n_vocab, favourite = _copy_tokenizer(vocab, w)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    e, kv = s["n_embd"], s["n_embd"] // s["n_head"] * s["n_head_kv"]
    w.add_tensor("token_embd.weight", mat(n_vocab, e))
    w.add_tensor("output_norm.weight", np.ones(e, dtype=np.float32))
    bias = np.zeros(n_vocab, dtype=np.float32)
    bias[favourite] = 50.0
    w.add_tensor("output.bias", bias)
    for i in range(s["n_layer"]):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(e, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", mat(e, e))
        w.add_tensor(p + "attn_k.weight", mat(kv, e))
        w.add_tensor(p + "attn_v.weight", mat(kv, e))
        w.add_tensor(p + "attn_q.bias", np.zeros(e, dtype=np.float32))
        w.add_tensor(p + "attn_k.bias", np.zeros(kv, dtype=np.float32))
        w.add_tensor(p + "attn_v.bias", np.zeros(kv, dtype=np.float32))
        w.add_tensor(p + "attn_output.weight", mat(e, e))
        w.add_tensor(p + "ffn_norm.weight", np.ones(e, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", mat(s["n_ff"], e))
        w.add_tensor(p + "ffn_up.weight", mat(s["n_ff"], e))
        w.add_tensor(p + "ffn_down.weight", mat(e, s["n_ff"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    write(sys.argv[1], sys.argv[2])
