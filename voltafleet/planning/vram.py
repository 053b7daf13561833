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
    CUDA pool            what the quantized matrix products leave in llama.cpp's CUDA pool (a
                         stack: its size is the largest op's buffers). Which op goes through
                         cuBLAS is the build's route (`route()`, ggml_cuda_should_use_mmq):
                         `volta` (sm_70, default build) multiplies a batch of 64+ rows through
                         cuBLAS on F16-dequantized weights; `cublas` (GGML_CUDA_FORCE_CUBLAS)
                         every batch over 8 rows; `mmq` (FORCE_MMQ, or Turing and newer) none.
                         Such an op holds the weight matrix in F16 and its input rows in F16 (and
                         an F16 output except on Volta, which writes F32 directly). Prompt
                         ubatches (512 tokens) route the trunk's matrices (the largest: the FFN,
                         5120 x 17408 = 170 MiB F16); the output matrix (248,320 x 5120 = 2,425
                         MiB F16) is routed when a ubatch carries enough logits rows: one a slot
                         when decoding, draft + 1 a slot when verifying speculation. Plus the
                         pool's scratch (cuBLAS's first use, FA's F16 K/V, sampling), measured
                         (POOL_SCRATCH). Held within 1 %, never under, of the peaks of an H200
                         made to take Volta's exact choice (bench/records/proof27)
    CUDA overhead        context, cuBLAS workspace: 592 MiB after load + 18 MiB after the first
                         request on an H200 (CUDA 13)
    headroom             kept free for load spikes (default 1 GiB: docs/domain.md)

