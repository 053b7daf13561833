"""voltarule across the two pins (issue 50): b11434 sends Volta to MMVQ's Turing decode table (upstream
#29753), so Volta's exact kernel choice on a Hopper card takes that table too; at the pin (b11312) Volta and
Hopper share the generic table and nothing changes. The excerpts are the two sources' own lines."""
from __future__ import annotations

import pytest

from bench.gpu import voltarule

# ggml/src/ggml-cuda/mmvq.cu, get_device_table_id, at b11434 and at b11312 (the lines the choice rests on)
NEW = """#elif defined(GCN) || defined(CDNA)
    return MMVQ_PARAMETERS_GCN;
#elif __CUDA_ARCH__ >= GGML_CUDA_CC_VOLTA && __CUDA_ARCH__ < GGML_CUDA_CC_AMPERE
    return MMVQ_PARAMETERS_TURING;
#elif __CUDA_ARCH__ == GGML_CUDA_CC_DGX_SPARK
    return MMVQ_PARAMETERS_GB10;
#else
    return MMVQ_PARAMETERS_GENERIC;
#endif
}
    if (GGML_CUDA_CC_IS_NVIDIA(cc) && ggml_cuda_highest_compiled_arch(cc) >= GGML_CUDA_CC_VOLTA && ggml_cuda_highest_compiled_arch(cc) < GGML_CUDA_CC_AMPERE) {
        return MMVQ_PARAMETERS_TURING;
    }
"""
OLD = NEW.replace("__CUDA_ARCH__ >= GGML_CUDA_CC_VOLTA", "__CUDA_ARCH__ >= GGML_CUDA_CC_TURING").replace(
    "ggml_cuda_highest_compiled_arch(cc) >= GGML_CUDA_CC_VOLTA", "ggml_cuda_highest_compiled_arch(cc) >= GGML_CUDA_CC_TURING")


def table_for_hopper(text: str) -> str:
    """Which table the device function gives sm_90 in this text: the first #if/#elif arm that holds for 900."""
    volta, turing, ampere, spark = 700, 750, 800, 1210
    arms = {"__CUDA_ARCH__ >= GGML_CUDA_CC_VOLTA && __CUDA_ARCH__ < GGML_CUDA_CC_AMPERE": volta <= 900 < ampere,
            "__CUDA_ARCH__ >= GGML_CUDA_CC_TURING && __CUDA_ARCH__ < GGML_CUDA_CC_AMPERE": turing <= 900 < ampere,
            "__CUDA_ARCH__ >= GGML_CUDA_CC_VOLTA  //": 900 >= volta, "__CUDA_ARCH__ == GGML_CUDA_CC_DGX_SPARK": 900 == spark}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("#elif __CUDA_ARCH__") and any(a in line and ok for a, ok in arms.items()):
            return lines[i + 1].strip()
    return "return MMVQ_PARAMETERS_GENERIC;"


def tree(tmp_path, mmvq: str):
    d = tmp_path / "src"
    for name, text in ((voltarule.MMQ, "x\n" + voltarule.HUNKS[0][1]), (voltarule.CUDA, voltarule.HUNKS[1][1] + "\n"),
                       (voltarule.MMVQ, mmvq)):
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)
    return d


def test_b11434_s_turing_table_for_volta_is_taken_on_hopper_too(tmp_path):
    assert table_for_hopper(NEW) == "return MMVQ_PARAMETERS_GENERIC;"       # stock b11434: Hopper generic, Volta Turing
    src = tree(tmp_path, NEW)
    diff = voltarule.apply(src)
    out = (src / voltarule.MMVQ).read_text()
    assert table_for_hopper(out) == "return MMVQ_PARAMETERS_TURING;"         # patched: Volta's table
    assert "ggml_cuda_highest_compiled_arch(cc) >= GGML_CUDA_CC_VOLTA) {" in out and "< GGML_CUDA_CC_AMPERE" not in out
    assert diff.count("voltafleet voltarule") == 4 and f"+++ b/{voltarule.MMVQ}" in diff


def test_the_pin_s_generic_table_is_volta_s_already_and_stays(tmp_path):
    assert table_for_hopper(OLD) == "return MMVQ_PARAMETERS_GENERIC;"
    assert voltarule.hunks_for(OLD) == voltarule.HUNKS
    src = tree(tmp_path, OLD)
    diff = voltarule.apply(src)
    assert (src / voltarule.MMVQ).read_text() == OLD and voltarule.MMVQ not in diff
    assert diff.count("voltafleet voltarule") == 2


def test_a_source_whose_table_choice_moved_again_is_refused(tmp_path):
    moved = NEW.replace("__CUDA_ARCH__ >= GGML_CUDA_CC_VOLTA && __CUDA_ARCH__ < GGML_CUDA_CC_AMPERE", "defined(SOMETHING)")
    with pytest.raises(voltarule.AnchorMissing, match="neither known form"):
        voltarule.apply(tree(tmp_path, moved))
    with pytest.raises(voltarule.AnchorMissing, match="2 times"):
        voltarule.apply(tree(tmp_path, NEW + NEW))
