"""Host-memory plan: will a host's llama-servers, at their worst, fit its RAM beside the system?

Per instance (one llama-server), every term in bytes:

    process        hostmem_process_mib: the process's own base after load that the kernel cannot
                   reclaim (anonymous memory and the CUDA runtime's shared memory: heap, runtime,
                   driver state), plus hostmem_slot_mib a slot (each slot's sampler and buffers on the
                   heap), measured
    program        hostmem_program_mib: the binary's and its libraries' file pages (libcuda, cuBLAS,
                   ggml's kernels): page cache the kernel could reclaim, but read at every step
    model          what the model costs in host memory. CUDA: token_embd (the input layer stays on
                   the CPU in llama.cpp, tied output or not; 682 MiB for Qwen3.6-27B Q4_K_S), plus the
                   layers a partial offload leaves on the CPU. cpu backend: every weight, the KV pool,
                   the recurrent states and a compute buffer (the VRAM plan's formulas). With mmap
                   (server_mmap, llama.cpp's default) the weights are file pages the kernel can
                   reclaim; without (-lm none) they are read into anonymous memory
    host buffers   llama-server's own: the output buffer (logits rows x n_vocab x 4 bytes, x4 with
                   --backend-sampling: probabilities, candidates, sampled ids) and, on CUDA, the
                   CUDA_Host compute buffer (one ubatch: 8 x n_embd + the f16 KQ mask of one slot,
                   fitted on 30 H200 loads of bench/records, never under)
    checkpoints    slots x checkpoints a slot x one checkpoint. A checkpoint copies what a hybrid
                   model cannot roll back: its recurrent state (Qwen3.6-27B: 149.626 MiB in the log),
                   and a sliding-window model's window cells. llama.cpp keeps at most
                   --ctx-checkpoints a slot (server-context.cpp create_checkpoint evicts before it
                   adds), plus one speculative checkpoint a slot while drafting
    prompt cache   --cache-ram (server_cache_ram; null = llama.cpp's 8192 MiB): its limit bounds the
                   saved states and their checkpoints, room made before each allocation
                   (server-task.cpp server_prompt_cache::alloc), so it never overshoots; -1 has no
                   limit and cannot be planned
    heap           with server_malloc_heap (glibc's malloc kept to its heap, never trimmed): what its
                   holes keep resident beyond the live checkpoints and cache: hostmem_heap_share of
                   the checkpoints and, for a cache, the larger of hostmem_cache_heap_share of it and
                   hostmem_cache_heap_floor_mib (busy traffic turns a small cache over, and its holes
                   are assumed not to shrink with it: measured on a 4 GiB cache only). A freed
                   checkpoint's or saved state's chunk stays resident, and a smaller allocation split
                   from it leaves the next one too little room, so the heap grows past what is live.
                   Checkpoints are all one size and reuse their chunks; the cache's saved states
                   differ in size (the state and each prompt's own KV rows, and their checkpoints)
                   and leave the holes.
                   Fitted on the GPU (bench/records/proof51 sessions 5-8): 1.1 % of the checkpoints
                   at most without a cache (1x, session 5), 15.7 % of an 8 GiB cache without
                   checkpoints (2x, session 8); one share of both, 0.07, was 7.1 % under that one.
                   Their second runs (sessions 9-11) held; session 12 found the share 0.4 % under
                   a 4 GiB cache at 4x (17.3 % of it kept, 711 MiB): the floor, 1024 MiB, is fitted
                   on that run; its second run (that config again, session 13) held, 2.2 % above
                   (16.8 % kept, 691 MiB). Each session's records test checks the plan against
                   every config (bench/RESULTS.md). Assumed: that a cache's heap stops growing (it
                   rose over one server's replays)
    kernel         the page tables, 8 bytes for each 4 KiB page of anonymous memory (1/512 of it:
                   145 MiB at 16 x 31 checkpoints of 149.6 MiB), and hostmem_kernel_mib of the rest
                   (slab, sockets), which grows while the kernel reclaims the cgroup's page cache at
                   its ceiling: kernel memory is charged to the cgroup like the rest

What the kernel cannot reclaim at the ceiling is the instance's `held`: the anonymous terms (process,
host buffers, checkpoints, prompt cache, heap, the model read with -lm none) and the kernel term. The file
pages read at every step (the program, a mapped model) come on top in its `total`. The process terms are
fitted by bench/gpu/gpu_proof.fit49 on the H200 runs bench/records/proof49/run3 and run4, and validated on
run5 (not fitted on: within 5 % and never under at 16 slots, 0 to 512 checkpoints; bench/RESULTS.md).

The host needs instances x the instance's total + hostmem_reserve_mib (the system, sshd, the
page cache), against MemTotal. Each instance's unit gets one ceiling, MemoryMax = total x (1 +
hostmem_ceiling_margin) (cgroup v1: memory.limit_in_bytes), and no MemoryHigh (docs/host.md, issue
49). The kernel charges the cgroup for page cache as well (the model file's pages, charged to the
cgroup that first reads them) and reclaims that clean cache before it OOM-kills: a ceiling only has
to hold what cannot be reclaimed, which is what the plan counts. A MemoryHigh anywhere below
"plan + the whole model file" would be crossed by the page cache alone at every load and throttle a
healthy server (memory.events high), and without swap a throttle can reclaim nothing more than
MemoryMax reclaims: it only slows the server while /health still answers.

    >>> p = plan(cfg, vram.ModelShape.from_header(header), instances=4, mem_total=256 * GIB)  # v100_32gb at 32 checkpoints
    >>> p.text()
    'host memory: 4 x 78.5 GiB + 8.0 GiB reserve = 322.0 GiB of 256.0 GiB (MemTotal): short by 66.0 GiB'
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from voltafleet.inputs.settings import Settings
from voltafleet.planning import vram

MIB = 1024 * 1024
GIB = 1024 * MIB
CACHE_RAM_DEFAULT_MIB = 8192   # llama.cpp common.h cache_ram_mib: --cache-ram when not given
CHECKPOINTS_DEFAULT = 32       # llama.cpp common.h n_ctx_checkpoints: --ctx-checkpoints when not given
N_BATCH = 2048                 # llama.cpp's -b: the most logits rows the output buffer holds
STATE_HEADER = 32              # bytes a layer adds to a saved sequence state (type, row size; 149.626 vs 149.625 MiB)
HOST_COMPUTE_SLACK = 2 * MIB   # the CUDA_Host compute buffer's remainder beyond the fit (0.02-0.33 MiB measured)
PAGE_TABLE_SHARE = 512         # a page-table entry (8 bytes) for each 4 KiB page of anonymous memory


@dataclass(frozen=True)
class Instance:
    """One llama-server's host memory, in bytes."""

    process: int
    model: int
    model_mapped: bool
    host_buffers: int
    slots: int
    checkpoints_per_slot: int
    checkpoint_bytes: int
    cache_ram: int
    program: int = 0                  # the binary's and its libraries' file pages (hostmem_program_mib)
    kernel: int = 0                   # kernel memory beside the page tables (hostmem_kernel_mib): slab, sockets
    heap_share: float = 0.0           # hostmem_heap_share where server_malloc_heap is on, else 0
    cache_heap_share: float = 0.0     # hostmem_cache_heap_share where server_malloc_heap is on, else 0
    cache_heap_floor: int = 0         # hostmem_cache_heap_floor_mib (bytes) where server_malloc_heap is on, else 0

    @property
    def checkpoints(self) -> int:
        return self.slots * self.checkpoints_per_slot * self.checkpoint_bytes

    @property
    def heap(self) -> int:
        """What a never-trimmed heap keeps resident beyond the live checkpoints and prompt cache (its holes): a
        share of each, the cache's the larger (its saved states differ in size, a checkpoint's never do), and for a
        cache no less than its floor (busy traffic turns a small cache over; its holes are assumed not to shrink with
        it)."""
        cache = max(self.cache_heap_share * self.cache_ram, self.cache_heap_floor) if self.cache_ram else 0
        return math.ceil(self.heap_share * self.checkpoints + cache)

    @property
    def anonymous(self) -> int:
        """What the process allocates: nothing the kernel can give back without swap."""
        return (self.process + self.host_buffers + self.checkpoints + self.cache_ram + self.heap
                + (0 if self.model_mapped else self.model))

    @property
    def page_tables(self) -> int:
        return self.anonymous // PAGE_TABLE_SHARE

    @property
    def held(self) -> int:
        """What the kernel cannot reclaim at the ceiling (the cgroup's charge less its page cache)."""
        return self.anonymous + self.page_tables + self.kernel

    @property
    def total(self) -> int:
        """held, and the file pages it reads at every step: the program, the model when mapped."""
        return self.held + self.program + (self.model if self.model_mapped else 0)

    def describe(self) -> str:
        ckpt = (f"checkpoints {self.slots} slots x {self.checkpoints_per_slot} x {size(self.checkpoint_bytes, 'MiB')} = "
                f"{size(self.checkpoints)}" if self.checkpoints else "checkpoints 0")
        return (f"process {size(self.process)} + program {size(self.program)} + model {size(self.model)} ({'mmap' if self.model_mapped else 'read'}) "
                f"+ host buffers {size(self.host_buffers)} + {ckpt} + prompt cache {size(self.cache_ram)} "
                + (f"+ heap {size(self.heap)} " if self.heap else "") + f"+ kernel {size(self.page_tables + self.kernel)} = {size(self.total)}")