Calibrated against llama-server's own buffer sizes on an H200 (bench/VRAM_TRUTH.md): qwen2
shapes (bench/records/gpu-loads-run*.json) and the Qwen3.6-27B shape (bench/records/qwen35-h200-run1.json).
"""
from __future__ import annotations

from dataclasses import dataclass

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from voltafleet.inputs.settings import Settings
from voltafleet.models.gguf_header import Header

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
    n_vocab: int = 0          # rows of the output matrix
    trunk_mat: tuple = (0, 0)  # the largest trunk matrix (cols in, rows out): the cuBLAS path's largest op
    tok_embd_bytes: int = 0   # token_embd: the input layer, always in host memory (voltafleet.planning.hostmem)
    file_weights: int = 0     # every tensor but an unserved MTP block: what the cpu backend holds

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
                   _n_vocab(h), largest_trunk_matrix(h.tensors, trunk), tok, h.tensor_bytes() - mtp)


_SHAPES: dict[int, tuple[Header, ModelShape]] = {}


def shape_of(header: Header) -> ModelShape:
    """ModelShape.from_header, once per header (every host of a run plans from the same one)."""
    hit = _SHAPES.get(id(header))
    if hit is None or hit[0] is not header:
        if len(_SHAPES) >= 4:
            _SHAPES.clear()
        hit = _SHAPES[id(header)] = (header, ModelShape.from_header(header))
    return hit[1]


def _n_vocab(h: Header) -> int:
    for t in h.tensors:
        if t.name in ("output.weight", "token_embd.weight") and len(t.shape) == 2:
            return int(t.shape[1])
    return 0


def largest_trunk_matrix(tensors, trunk: int) -> tuple:
    """(columns in, rows out) of the trunk's largest 2-D weight, the wider input first (its F16
    input rows are the larger): the largest op a prompt ubatch sends through cuBLAS (not
    token_embd: a row lookup; not output: only logits rows reach it). Qwen3.6-27B: ffn_down."""
    best = (0, 0)
    for t in tensors:
        parts = t.name.split(".")
        if parts[0] == "blk" and int(parts[1]) < trunk and len(t.shape) == 2 and min(t.shape) > 1 \
                and t.name.endswith(".weight") and "conv1d" not in t.name:
            if (t.shape[0] * t.shape[1], t.shape[0]) > (best[0] * best[1], best[0]):
                best = (int(t.shape[0]), int(t.shape[1]))
    return best


ROUTES = ("mmq", "volta", "cublas")
MMVQ_MAX_BATCH = 8           # ggml-cuda: MMVQ up to 8 columns (every type on Volta and Hopper)
MMQ_MAX_BATCH = 64           # MMQ_DP4A_MAX_BATCH_SIZE: Volta's MMQ below 64 columns
NGRAM_DRAFT_MAX = 64         # common_params_speculative_ngram_mod.n_max: an n-gram draft's largest
# The pool's scratch beside its largest op, measured on the H200 (bench/records/proof27; not traced op by op):
# cuBLAS's first use (handle, workspace, kernels), flash attention's F16 K/V copies, MMQ's q8_1 rows,
# sampling. cuBLAS routes: the largest residual of the 13 Volta-rule loads (peak - planned after-load -
# largest op: 82-159 MiB, growing with slots, prompt length and n-gram verification), rounded up. MMQ: the largest growth
# after long prompts on MMQ-only builds (16-28 MiB, bench/records/proof19, proof19b), rounded up.
POOL_SCRATCH = {"volta": 160 * MIB, "cublas": 160 * MIB, "mmq": 32 * MIB}


def route(cfg: Settings, archs: list[int] | None) -> str:
    """Which quantized matrix products the build sends through cuBLAS (ggml-cuda mmq.cu,
    ggml_cuda_should_use_mmq, at the pinned commit):
      cublas  GGML_CUDA_FORCE_CUBLAS: every batch over 8 rows (MMVQ takes up to 8)
      mmq     GGML_CUDA_FORCE_MMQ, a CPU build, or only GPUs with int8 tensor cores (7.5+): none
      volta   otherwise, a GPU below 7.5 (Volta): batches of 64+ rows"""
    extra = " ".join(cfg.build.cmake_extra or [])
    if "GGML_CUDA_FORCE_CUBLAS=ON" in extra:
        return "cublas"
    if cfg.preflight.backend != "cuda" or "GGML_CUDA_FORCE_MMQ=ON" in extra:
        return "mmq"
    archs = archs or cfg.build.cuda_archs or []
    return "volta" if any(a < 75 for a in archs) else "mmq"


def routed(how: str, rows: int) -> bool:
    """Whether a batch of `rows` rows of a quantized matrix goes through cuBLAS on this route."""
    return (how == "volta" and rows >= MMQ_MAX_BATCH) or (how == "cublas" and rows > MMVQ_MAX_BATCH)


def spec_rows(parallel: int, draft_max: int, ubatch: int = N_UBATCH) -> int:
    """Logits rows of one ubatch while every slot verifies a draft (capped at the ubatch)."""
    return min(ubatch, parallel * (draft_max + 1)) if draft_max else 0


def pool_bytes(m: "ModelShape", how: str, parallel: int, verify_rows: int = 0, ubatch: int = N_UBATCH) -> int:
    """The CUDA pool's peak: the largest routed op (weights in F16, input rows in F16, an F16
    output unless Volta's F32 one) plus the measured scratch. Prompt ubatches are full (a
    prompt of `ubatch`+ tokens), so the trunk's largest matrix is routed on volta and cublas; the
    output matrix when the logits rows of a ubatch (one a slot decoding, verify_rows while
    speculating) reach the route's threshold."""
    if how not in ROUTES:
        raise ValueError(f"route {how!r}: one of {ROUTES}")
    dst = 0 if how == "volta" else 2

    def op(cols: int, rows_out: int, batch: int) -> int:
        return cols * rows_out * 2 + batch * cols * 2 + batch * rows_out * dst

    ops = [0]
    if how != "mmq":
        if routed(how, ubatch):  # a prompt step of `ubatch` rows (below the route's threshold: MMQ/MMVQ)
            ops.append(op(*m.trunk_mat, ubatch))
        out_rows = max(parallel, verify_rows)
        if routed(how, out_rows) and m.n_vocab:
            ops.append(op(m.n_embd, m.n_vocab, out_rows))
    return max(ops) + POOL_SCRATCH[how]


def verify_bytes(m: "ModelShape", verify_rows: int) -> int:
    """The compute buffer's growth for a verify ubatch: every row's F32 logits (llama.cpp
    re-reserves the graph for it: +399 MiB at 512 rows of Qwen3.6-27B measured, 485 planned)."""
    return verify_rows * m.n_vocab * 4


