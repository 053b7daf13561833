"""VRAM plan: will this model, at this context, slot count and KV type, fit one GPU?

    weights on the GPU   tensors of the GGUF (token_embd stays in host memory unless the
                         output layer is tied to it, then a copy goes to the GPU)
    KV cache             attention layers x cells x (K + V) at their types; cells = the
                         ctx pool (-c, all slots together) padded to 256; sliding-window
                         layers keep at most window x slots + one ubatch
    recurrent state      hybrid models (Qwen3.5/3.6): per slot, per recurrent layer
    compute buffer       one ubatch of activations (FA on), plus dequantized K/V when quantized
    CUDA overhead        context, cuBLAS workspace: measured ~590 MiB on an H200 (CUDA 13)
    headroom             kept free for load spikes (default 1 GiB: ../shared/DOMAIN.md)

Calibrated against llama-server's own buffer sizes on an H200 (bench/VRAM_TRUTH.md).
"""
from __future__ import annotations

from dataclasses import dataclass

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from voltafleet.gguf_header import Header

MIB = 1024 * 1024
N_UBATCH = 512
CTX_PAD = 256
CTX_LADDER = (16384, 8192, 4096)
SLOT_LADDER = (8, 4, 2, 1)


def type_bytes(name: str) -> float:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[name.upper()]]
    return size / block


@dataclass(frozen=True)
class ModelShape:
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_k: int
    head_v: int
    n_ctx_train: int
    weights_gpu: int          # bytes
    attn_layers: tuple        # indices of layers with a KV cache
    swa_layers: tuple = ()    # of those, the sliding-window ones
    swa_window: int = 0
    recurrent_bytes_per_seq: int = 0

    @classmethod
    def from_header(cls, h: Header) -> "ModelShape":
        n_layer = int(h.get("block_count"))
        n_embd = int(h.get("embedding_length"))
        ff = h.get("feed_forward_length", 0)
        n_ff = int(max(ff) if isinstance(ff, list) else ff)
        n_head = _first(h.get("attention.head_count"))
        n_head_kv = _first(h.get("attention.head_count_kv", n_head))
        head_k = int(h.get("attention.key_length", n_embd // n_head))
        head_v = int(h.get("attention.value_length", n_embd // n_head))
        names = {t.name for t in h.tensors}
        tok = sum(t.nbytes for t in h.tensors if t.name == "token_embd.weight")
        weights = h.tensor_bytes() - tok + (tok if "output.weight" not in names else 0)
        interval = h.get("full_attention_interval")
        if interval:  # hybrid: every Nth layer attends, the rest are recurrent
            attn = tuple(i for i in range(n_layer) if (i + 1) % int(interval) == 0)
        else:
            attn = tuple(range(n_layer))
        recurrent = 0
        if len(attn) < n_layer and h.get("ssm.state_size"):
            d_state, inner = int(h.get("ssm.state_size")), int(h.get("ssm.inner_size"))
            groups, kernel = int(h.get("ssm.group_count", 1)), int(h.get("ssm.conv_kernel", 4))
            heads = int(h.get("ssm.time_step_rank", inner // d_state))
            per_layer = heads * d_state * (inner // heads) * 4 + (kernel - 1) * (inner + 2 * groups * d_state) * 4
            recurrent = per_layer * (n_layer - len(attn))
        window = int(h.get("attention.sliding_window", 0) or 0)
        swa: tuple = ()
        pattern = h.get("attention.sliding_window_pattern")
        if window and isinstance(pattern, list):
            swa = tuple(i for i in range(n_layer) if i < len(pattern) and pattern[i])
        elif window and pattern:
            swa = tuple(i for i in range(n_layer) if (i + 1) % int(pattern) != 0)
        elif window:
            swa = attn
        return cls(h.arch, n_layer, n_embd, n_ff, n_head, n_head_kv, head_k, head_v,
                   int(h.get("context_length", 0)), weights, attn, swa, window, recurrent)


def _first(v):
    return int(max(v) if isinstance(v, list) else v)


@dataclass(frozen=True)
class Plan:
    ctx: int
    parallel: int
    cache_k: str
    cache_v: str
    gpu_mib: int
    weights: int
    kv: int
    recurrent: int
    compute: int
    overhead: int
    headroom: int

    @property
    def needed(self) -> int:
        return self.weights + self.kv + self.recurrent + self.compute + self.overhead

    @property
    def fits(self) -> bool:
        return self.needed + self.headroom <= self.gpu_mib * MIB

    def describe(self) -> str:
        m = lambda b: f"{b / MIB:,.0f}"  # noqa: E731
        return (f"-c {self.ctx} -np {self.parallel} K {self.cache_k} V {self.cache_v}: weights {m(self.weights)} + "
                f"KV {m(self.kv)} + recurrent {m(self.recurrent)} + compute {m(self.compute)} + CUDA "
                f"{m(self.overhead)} = {m(self.needed)} MiB, + headroom {m(self.headroom)} = "
                f"{m(self.needed + self.headroom)} MiB of {self.gpu_mib:,} MiB: "
                + ("fits" if self.fits else f"short by {m(self.needed + self.headroom - self.gpu_mib * MIB)} MiB"))


def kv_bytes(m: ModelShape, ctx: int, parallel: int, cache_k: str, cache_v: str) -> int:
    cells = -(-ctx // CTX_PAD) * CTX_PAD
    per_cell = m.n_head_kv * (m.head_k * type_bytes(cache_k) + m.head_v * type_bytes(cache_v))
    total = 0.0
    for layer in m.attn_layers:
        n = cells
        if layer in m.swa_layers:
            n = min(cells, -(-(m.swa_window * parallel + N_UBATCH) // CTX_PAD) * CTX_PAD)
        total += n * per_cell
    return int(total)


def compute_bytes(m: ModelShape, ctx: int, parallel: int, cache_k: str, cache_v: str) -> int:
    act = N_UBATCH * 4 * (3 * m.n_ff + 4 * m.n_embd)
    quantized = cache_k not in ("f16", "f32", "bf16") or cache_v not in ("f16", "f32", "bf16")
    dequant = (ctx // parallel) * m.n_head_kv * (m.head_k + m.head_v) * 2 if quantized else 0
    return act + dequant


def plan(m: ModelShape, ctx: int, parallel: int, cache_k: str, cache_v: str, gpu_mib: int,
         headroom_mib: int = 1024, overhead_mib: int = 600) -> Plan:
    return Plan(ctx, parallel, cache_k, cache_v, gpu_mib, m.weights_gpu,
                kv_bytes(m, ctx, parallel, cache_k, cache_v), m.recurrent_bytes_per_seq * parallel,
                compute_bytes(m, ctx, parallel, cache_k, cache_v), overhead_mib * MIB, headroom_mib * MIB)


def choose(m: ModelShape, ctx: int | None, parallel: int | None, cache_k: str, cache_v: str, gpu_mib: int,
           headroom_mib: int = 1024, overhead_mib: int = 600) -> Plan:
    """The set values, or for unset ones the largest of the ladder (ctx first, then slots)
    that fits. The plan returned may not fit: the caller refuses it with its numbers."""
    ctxs = [ctx] if ctx else [c for c in CTX_LADDER if not m.n_ctx_train or c <= m.n_ctx_train] or [CTX_LADDER[-1]]
    slots = [parallel] if parallel else list(SLOT_LADDER)
    candidates = [plan(m, c, s, cache_k, cache_v, gpu_mib, headroom_mib, overhead_mib) for c in ctxs for s in slots]
    return next((p for p in candidates if p.fits), candidates[-1])