@dataclass(frozen=True)
class HostMemoryPlan:
    """A host's memory plan: its instances at their worst against its RAM, and each unit's ceiling."""

    instance: Instance
    instances: int
    reserve: int
    mem_total: int | None
    mem_available: int | None
    ceiling_margin: float
    unplanned: str | None = None       # terms left out and why (no GGUF header: model and checkpoints are 0)
    cache_unbounded: bool = False      # server_cache_ram -1: llama.cpp's cache has no size limit
    fixes: tuple[str, ...] = ()        # "key: value" settings that would each make the host fit

    @property
    def need(self) -> int:
        return self.instances * self.instance.total + self.reserve

    @property
    def memory_max(self) -> int:
        """The unit's one ceiling (MemoryMax; cgroup v1's memory.limit_in_bytes): the plan and its margin.
        Past it, once the kernel has reclaimed the cgroup's page cache, its OOM killer ends this server."""
        return math.ceil(self.instance.total * (1 + self.ceiling_margin))

    @property
    def fits(self) -> bool:
        return not self.cache_unbounded and (self.mem_total is None or self.need <= self.mem_total)

    def refusal(self, host: str) -> str | None:
        """Why the host cannot hold its servers at their worst, with the numbers and the fix; None when it can
        (or MemTotal was not read)."""
        if self.cache_unbounded:
            return (f"{host}: server_cache_ram: is -1: llama-server's prompt cache then has no size limit and the "
                    "host memory plan cannot bound it. Fix: set server_cache_ram to a limit in MiB (0: off)")
        if self.fits:
            return None
        fix = (f"Fix (any one): {'; '.join(self.fixes)}; or a host with more memory" if self.fixes else
               "Fix: a host with more memory (no single setting of this group fits it), or lower hostmem_reserve_mib")
        return (f"{host}: the servers do not fit the host's memory at their worst: {self.text()}. Per instance: "
                f"{self.instance.describe()}. {fix}")

    def text(self) -> str:
        """One line for the log and --plan."""
        line = (f"host memory: {self.instances} x {size(self.instance.total)} + {size(self.reserve)} reserve = "
                f"{size(self.need)}")
        if self.mem_total is None:
            line += " (MemTotal not read: not checked)"
        else:
            line += f" of {size(self.mem_total)} (MemTotal): " + (
                "fits" if self.need <= self.mem_total else f"short by {size(self.need - self.mem_total)}")
        return line + (f"; not planned: {self.unplanned}" if self.unplanned else "")


