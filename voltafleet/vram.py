"""VRAM plan: will this model, at this context, slot count and KV type, fit one GPU?

    weights on the GPU   tensors of the GGUF (token_embd stays in host memory unless the
                         output layer is tied to it, then a copy goes to the GPU)
    KV cache             attention layers x cells x (K + V) at their types; cells = the
                         ctx pool (-c, all slots together) padded to 256; sliding-window
                         layers keep at most window x slots + one ubatch
    recurrent state      hybrid models (Qwen3.5/3.6): per slot, per recurrent layer (f32 conv
                         + delta-net state: 149.6 MiB a slot for Qwen3.6-27B); with MTP
                         speculation llama.cpp keeps n_draft_max more copies a slot (rollback)
    compute buffer       one ubatch of activations (FA on), plus dequantized K/V when quantized;
                         hybrid models: max(activations, attention + the whole pool's K/V
                         dequantized to f16) + the KQ mask of one slot (measured, see below)
    speculation (MTP)    the nextn block's weights (skipped at load unless served), its f16
                         KV cache and compute buffer, the extra recurrent copies
    cuBLAS pool          builds that multiply 64+ token batches through cuBLAS (Volta, and any
                         GGML_CUDA_FORCE_CUBLAS build): the CUDA pool keeps F16-dequantized
                         weights, the two largest distinct matrices (290 MiB for Qwen3.6-27B;
                         FORCE_CUBLAS on an H200: 15,760-16,060 MiB peaks, bench/proof19)
    CUDA overhead        context, cuBLAS workspace: 592 MiB after load + 18 MiB after the first
                         request on an H200 (CUDA 13)
    headroom             kept free for load spikes (default 1 GiB: ../shared/DOMAIN.md)

Calibrated against llama-server's own buffer sizes on an H200 (bench/VRAM_TRUTH.md): qwen2
shapes (bench/gpu-loads-run*.json) and the Qwen3.6-27B shape (bench/qwen35-h200-run1.json).
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
    nextn_layers: int = 0     # MTP blocks (nextn_predict_layers), counted in n_layer
    mtp_bytes: int = 0        # their weights: on the GPU only when MTP speculation is served
    pool_f16_bytes: int = 0   # the cuBLAS path's dequantized weights (cublas_pool_bytes)

    @property
    def hybrid(self) -> bool:
        return self.recurrent_bytes_per_seq > 0

    @classmethod
    def from_header(cls, h: Header) -> "ModelShape":
        n_layer = int(h.get("block_count"))
        n_embd = int(h.get("embedding_length"))
        ff = h.get("feed_forward_length", 0)
        n_ff = int(max(ff) if isinstance(ff, list) else ff)
        n_head = _max_of(h.get("attention.head_count"))
        n_head_kv = _max_of(h.get("attention.head_count_kv", n_head))
        head_k = int(h.get("attention.key_length", n_embd // n_head))
        head_v = int(h.get("attention.value_length", n_embd // n_head))
        names = {t.name for t in h.tensors}
        nextn = int(h.get("nextn_predict_layers", 0) or 0)
        trunk = n_layer - nextn
        tok = sum(t.nbytes for t in h.tensors if t.name == "token_embd.weight")
        mtp = sum(t.nbytes for t in h.tensors
                  if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= trunk)
        weights = h.tensor_bytes() - tok + (tok if "output.weight" not in names else 0) - mtp
        interval = h.get("full_attention_interval")
        if interval:  # hybrid: every Nth layer attends, the rest are recurrent
            attn = tuple(i for i in range(trunk) if (i + 1) % int(interval) == 0)
        else:
            attn = tuple(range(trunk))
        recurrent = 0
        if len(attn) < trunk and h.get("ssm.state_size"):
            d_state, inner = int(h.get("ssm.state_size")), int(h.get("ssm.inner_size"))
            groups, kernel = int(h.get("ssm.group_count", 1)), int(h.get("ssm.conv_kernel", 4))
            heads = int(h.get("ssm.time_step_rank", inner // d_state))
            per_layer = heads * d_state * (inner // heads) * 4 + (kernel - 1) * (inner + 2 * groups * d_state) * 4
            recurrent = per_layer * (trunk - len(attn))
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
                   int(h.get("context_length", 0)), weights, attn, swa, window, recurrent, nextn, mtp,
                   cublas_pool_bytes(h.tensors, trunk))


_SHAPES: dict[int, tuple[Header, ModelShape]] = {}


def shape_of(header: Header) -> ModelShape:
    """ModelShape.from_header, once per header (every host of a run plans from the same one)."""
    hit = _SHAPES.get(id(header))
    if hit is None or hit[0] is not header:
        if len(_SHAPES) >= 4:
            _SHAPES.clear()
        hit = _SHAPES[id(header)] = (header, ModelShape.from_header(header))
    return hit[1]


def cublas_pool_bytes(tensors, trunk: int) -> int:
    """What the CUDA pool holds after prompts on a build that multiplies 64+ token batches
    through cuBLAS: weights dequantized to F16, the two largest distinct matrix sizes among the
    trunk's 2-D weights (not token_embd: a row lookup; not output: only the last token of a
    sequence reaches it). Fitted on a FORCE_CUBLAS build on an H200 (bench/proof19): Qwen3.6-27B's
    ffn (5120 x 17408) and attention query+gate (5120 x 12288) give 290 MiB; measured 292-306 MiB
    over the after-load figure, which the CUDA overhead's 18 MiB cuBLAS workspace covers in part."""
    sizes = set()
    for t in tensors:
        parts = t.name.split(".")
        if parts[0] == "blk" and int(parts[1]) < trunk and len(t.shape) == 2 and min(t.shape) > 1 \
                and t.name.endswith(".weight") and "conv1d" not in t.name:
            sizes.add(t.shape[0] * t.shape[1] * 2)
    return sum(sorted(sizes)[-2:])