def _max_of(v):
    """A per-layer list (hybrid models give 0 for recurrent layers) or a scalar: its largest value."""
    return int(max(v) if isinstance(v, list) else v)


@dataclass(frozen=True)
class VramPlan:
    """One GPU's VRAM plan: what one llama-server instance's settings take of the card, term by term."""

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
    pool: int = 0             # the CUDA pool's peak: the largest cuBLAS-routed op + scratch (pool_bytes)
    route: str = "mmq"        # which batches go through cuBLAS (route())
    ubatch: int = N_UBATCH    # -ub: the tokens of one prompt step (compute buffer, cuBLAS op)

    @property
    def needed(self) -> int:
        return self.weights + self.kv + self.recurrent + self.compute + self.overhead + self.spec + self.pool

    @property
    def fits(self) -> bool:
        return self.needed + self.headroom <= self.gpu_mib * MIB

    def describe(self) -> str:
        m = lambda b: f"{b / MIB:,.0f}"  # noqa: E731
        return (f"-c {self.ctx} -np {self.parallel}" + (f" -ub {self.ubatch}" if self.ubatch != N_UBATCH else "")
                + f" K {self.cache_k} V {self.cache_v}: weights {m(self.weights)} + "
                f"KV {m(self.kv)} + recurrent {m(self.recurrent)} + compute {m(self.compute)} + "
                + (f"MTP speculation {m(self.spec)} + " if self.spec else "")
                + (f"CUDA pool ({self.route}) {m(self.pool)} + " if self.pool else "") + "CUDA "
                f"{m(self.overhead)} = {m(self.needed)} MiB, + headroom {m(self.headroom)} = "
                f"{m(self.needed + self.headroom)} MiB of {self.gpu_mib:,} MiB: "
                + ("fits" if self.fits else f"short by {m(self.needed + self.headroom - self.gpu_mib * MIB)} MiB"))