def size(n: int, unit: str | None = None) -> str:
    """Bytes as GiB (one decimal) from 1 GiB up, else MiB; `unit` forces one (MiB with 3 decimals
    below 1 GiB, as llama.cpp logs a checkpoint)."""
    if unit == "MiB":
        return f"{n / MIB:,.3f} MiB" if n < GIB else f"{n / MIB:,.0f} MiB"
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:,.0f} MiB"


# ---------------------------------------------------------------- the terms


def speculative_draft(cfg: Settings) -> int:
    """Draft tokens a slot verifies at most: MTP or a draft model (server_spec_draft_max), n-gram
    drafts (vram.NGRAM_DRAFT_MAX); 0 without speculation."""
    draft = int(cfg.server.spec_draft_max) if cfg.server.spec_mtp or cfg.model.draft_url else 0
    return max(draft, vram.NGRAM_DRAFT_MAX if cfg.server.spec_ngram else 0)


def output_bytes(cfg: Settings, shape, slots: int, ctx: int) -> int:
    """The output buffer at its largest (llama-context.cpp output_reserve): a row a slot, 1 + draft a
    slot while verifying, at most -b rows; each row n_vocab F32 logits, and with backend sampling
    probabilities, candidates (F32, token ids) and the sampled id too."""
    rows = min(min(N_BATCH, ctx), slots * (1 + speculative_draft(cfg)))
    per_row = shape.n_vocab * 4 + (3 * shape.n_vocab * 4 + 4 if cfg.server.backend_sampling else 0)
    return max(rows, slots) * per_row


