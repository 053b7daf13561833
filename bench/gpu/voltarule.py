"""Make a non-Volta NVIDIA GPU take Volta's exact kernel choice (issue 27); stdlib only.

Applied by bench/gpu/gpu_proof.sh to the pinned llama.cpp source on the GPU machine only (never
to a fleet's build), after the stock build, then two objects are rebuilt. Two hunks:

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


class AnchorMissing(RuntimeError):
    pass


def patched(name: str, text: str) -> str:
    """The file's text with its hunks applied; AnchorMissing when an anchor is not there once."""
    for f, old, new in HUNKS:
        if f != name:
            continue
        if text.count(old) != 1:
            raise AnchorMissing(f"{name}: the anchor {old.strip().splitlines()[0]!r} is there "
                                f"{text.count(old)} times, not once: the pinned source moved")
        text = text.replace(old, new)
    return text


def apply(src: Path) -> str:
    """Patch both files under src in place; the unified diff."""
    diff = []
    for name in dict.fromkeys(f for f, _, _ in HUNKS):
        p = Path(src) / name
        before = p.read_text()
        after = patched(name, before)
        p.write_text(after)
        diff += difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{name}", f"b/{name}")
    return "".join(diff)


if __name__ == "__main__":
    try:
        print(apply(Path(sys.argv[1])), end="")
    except (AnchorMissing, OSError) as e:
        print(f"voltarule: {e}", file=sys.stderr)
        sys.exit(1)