def cublas_prompt_path(cfg: dict, archs: list[int] | None) -> bool:
    """Whether the build multiplies prompt batches (64+ tokens) of quantized weights through
    cuBLAS on F16-dequantized copies: GGML_CUDA_FORCE_CUBLAS, or GPUs without int8 tensor cores
    (compute capability < 7.5: Volta and older) unless GGML_CUDA_FORCE_MMQ keeps them on MMQ
    (ggml-cuda mmq.cu, ggml_cuda_should_use_mmq, at the pinned commit)."""
    extra = " ".join(cfg.get("llama_cpp_cmake_extra") or [])
    if "GGML_CUDA_FORCE_CUBLAS=ON" in extra:
        return True
    if cfg.get("voltafleet_backend", "cuda") != "cuda" or "GGML_CUDA_FORCE_MMQ=ON" in extra:
        return False
    archs = archs or cfg.get("llama_cpp_cuda_archs") or []
    return any(a < 75 for a in archs)


def _max_of(v):
    """A per-layer list (hybrid models give 0 for recurrent layers) or a scalar: its largest value."""
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
    spec: int = 0             # what MTP speculation adds (0: not served)
    pool: int = 0             # the cuBLAS path's dequantized weights (0: MMQ builds)

    @property
    def needed(self) -> int:
        return self.weights + self.kv + self.recurrent + self.compute + self.overhead + self.spec + self.pool

    @property
    def fits(self) -> bool:
        return self.needed + self.headroom <= self.gpu_mib * MIB

    def describe(self) -> str:
        m = lambda b: f"{b / MIB:,.0f}"  # noqa: E731
        return (f"-c {self.ctx} -np {self.parallel} K {self.cache_k} V {self.cache_v}: weights {m(self.weights)} + "
                f"KV {m(self.kv)} + recurrent {m(self.recurrent)} + compute {m(self.compute)} + "
                + (f"MTP speculation {m(self.spec)} + " if self.spec else "")
                + (f"cuBLAS pool {m(self.pool)} + " if self.pool else "") + "CUDA "
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


def _quantized(cache_k: str, cache_v: str) -> bool:
    return cache_k not in ("f16", "f32", "bf16") or cache_v not in ("f16", "f32", "bf16")


def compute_bytes(m: ModelShape, ctx: int, parallel: int, cache_k: str, cache_v: str) -> int:
    if m.hybrid:
        # Fitted on the Qwen3.6-27B shape over 15 H200 loads (bench/qwen35-h200-run1.json):
        # FFN activations of one ubatch, or, when K/V are quantized, the attention step with
        # every cell of the pool dequantized to f16 (4 KiB a cell: grows with -c, not -np);
        # plus the f16 KQ mask of one slot (n_ctx_seq x ubatch).
        cells = -(-ctx // CTX_PAD) * CTX_PAD
        act = N_UBATCH * 4 * (3 * m.n_ff + 2 * m.n_embd)
        attn = N_UBATCH * 4 * 8 * m.n_embd
        if _quantized(cache_k, cache_v):
            attn += cells * m.n_head_kv * (m.head_k + m.head_v) * 2
        return max(act, attn) + (cells // parallel) * N_UBATCH * 2
    act = N_UBATCH * 4 * (3 * m.n_ff + 4 * m.n_embd)
    dequant = (ctx // parallel) * m.n_head_kv * (m.head_k + m.head_v) * 2 if _quantized(cache_k, cache_v) else 0
    return act + dequant


def spec_bytes(m: ModelShape, ctx: int, parallel: int, draft_max: int) -> int:
    """What serving the model's own MTP head (--spec-type draft-mtp) adds, measured on an H200
    (bench/qwen35-h200-run1.json, mtp-*): the nextn block's weights, draft_max more recurrent
    copies a slot, the draft context's f16 KV cache and one compute buffer, and a main-context
    compute buffer that grows with the verify batch (19 MiB at -np 4 and 3 drafts, 0 at 1)."""
    if not draft_max:
        return 0
    if not m.nextn_layers:
        raise ValueError("the model has no MTP (nextn) layers: nothing to draft with")
    cells = -(-ctx // CTX_PAD) * CTX_PAD
    kv = m.nextn_layers * cells * m.n_head_kv * (m.head_k + m.head_v) * 2
    compute = N_UBATCH * 4 * (3 * m.n_ff + 2 * m.n_embd) + (cells // parallel) * N_UBATCH * 2
    verify = max(0, draft_max - 1) * parallel * 2483 * 1024  # 18.94 MiB / (2 x 4 slots)
    return m.mtp_bytes + m.recurrent_bytes_per_seq * parallel * draft_max + kv + compute + verify


def plan(m: ModelShape, ctx: int, parallel: int, cache_k: str, cache_v: str, gpu_mib: int,
         headroom_mib: int = 1024, overhead_mib: int = 610, spec_draft_max: int = 0, cublas: bool = False) -> Plan:
    return Plan(ctx, parallel, cache_k, cache_v, gpu_mib, m.weights_gpu,
                kv_bytes(m, ctx, parallel, cache_k, cache_v), m.recurrent_bytes_per_seq * parallel,
                compute_bytes(m, ctx, parallel, cache_k, cache_v), overhead_mib * MIB, headroom_mib * MIB,
                spec_bytes(m, ctx, parallel, spec_draft_max),
                m.pool_f16_bytes + cublas_slots_bytes(parallel) if cublas else 0)


# Measured on an H200 FORCE_CUBLAS build with Qwen3.6-27B Q4_K_S (bench/proof19b): after one
# 1,536-token prompt on every slot at once, the pool grew 292-306 MiB over after-load at 2-4 slots
# (the dequantized weights above) and 2,524-2,536 MiB at 16 slots (-c 131072, checkpoints on or
# off, -ub 512/1024/2048 alike). Which buffers hold the difference was not traced: this is a fit
# of those two points, linear in the slots beyond 4; 5-15 slots were not measured.
CUBLAS_SLOT_BYTES = 186 * MIB


def cublas_slots_bytes(parallel: int) -> int:
    """The cuBLAS path's pool growth with many sequences in one prompt batch (fitted, see above)."""
    return max(0, parallel - 4) * CUBLAS_SLOT_BYTES


def choose(m: ModelShape, ctx: int | None, parallel: int | None, cache_k: str, cache_v: str, gpu_mib: int,
           headroom_mib: int = 1024, overhead_mib: int = 610, spec_draft_max: int = 0, cublas: bool = False) -> Plan:
    """The set values, or for unset ones the largest of the ladder (ctx first, then slots)
    that fits. The plan returned may not fit: the caller refuses it with its numbers."""
    ctxs = [ctx] if ctx else [c for c in CTX_LADDER if not m.n_ctx_train or c <= m.n_ctx_train] or [CTX_LADDER[-1]]
    slots = [parallel] if parallel else list(SLOT_LADDER)
    candidates = [plan(m, c, s, cache_k, cache_v, gpu_mib, headroom_mib, overhead_mib, spec_draft_max, cublas)
                  for c in ctxs for s in slots]
    return next((p for p in candidates if p.fits), candidates[-1])


@dataclass(frozen=True)
class Decision:
    """The preflight's VRAM verdict for one host: the resolved -c/-np, what to log, or why not."""
    ctx: int | None
    parallel: int | None
    text: str | None
    error: str | None
    plan: Plan | None = None


def decide(cfg: dict, gpu_mib: int, header: "Header | str", source: str = "group_vars",
           archs: list[int] | None = None) -> Decision:
    """Pure preflight decision. `header` is the model's parsed GGUF header, or the error text
    from reading it; `archs` the build's CUDA archs (else llama_cpp_cuda_archs). Rules:
      * no header: refuse (vram_plan_required: true, the default), naming the error and the
        fix; with vram_plan_required: false and server_ctx + server_parallel set, serve them
        unchecked (logged as such); with either unset there is nothing to plan from: refuse.
      * server_spec_mtp on a file without nextn layers: refuse with the fix.
      * otherwise plan (MTP speculation counted when served) and refuse a plan that does not fit.
    """
    ctx, np_ = cfg["server_ctx"], cfg["server_parallel"]
    url = cfg["model_url"]
    if isinstance(header, str):
        if not cfg.get("vram_plan_required", True) and ctx and np_:
            return Decision(ctx, np_, f"not planned (vram_plan_required: false): could not read the GGUF "
                                      f"header of {url} ({header})", None)
        fix = ("make model_url reachable from the controller (HTTP Range) so the plan can be checked"
               + ("" if ctx and np_ else ", or set server_ctx and server_parallel")
               + "; to serve server_ctx/server_parallel unchecked set vram_plan_required: false")
        return Decision(ctx, np_, None, f"{source}: model_url: cannot read the GGUF header of {url} to plan "
                                        f"VRAM ({header}). Fix: {fix}")
    m = shape_of(header)
    draft = 0
    if cfg.get("server_spec_mtp"):
        if not m.nextn_layers:
            return Decision(ctx, np_, None, (
                f"{source}: server_spec_mtp: is true, but {url} has no MTP head (nextn_predict_layers is "
                f"{header.get('nextn_predict_layers', 0) or 0}, block_count {m.n_layer}). Fix: set "
                "server_spec_mtp: false, or point model_url at a GGUF converted with its MTP block "
                "(block_count 65, nextn_predict_layers 1 for Qwen3.6-27B)"))
        draft = int(cfg.get("server_spec_draft_max", 3))
    p = choose(m, ctx, np_, cfg["server_cache_type_k"], cfg["server_cache_type_v"], gpu_mib,
               cfg["vram_headroom_mib"], cfg["vram_cuda_overhead_mib"], draft, cublas_prompt_path(cfg, archs))
    if p.fits:
        return Decision(p.ctx, p.parallel, p.describe(), None, p)
    fix = "lower server_ctx or server_parallel, use q8_0 KV (server_cache_type_k/v), or a smaller quant"
    if p.pool:
        fix += ', or build with llama_cpp_cmake_extra: ["-DGGML_CUDA_FORCE_MMQ=ON"] (no dequantized weights)'

    if draft:
        fix = "set server_spec_mtp: false or lower server_spec_draft_max, or " + fix
    return Decision(p.ctx, p.parallel, p.describe(), f"the model does not fit one GPU: {p.describe()}. Fix: {fix}", p)
