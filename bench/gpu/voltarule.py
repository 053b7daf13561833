"""Make a non-Volta NVIDIA GPU take Volta's exact kernel choice (issue 27); stdlib only.

Applied by bench/gpu/gpu_proof.sh to the pinned llama.cpp source on the GPU machine only (never
to a fleet's build), after the stock build, then the objects it touches are rebuilt:

1. ggml-cuda/mmq.cu, ggml_cuda_should_use_mmq: a card with Turing's int8 MMA returns true
   (MMQ for every batch) before the rule Volta reaches. Volta (cc 7.0: FP16 tensor cores, no
   Turing MMA, dp4a compiled) returns `ne11 < MMQ_DP4A_MAX_BATCH_SIZE` (64), or true with
   GGML_CUDA_FORCE_MMQ. The hunk returns exactly that for the Turing-MMA branch, so the H200
   runs MMVQ up to 8 columns (unchanged: ggml_cuda_should_use_mmvq has no Hopper case), MMQ
   up to 63 and cuBLAS on F16-dequantized weights from 64, or MMQ always with FORCE_MMQ.
2. ggml-cuda.cu, ggml_cuda_mul_mat_cublas_impl: with F16 compute, Volta writes cuBLAS's result
   as F32 straight into dst (`prefer_f32_output = cc == GGML_CUDA_CC_VOLTA || ...`); other
   NVIDIA cards allocate an F16 dst in the CUDA pool and convert. The hunk takes Volta's branch,
   so the pool holds what Volta's holds (and the arithmetic is Volta's: F32 accumulation out).

3. ggml-cuda/mmvq.cu, get_device_table_id (device and host), from b11434 on (upstream #29753): Volta
   takes the Turing decode table (MMVQ_PARAMETERS_TURING: warps, rows per block, shared memory);
   Hopper takes the generic one. The hunks send every NVIDIA card from Volta up to the Turing table,
   as Volta's. Before #29753 (the pin, b11312) Volta and Hopper both take the generic table: nothing
   to change, and a source that has neither form is refused (MMVQ_OLD marks the older form).
   mmvq.cu's other compute-capability tests choose for MUL_MAT_ID (mixture-of-experts) and IQ types,
   which a dense Q4_K_S model never runs.

What stays Hopper's: the kernels themselves (MMQ uses int8 MMA here, dp4a on Volta; the
flash-attention kernels are Hopper's, not Volta's MMA/TILE/VEC; cuBLAS picks Hopper GEMMs),
clocks, bandwidth and the CUDA context. Memory follows the choice; speed does not transfer.

    python3 bench/gpu/voltarule.py SRC_DIR      # patch in place, print the diff; exit 1 if an anchor moved
"""
from __future__ import annotations

import difflib
import sys
from pathlib import Path

MMQ = "ggml/src/ggml-cuda/mmq.cu"
CUDA = "ggml/src/ggml-cuda/ggml-cuda.cu"
HUNKS = [
    (MMQ,
     "    if (turing_mma_available(cc)) {\n        return true;\n    }\n",
     "    if (turing_mma_available(cc)) {  // voltafleet voltarule: Volta's choice (cc 7.0)\n"
     "#ifdef GGML_CUDA_FORCE_MMQ\n        return true;\n#endif // GGML_CUDA_FORCE_MMQ\n"
     "        return ne11 < MMQ_DP4A_MAX_BATCH_SIZE;\n    }\n"),
    (CUDA,
     "        prefer_f32_output = cc == GGML_CUDA_CC_VOLTA ||",
     "        prefer_f32_output = true /* voltafleet voltarule: Volta's F32 output */ || cc == GGML_CUDA_CC_VOLTA ||"),
]


MMVQ = "ggml/src/ggml-cuda/mmvq.cu"
# from b11434 (#29753): Volta in the Turing table, in the device function and in the host one
MMVQ_HUNKS = [
    (MMVQ,
     "#elif __CUDA_ARCH__ >= GGML_CUDA_CC_VOLTA && __CUDA_ARCH__ < GGML_CUDA_CC_AMPERE\n",
     "#elif __CUDA_ARCH__ >= GGML_CUDA_CC_VOLTA  // voltafleet voltarule: Volta's table (Turing's)\n"),
    (MMVQ,
     "ggml_cuda_highest_compiled_arch(cc) >= GGML_CUDA_CC_VOLTA && ggml_cuda_highest_compiled_arch(cc) < "
     "GGML_CUDA_CC_AMPERE) {\n",
     "ggml_cuda_highest_compiled_arch(cc) >= GGML_CUDA_CC_VOLTA) {  // voltafleet voltarule: Volta's table\n"),
]
# before it (the pin, b11312): the Turing table from Turing up, Volta and Hopper in the generic one
MMVQ_OLD = "#elif __CUDA_ARCH__ >= GGML_CUDA_CC_TURING && __CUDA_ARCH__ < GGML_CUDA_CC_AMPERE\n"


class AnchorMissing(RuntimeError):
    pass


def patched(name: str, text: str, hunks: list[tuple[str, str, str]] = HUNKS) -> str:
    """The file's text with its hunks applied; AnchorMissing when an anchor is not there once."""
    for f, old, new in hunks:
        if f != name:
            continue
        if text.count(old) != 1:
            raise AnchorMissing(f"{name}: the anchor {old.strip().splitlines()[0]!r} is there "
                                f"{text.count(old)} times, not once: the pinned source moved")
        text = text.replace(old, new)
    return text


def hunks_for(mmvq_text: str) -> list[tuple[str, str, str]]:
    """The hunks this source takes: HUNKS, and MMVQ_HUNKS where mmvq.cu sends Volta to the Turing table;
    AnchorMissing where mmvq.cu has neither that form nor the older one (MMVQ_OLD)."""
    if MMVQ_HUNKS[0][1] in mmvq_text:
        return HUNKS + MMVQ_HUNKS
    if MMVQ_OLD in mmvq_text:
        return HUNKS
    raise AnchorMissing(f"{MMVQ}: its table choice is in neither known form (Volta in the Turing table, or "
                        "the Turing table from Turing up): the source moved")


def apply(src: Path) -> str:
    """Patch the files under src in place; the unified diff."""
    diff = []
    hunks = hunks_for((Path(src) / MMVQ).read_text())
    for name in dict.fromkeys(f for f, _, _ in hunks):
        p = Path(src) / name
        before = p.read_text()
        after = patched(name, before, hunks)
        p.write_text(after)
        diff += difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{name}", f"b/{name}")
    return "".join(diff)


if __name__ == "__main__":
    try:
        print(apply(Path(sys.argv[1])), end="")
    except (AnchorMissing, OSError) as e:
        print(f"voltarule: {e}", file=sys.stderr)
        sys.exit(1)