def ctx_per_slot(ctx: int, slots: int) -> int:
    return -(-(ctx // slots) // vram.CTX_PAD) * vram.CTX_PAD


def host_compute_bytes(shape, ctx: int, slots: int, ubatch: int, ref: str | None = vram.PIN_GRAPH_REFS[0]) -> int:
    """CUDA_Host compute buffer: one ubatch of 8 x n_embd bytes a token and the f16 KQ mask of one slot
    (20.0 + 8.0 MiB at -ub 512 and 8K a slot: 28.28 measured; 112.34 at -ub 2048), and what llama.cpp `ref`'s
    graph adds (vram.graph_extra_bytes: b11434's 48.29 measured)."""
    return (ubatch * (8 * shape.n_embd + 2 * ctx_per_slot(ctx, slots)) + HOST_COMPUTE_SLACK
            + vram.graph_extra_bytes(shape, ref, ubatch))


def checkpoint_bytes(shape, ctx: int, slots: int, cache_k: str, cache_v: str, ubatch: int) -> int:
    """One context checkpoint (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY): the recurrent state of a sequence,
    a sliding-window layer's cells (at most the window and one ubatch of the slot), each layer's header."""
    swa = 0
    if shape.swa_layers:
        cells = min(ctx_per_slot(ctx, slots), shape.swa_window + ubatch)
        per_cell = shape.n_head_kv * (shape.head_k * vram.type_bytes(cache_k) + shape.head_v * vram.type_bytes(cache_v))
        swa = int(len(shape.swa_layers) * cells * per_cell)
    return shape.recurrent_bytes_per_seq + swa + STATE_HEADER * shape.n_layer


def checkpoints_per_slot(cfg: Settings, shape) -> int:
    """--ctx-checkpoints (llama.cpp's 32 when null), one more while speculating (the draft's rollback
    checkpoint); 0 for a model that needs none (neither recurrent nor sliding-window)."""
    if shape is None or not (shape.hybrid or shape.swa_layers):
        return 0
    n = cfg.server.ctx_checkpoints
    return (CHECKPOINTS_DEFAULT if n is None else int(n)) + (1 if speculative_draft(cfg) else 0)


def cache_bytes(cfg: Settings) -> int:
    """--cache-ram in bytes (null: llama.cpp's 8192 MiB; 0 off; -1 unbounded: 0 here, refused by the plan)."""
    mib = cfg.server.cache_ram
    mib = CACHE_RAM_DEFAULT_MIB if mib is None else int(mib)
    return max(mib, 0) * MIB


def model_bytes(cfg: Settings, shape, slots: int, ctx: int, ubatch: int) -> int:
    """The model's host-resident bytes: see the module's docstring."""
    k, v = cfg.server.cache_type_k, cfg.server.cache_type_v
    draft = int(cfg.server.spec_draft_max) if cfg.server.spec_mtp else 0
    state = shape.recurrent_bytes_per_seq * slots * (1 + draft)
    if cfg.preflight.backend != "cuda":
        weights = shape.file_weights + (shape.mtp_bytes if cfg.server.spec_mtp else 0)
        return (weights + vram.kv_bytes(shape, ctx, slots, k, v, ubatch) + state
                + vram.compute_bytes(shape, ctx, slots, k, v, ubatch, cfg.build.ref))
    layers = cfg.server.gpu_layers
    trunk = shape.n_layer - shape.nextn_layers
    cpu_layers = 0 if layers == "all" else max(0, trunk - int(layers))
    if not cpu_layers:
        return shape.tok_embd_bytes
    # a partial offload (server_allow_partial_offload): the first layers stay on the CPU with their share of
    # the weights, the KV cache and the recurrent states (an estimate: layers taken as equal)
    share = cpu_layers / trunk
    return shape.tok_embd_bytes + int(share * (shape.weights_gpu + vram.kv_bytes(shape, ctx, slots, k, v, ubatch) + state))


def instance(cfg: Settings, shape, slots: int | None = None, checkpoints: int | None = None,
             cache_mib: int | None = None, ctx: int | None = None) -> Instance:
    """One instance's plan at `slots` slots sharing `ctx` (the host plan's decisions; by default the
    settings' server_parallel and server_ctx); `checkpoints` (a slot) and `cache_mib` override the
    settings', for the fixes."""
    slots = slots or int(cfg.server.parallel or 1)
    ctx = int(ctx or cfg.server.ctx or vram.CTX_LADDER[-1])
    ubatch = int(cfg.server.ubatch or vram.N_UBATCH)
    cache = cache_bytes(cfg) if cache_mib is None else cache_mib * MIB
    process = int((cfg.server.hostmem_process_mib + slots * cfg.server.hostmem_slot_mib) * MIB)
    program = int(cfg.server.hostmem_program_mib) * MIB
    kernel = int(cfg.server.hostmem_kernel_mib) * MIB
    mapped = bool(cfg.server.mmap)
    heap_share = float(cfg.server.hostmem_heap_share) if cfg.server.malloc_heap else 0.0
    cache_heap_share = float(cfg.server.hostmem_cache_heap_share) if cfg.server.malloc_heap else 0.0
    floor = int(cfg.server.hostmem_cache_heap_floor_mib) * MIB if cfg.server.malloc_heap else 0
    if shape is None:
        return Instance(process, 0, mapped, 0, slots, 0, 0, cache, program, kernel, heap_share, cache_heap_share, floor)
    host = output_bytes(cfg, shape, slots, ctx)
    if cfg.preflight.backend == "cuda":
        host += host_compute_bytes(shape, ctx, slots, ubatch, cfg.build.ref)
    per_slot = checkpoints_per_slot(cfg, shape) if checkpoints is None else checkpoints
    return Instance(process, model_bytes(cfg, shape, slots, ctx, ubatch), mapped, host, slots, per_slot,
                    checkpoint_bytes(shape, ctx, slots, cfg.server.cache_type_k, cfg.server.cache_type_v, ubatch)
                    if per_slot else 0, cache, program, kernel, heap_share, cache_heap_share, floor)


# ---------------------------------------------------------------- the plan


def largest(fits, most: int) -> int:
    """The largest n in 0..most with fits(n) (fits grows false as n grows); -1 when none."""
    lo, hi = -1, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def fixes(cfg: Settings, shape, inst: Instance, instances: int, budget: int, ctx: int | None = None) -> list[str]:
    """Each setting that alone would bring one instance within `budget` bytes: the most checkpoints,
    the most slots, the largest host cache, the most instances."""
    out = []
    spec = 1 if speculative_draft(cfg) and inst.checkpoints_per_slot else 0
    if inst.checkpoints and inst.checkpoint_bytes:
        n = largest(lambda k: replace(inst, checkpoints_per_slot=k + spec).total <= budget,
                    inst.checkpoints_per_slot - spec)
        if 0 <= n < inst.checkpoints_per_slot - spec:
            out.append(f"server_ctx_checkpoints: {n}" + (" (0: a follow-up that leaves the cached prompt reprocesses "
                                                          "it whole)" if n == 0 else " or fewer"))
    per_slot_ctx = int(ctx or cfg.server.ctx or vram.CTX_LADDER[-1]) // inst.slots
    for s in range(inst.slots - 1, 0, -1):
        if instance(cfg, shape, slots=s, ctx=per_slot_ctx * s).total <= budget:
            out.append(f"server_parallel: {s} or fewer, with server_ctx: {per_slot_ctx * s} (the same context a slot)")
            break
    if inst.cache_ram:
        mib = largest(lambda m: replace(inst, cache_ram=m * MIB).total <= budget, inst.cache_ram // MIB)
        if mib >= 0:
            out.append(f"server_cache_ram: {mib}" + (" (off)" if mib == 0 else " or less"))
    whole = budget * instances // inst.total if inst.total else instances
    if 1 <= whole < instances:
        out.append(f"server_instances: {whole}")
    return out


def plan(cfg: Settings, shape, instances: int, mem_total: int | None = None, mem_available: int | None = None,
         slots: int | None = None, ctx: int | None = None) -> HostMemoryPlan:
    """The host's memory plan, each instance at `slots` slots sharing `ctx` (the host plan's decisions;
    by default the settings'). `shape`: the model's vram.ModelShape, or None when its GGUF header
    could not be read (then the model, host-buffer and checkpoint terms are 0 and the plan says so)."""
    inst = instance(cfg, shape, slots=slots, ctx=ctx)
    reserve = int(cfg.server.hostmem_reserve_mib) * MIB
    out = HostMemoryPlan(inst, instances, reserve, mem_total, mem_available, float(cfg.server.hostmem_ceiling_margin),
               None if shape is not None else "the model, its host buffers and checkpoints (no GGUF header)",
               cfg.server.cache_ram == -1)
    if mem_total is not None and out.need > mem_total and instances:
        budget = (mem_total - reserve) // instances
        out = replace(out, fixes=tuple(fixes(cfg, shape, inst, instances, budget, ctx)))
    return out