def kv_bytes(m: ModelShape, ctx: int, parallel: int, cache_k: str, cache_v: str, ubatch: int = N_UBATCH) -> int:
    cells = -(-ctx // CTX_PAD) * CTX_PAD
    per_cell = m.n_head_kv * (m.head_k * type_bytes(cache_k) + m.head_v * type_bytes(cache_v))
    total = 0.0
    for layer in m.attn_layers:
        n = cells
        if layer in m.swa_layers:
            n = min(cells, -(-(m.swa_window * parallel + ubatch) // CTX_PAD) * CTX_PAD)
        total += n * per_cell
    return int(total)


def _quantized(cache_k: str, cache_v: str) -> bool:
    return cache_k not in ("f16", "f32", "bf16") or cache_v not in ("f16", "f32", "bf16")


# llama.cpp refs whose hybrid (qwen35) compute graph is the pin's: b11312. Any other ref is planned with b11434's
# graph, which reserves one ubatch of 2 x n_embd f32 more, on the GPU and in CUDA_Host alike (llama-server's own
# logs, bench/records/pin50/run1: 600.28 -> 620.29 MiB at v100_32gb's argv, 126.28 -> 146.29 at v100_16gb's, 28.28 ->
# 48.29 CUDA_Host: 20.0 MiB = 512 x 2 x 5120 x 4 whatever -c and -np). A newer ref may differ again: the pin gate's
# GPU proof checks its plan against its peaks (docs/pin.md).
PIN_GRAPH_REFS = ("b11312", "0c1e57098bba43ac29e6e3b677cdceebdd22334f")


def graph_extra_bytes(m: ModelShape, ref: str | None, ubatch: int = N_UBATCH) -> int:
    """What a hybrid model's compute buffer holds beyond the pin's graph at llama.cpp `ref` (None: the newest
    known, the larger): 0 at the pin, ubatch x 2 x n_embd f32 from b11434 (20.0 MiB for Qwen3.6-27B at -ub 512)."""
    if not m.hybrid or ref in PIN_GRAPH_REFS:
        return 0
    return ubatch * 2 * m.n_embd * 4


def compute_bytes(m: ModelShape, ctx: int, parallel: int, cache_k: str, cache_v: str, ubatch: int = N_UBATCH,
                  ref: str | None = PIN_GRAPH_REFS[0]) -> int:
    """The GPU compute buffer (llama.cpp's `CUDA0 compute buffer size`) at llama.cpp `ref` (graph_extra_bytes)."""
    if m.hybrid:
        # Fitted on the Qwen3.6-27B shape over 15 H200 loads (bench/records/qwen35-h200-run1.json):
        # FFN activations of one ubatch, or, when K/V are quantized, the attention step with
        # every cell of the pool dequantized to f16 (4 KiB a cell: grows with -c, not -np);
        # plus the f16 KQ mask of one slot (n_ctx_seq x ubatch).
        cells = -(-ctx // CTX_PAD) * CTX_PAD
        act = ubatch * 4 * (3 * m.n_ff + 2 * m.n_embd)
        attn = ubatch * 4 * 8 * m.n_embd
        if _quantized(cache_k, cache_v):
            attn += cells * m.n_head_kv * (m.head_k + m.head_v) * 2
        return max(act, attn) + (cells // parallel) * ubatch * 2 + graph_extra_bytes(m, ref, ubatch)
    act = ubatch * 4 * (3 * m.n_ff + 4 * m.n_embd)
    dequant = (ctx // parallel) * m.n_head_kv * (m.head_k + m.head_v) * 2 if _quantized(cache_k, cache_v) else 0
    return act + dequant


def spec_bytes(m: ModelShape, ctx: int, parallel: int, draft_max: int, ubatch: int = N_UBATCH) -> int:
    """What serving the model's own MTP head (--spec-type draft-mtp) adds, measured on an H200
    (bench/records/qwen35-h200-run1.json, mtp-*): the nextn block's weights, draft_max more recurrent
    copies a slot, the draft context's f16 KV cache and one compute buffer, and a main-context
    compute buffer that grows with the verify batch (19 MiB at -np 4 and 3 drafts, 0 at 1)."""
    if not draft_max:
        return 0
    if not m.nextn_layers:
        raise ValueError("the model has no MTP (nextn) layers: nothing to draft with")
    cells = -(-ctx // CTX_PAD) * CTX_PAD
    kv = m.nextn_layers * cells * m.n_head_kv * (m.head_k + m.head_v) * 2
    compute = ubatch * 4 * (3 * m.n_ff + 2 * m.n_embd) + (cells // parallel) * ubatch * 2
    verify = max(0, draft_max - 1) * parallel * 2483 * 1024  # 18.94 MiB / (2 x 4 slots)
    return m.mtp_bytes + m.recurrent_bytes_per_seq * parallel * draft_max + kv + compute + verify


def plan(m: ModelShape, ctx: int, parallel: int, cache_k: str, cache_v: str, gpu_mib: int,
         headroom_mib: int = 1024, overhead_mib: int = 610, spec_draft_max: int = 0, how: str = "mmq",
         ngram: bool = False, ubatch: int = N_UBATCH, ref: str | None = PIN_GRAPH_REFS[0]) -> VramPlan:
    """The plan of one configuration; `how` the build's route(), `ngram` n-gram speculation
    (drafts of up to NGRAM_DRAFT_MAX tokens a slot, verified in the main context), `ubatch` -ub,
    `ref` the llama.cpp ref served (its compute graph: graph_extra_bytes)."""
    rows = max(spec_rows(parallel, spec_draft_max, ubatch), spec_rows(parallel, NGRAM_DRAFT_MAX if ngram else 0, ubatch))
    spec = spec_bytes(m, ctx, parallel, spec_draft_max, ubatch) + (verify_bytes(m, rows) if ngram else 0)
    return VramPlan(ctx, parallel, cache_k, cache_v, gpu_mib, m.weights_gpu,
                kv_bytes(m, ctx, parallel, cache_k, cache_v, ubatch), m.recurrent_bytes_per_seq * parallel,
                compute_bytes(m, ctx, parallel, cache_k, cache_v, ubatch, ref), overhead_mib * MIB, headroom_mib * MIB,
                spec, pool_bytes(m, how, parallel, rows, ubatch), how, ubatch)


def choose(m: ModelShape, ctx: int | None, parallel: int | None, cache_k: str, cache_v: str, gpu_mib: int,
           headroom_mib: int = 1024, overhead_mib: int = 610, spec_draft_max: int = 0, how: str = "mmq",
           ngram: bool = False, ubatch: int = N_UBATCH, ref: str | None = PIN_GRAPH_REFS[0]) -> VramPlan:
    """The set values, or for unset ones the largest of the ladder (ctx first, then slots)
    that fits. The plan returned may not fit: the caller refuses it with its numbers."""
    ctxs = [ctx] if ctx else [c for c in CTX_LADDER if not m.n_ctx_train or c <= m.n_ctx_train] or [CTX_LADDER[-1]]
    slots = [parallel] if parallel else list(SLOT_LADDER)
    candidates = [plan(m, c, s, cache_k, cache_v, gpu_mib, headroom_mib, overhead_mib, spec_draft_max, how, ngram, ubatch,
                       ref) for c in ctxs for s in slots]
    return next((p for p in candidates if p.fits), candidates[-1])


@dataclass(frozen=True)
class Decision:
    """The preflight's VRAM verdict for one host: the resolved -c/-np, what to log, or why not."""
    ctx: int | None
    parallel: int | None
    text: str | None
    error: str | None
    plan: VramPlan | None = None


def decide(cfg: Settings, gpu_mib: int, header: "Header | str", source: str = "group_vars",
           archs: list[int] | None = None) -> Decision:
    """Pure preflight decision. `header` is the model's parsed GGUF header, or the error text
    from reading it; `archs` the build's CUDA archs (else llama_cpp_cuda_archs). Rules:
      * no header: refuse (vram_plan_required: true, the default), naming the error and the
        fix; with vram_plan_required: false and server_ctx + server_parallel set, serve them
        unchecked (logged as such); with either unset there is nothing to plan from: refuse.
      * server_spec_mtp on a file without nextn layers: refuse with the fix.
      * otherwise plan (MTP speculation counted when served) and refuse a plan that does not fit.
    """
    ctx, np_ = cfg.server.ctx, cfg.server.parallel
    url = cfg.model.url
    if isinstance(header, str):
        if not cfg.server.vram_plan_required and ctx and np_:
            return Decision(ctx, np_, f"not planned (vram_plan_required: false): could not read the GGUF "
                                      f"header of {url} ({header})", None)
        fix = ("make model_url reachable from the controller (HTTP Range) so the plan can be checked"
               + ("" if ctx and np_ else ", or set server_ctx and server_parallel")
               + "; to serve server_ctx/server_parallel unchecked set vram_plan_required: false")
        return Decision(ctx, np_, None, f"{source}: model_url: cannot read the GGUF header of {url} to plan "
                                        f"VRAM ({header}). Fix: {fix}")
    m = shape_of(header)
    draft = 0
    if cfg.server.spec_mtp:
        if not m.nextn_layers:
            return Decision(ctx, np_, None, (
                f"{source}: server_spec_mtp: is true, but {url} has no MTP head (nextn_predict_layers is "
                f"{header.get('nextn_predict_layers', 0) or 0}, block_count {m.n_layer}). Fix: set "
                "server_spec_mtp: false, or point model_url at a GGUF converted with its MTP block "
                "(block_count 65, nextn_predict_layers 1 for Qwen3.6-27B)"))
        draft = int(cfg.server.spec_draft_max)
    p = choose(m, ctx, np_, cfg.server.cache_type_k, cfg.server.cache_type_v, gpu_mib,
               cfg.server.vram_headroom_mib, cfg.server.vram_cuda_overhead_mib, draft, route(cfg, archs),
               bool(cfg.server.spec_ngram), cfg.server.ubatch or N_UBATCH, cfg.build.ref)
    if p.fits:
        return Decision(p.ctx, p.parallel, p.describe(), None, p)
    fix = "lower server_ctx or server_parallel, use q8_0 KV (server_cache_type_k/v), or a smaller quant"
    if p.route != "mmq":
        fix += ', or build with llama_cpp_cmake_extra: ["-DGGML_CUDA_FORCE_MMQ=ON"] (no dequantized weights)'

    if draft:
        fix = "set server_spec_mtp: false or lower server_spec_draft_max, or " + fix
    return Decision(p.ctx, p.parallel, p.describe(), f"the model does not fit one GPU: {p.describe()}. Fix: {fix}", p)
