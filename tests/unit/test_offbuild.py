"""Issue 51's llama-server built off the GPU machine (bench/gpu/offbuild.py) and taken there (gpu_proof.sh's
prebuilt branch, pin_proof.pack51 --prebuilt): the toolkit's layout, the driver's link-time stand-in linked and
run for real, the binary's checksum checked on the GPU machine before anything runs, and a pack without sources."""
from __future__ import annotations

import hashlib
import json
import lzma
import subprocess
import zipfile
from pathlib import Path

import pytest

from bench.gpu import gpu_proof, offbuild, pin_proof
from tests.unit.test_gpu_proof import checkout  # noqa: F401  (the tiny llama.cpp repository fixture)
from tests.unit.test_pin50_proof import newer

REPO = gpu_proof.REPO


def wheel(path: Path, files: dict) -> Path:
    """A zip at `path` with each name's bytes (mode 0755 for a name under bin/)."""
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o755 if "/bin/" in name else 0o644) << 16
            z.writestr(info, data)
    return path


@pytest.fixture
def wheels(tmp_path):
    return [wheel(tmp_path / "nvcc.whl", {"nvidia/cu13/bin/nvcc": "#!/bin/sh\necho nvcc\n",
                                          "nvidia/cu13/include/crt/host_config.h": "// crt\n",
                                          "nvidia_cuda_nvcc-13.0.88.dist-info/METADATA": "x"}),
            wheel(tmp_path / "nvvm.whl", {"nvidia/cu13/nvvm/bin/cicc": "cicc", "nvidia/cu13/nvvm/libdevice/x.bc": "b"}),
            wheel(tmp_path / "rt.whl", {"nvidia/cu13/include/cuda_runtime.h": "// rt\n",
                                        "nvidia/cu13/lib/libcudart.so.13": "so"}),
            wheel(tmp_path / "cublas.whl", {"nvidia/cu13/include/cublas_v2.h": "// blas\n",
                                            "nvidia/cu13/lib/libcublas.so.13": "so", "nvidia/cu13/lib/libcublasLt.so.13": "so"})]


def test_the_wheels_are_laid_out_as_cuda_s_own_tree(tmp_path, wheels):
    prefix = tmp_path / "cuda-13.0"
    offbuild.layout(wheels, prefix)
    assert (prefix / "bin/nvcc").stat().st_mode & 0o111 and (prefix / "nvvm/bin/cicc").read_text() == "cicc"
    # nvcc.profile's $(TOP)/targets/x86_64-linux/include and CMake's lib64 both reach the wheels' files
    assert (prefix / "targets/x86_64-linux/include/crt/host_config.h").read_text() == "// crt\n"
    assert (prefix / "include/cuda_runtime.h").read_text() == "// rt\n"
    for lib in ("libcudart", "libcublas", "libcublasLt"):
        assert (prefix / f"lib64/{lib}.so").resolve() == (prefix / f"targets/x86_64-linux/lib/{lib}.so.13").resolve()
    assert not (prefix / "nvidia_cuda_nvcc-13.0.88.dist-info").exists()
    # its own tree from the same wheels is left as it is (not a file newer); from other wheels, laid out again
    before = {p: p.lstat().st_mtime_ns for p in prefix.rglob("*")}
    offbuild.layout(wheels, prefix)
    assert {p: p.lstat().st_mtime_ns for p in prefix.rglob("*")} == before
    offbuild.layout([*wheels, wheel(tmp_path / "more.whl", {"nvidia/cu13/include/more.h": "// more\n"})], prefix)
    assert (prefix / "include/more.h").exists() and (prefix / "bin/nvcc").exists()
    with pytest.raises(SystemExit, match="hold no nvidia/cu13/bin"):  # refused before the tree is touched
        offbuild.layout(wheels[1:], prefix)
    assert (prefix / "include/more.h").exists() and (prefix / offbuild.MARK).exists()
    # a toolkit it did not lay out is left as it is
    other = tmp_path / "cuda-real"
    (other / "bin").mkdir(parents=True)
    (other / "bin/nvcc").write_text("real")
    with pytest.raises(SystemExit, match="did not lay out"):
        offbuild.layout(wheels, other)
    assert (other / "bin/nvcc").read_text() == "real"


def test_a_wheel_whose_sum_is_not_the_pinned_one_is_refused(tmp_path):
    f = tmp_path / "nvidia_cuda_nvcc-13.0.88-x.whl"
    f.write_bytes(b"not the wheel")
    with pytest.raises(SystemExit, match=r"nvidia_cuda_nvcc-13.0.88-x.whl: sha256 .* pinned 56fe50.*WHEELS"):
        offbuild.checked(f, offbuild.WHEELS[0][2])
    assert offbuild.checked(f, hashlib.sha256(b"not the wheel").hexdigest()) == f
    # every pin names one version and a sha256; the toolkit is the GPU machine's nvcc
    assert [w[:2] for w in offbuild.WHEELS][0] == ("nvidia-cuda-nvcc", "13.0.88")
    assert all(len(w[2]) == 64 for w in (*offbuild.WHEELS, offbuild.CMAKE))
    assert "release 13.0, V13.0.88" in (REPO / "bench/records/proof51/session15/call1/facts.txt").read_text()


def test_the_driver_s_stand_in_links_a_caller_that_then_finds_no_gpu(tmp_path):
    """A program calling the driver API llama.cpp's pool calls links against the stand-in (libcuda.so, soname
    libcuda.so.1) and runs on it: each call fails, as on a machine without a GPU."""
    stubs = offbuild.stub(tmp_path / "cuda")
    soname = subprocess.run(["readelf", "-d", str(stubs / "libcuda.so")], capture_output=True, text=True, check=True)
    assert "Library soname: [libcuda.so.1]" in soname.stdout
    src = tmp_path / "caller.c"
    src.write_text("".join(f"int {s}(void);\n" for s in offbuild.DRIVER_SYMBOLS)
                   + "int main(void) { return cuMemCreate() == 999 && cuDeviceGet() == 999 ? 0 : 1; }\n")
    subprocess.run(["gcc", "-o", str(tmp_path / "caller"), str(src), f"-L{stubs}", "-lcuda"], check=True)
    needed = subprocess.run(["readelf", "-d", str(tmp_path / "caller")], capture_output=True, text=True).stdout
    assert "Shared library: [libcuda.so.1]" in needed
    assert subprocess.run([str(tmp_path / "caller")], env={"LD_LIBRARY_PATH": str(stubs)}).returncode == 0
    # without a symbol it defines, a caller does not link
    src.write_text("int cuMemExportToShareableHandle(void);\nint main(void) { return cuMemExportToShareableHandle(); }\n")
    assert subprocess.run(["gcc", "-o", str(tmp_path / "caller2"), str(src), f"-L{stubs}", "-lcuda"],
                          capture_output=True).returncode != 0


def prebuilt_dir(path: Path, fp: str, binary: bytes, tmp: Path) -> Path:
    """offbuild.collect's folder for a run whose logs name release `fp` and whose llama-server is `binary`."""
    res = tmp / "res"
    res.mkdir(exist_ok=True)
    for f in offbuild.LOGS:
        (res / f).write_text(f"{tmp}/pack/gpu_proof.sh: line 36: nvidia-smi: command not found\n")
    (res / "build.txt").write_text(f"voltafleet: compiling llama.cpp 6b0958fe153a as release {fp} on vm\n")
    (res / "variants.diff").write_text("+#define GGML_CUDA_FORCE_MMQ\n")
    b = tmp / "llama-server"
    b.write_bytes(binary)
    m = offbuild.collect(res, b, path, {"w.whl": hashlib.sha256(b"w").hexdigest()}, tmp / "pack")
    assert m["sha256"] == hashlib.sha256(binary).hexdigest() and m["bytes"] == len(binary)
    return path


def test_collect_keeps_the_binary_its_sum_and_every_log(tmp_path):
    binary = b"\x7fELF" + bytes(range(256)) * 64
    dest = prebuilt_dir(tmp_path / "pre", "f" * 16, binary, tmp_path)
    assert lzma.decompress((dest / "llama-server.xz").read_bytes()) == binary
    (dest / "llama-server").write_bytes(binary)
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=dest, capture_output=True).returncode == 0
    assert sorted(p.name for p in dest.iterdir()) == sorted({*offbuild.LOGS, "llama-server", "llama-server.xz",
                                                             "SHA256SUMS", "wheels.txt", "binary.json"})
    assert json.loads((dest / "binary.json").read_text()) == {
        "sha256": hashlib.sha256(binary).hexdigest(), "bytes": len(binary), "xz_bytes": (dest / "llama-server.xz").stat().st_size}
    assert (dest / "wheels.txt").read_text() == f"w.whl {hashlib.sha256(b'w').hexdigest()}\n"
    assert (dest / "facts.txt").read_text() == "@PACK@/gpu_proof.sh: line 36: nvidia-smi: command not found\n"
    (tmp_path / "res/facts.txt").unlink()
    with pytest.raises(SystemExit, match="no facts.txt"):
        offbuild.collect(tmp_path / "res", tmp_path / "llama-server", tmp_path / "pre2", {})


def test_pack51_with_a_prebuilt_binary_holds_it_and_no_sources(tmp_path, checkout):  # noqa: F811
    src, head, new = newer(checkout)
    plain = pin_proof.pack51(tmp_path / "plain", bare=src, checkout=src, commit=head, new_commit=new)
    fp = plain["fingerprint"]
    pre = prebuilt_dir(tmp_path / "pre", fp, b"\x7fELF server", tmp_path)
    m = pin_proof.pack51(tmp_path / "pack", bare=src, checkout=src, commit=head, new_commit=new, prebuilt=pre)
    dest = tmp_path / "pack"
    assert m["prebuilt"] == hashlib.sha256(b"\x7fELF server").hexdigest() and m["fingerprint"] == fp
    assert not (dest / "llama.cpp.git").exists() and not (dest / "vocab-blobs.txt").exists()
    assert (dest / "ggml-vocab-qwen35.gguf").read_bytes() == (src / "models/ggml-vocab-qwen35.gguf").read_bytes()
    assert (dest / "prebuilt/SHA256SUMS").read_text() == (pre / "SHA256SUMS").read_text()
    assert (dest / "plan.json").read_text() == (tmp_path / "plain/plan.json").read_text()
    assert set(m["files"]) == {f for f in plain["files"] if not f.startswith("llama.cpp.git/")} - {"vocab-blobs.txt"} | {
        "ggml-vocab-qwen35.gguf", "prebuilt/llama-server.xz.1", "prebuilt/SHA256SUMS"}
    # the xz in two halves, the second alone in DEST-part2 (a call of its own): together, the binary collect kept
    part2 = tmp_path / "pack-part2/llama-server.xz.2"
    assert m["part2"] == str(part2.parent) and m["part2_bytes"] == part2.stat().st_size
    halves = (dest / "prebuilt/llama-server.xz.1").read_bytes(), part2.read_bytes()
    assert abs(len(halves[0]) - len(halves[1])) <= 1 and lzma.decompress(b"".join(halves)) == b"\x7fELF server"
    # a binary of another release, or one without FORCE_MMQ, is refused before the pack is made
    other = prebuilt_dir(tmp_path / "other", "0" * 16, b"x", tmp_path)
    with pytest.raises(SystemExit, match=f"build.txt: not release {fp}"):
        pin_proof.pack51(tmp_path / "p2", bare=src, checkout=src, commit=head, new_commit=new, prebuilt=other)
    (pre / "variants.diff").write_text("")
    with pytest.raises(SystemExit, match="no FORCE_MMQ"):
        pin_proof.pack51(tmp_path / "p3", bare=src, checkout=src, commit=head, new_commit=new, prebuilt=pre)


def prebuilt_block(pack: Path, mmq: Path) -> str:
    """gpu_proof.sh's prebuilt branch (from its `if` to the `else` of the build) after the line before it, which
    reads the phase list, its /tmp/mmq under `mmq`."""
    lines = (REPO / "bench/gpu/gpu_proof.sh").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip() == 'if [ -e "$W/prebuilt/llama-server.xz.1" ]; then')
    end = next(i for i in range(start, len(lines)) if lines[i] == "  else")
    assert lines[start - 1].strip() == 'IFS=, read -ra PHS <<< "$PH"'
    body = "\n".join([lines[start - 1], *lines[start + 1:end]]).replace("/tmp/mmq", str(mmq))
    return (f'set -u\nW={pack}\nRES={pack}/res\nNVCC=/nonexistent/bin/nvcc\nPH="${{PH:-traffic51:mmq}}"\n'
            'log() { echo "$*" >> "$RES/progress.txt"; }\nmodel() { log "model written"; }\n'
            f'{body}\necho "BIN=$BIN BINS=$BINS"\n')


@pytest.mark.parametrize("case", ["ok", "tampered", "volta-phase", "no-cublas", "no-part2"])
def test_the_gpu_machine_runs_the_prebuilt_binary_only_when_its_sum_holds(tmp_path, case):
    """The branch joins the binary's two halves, checks SHA256SUMS and runs --version before the model or any
    phase; a binary that is not the one built, a phase on another build, one that does not start, or a second half
    the first call did not leave ends the run (DONE: failed) with a progress line that says why."""
    pack, mmq, parts = tmp_path / "pack", tmp_path / "mmq", tmp_path / "parts"
    (pack / "prebuilt").mkdir(parents=True)
    (pack / "res").mkdir()
    parts.mkdir()
    fail = 'echo "llama-server: error while loading shared libraries: libcublas.so.13" >&2; exit 127'
    ok = 'echo "version: 1 (6b0958f)"'
    script = f"#!/bin/sh\n{fail if case == 'no-cublas' else ok}\n".encode()
    xz = lzma.compress(script)
    (pack / "prebuilt/llama-server.xz.1").write_bytes(xz[:20])
    if case != "no-part2":
        (parts / "llama-server.xz.2").write_bytes(xz[20:])
    summed = b"another binary" if case == "tampered" else script
    (pack / "prebuilt/SHA256SUMS").write_text(f"{hashlib.sha256(summed).hexdigest()}  llama-server\n")
    env = {"PATH": "/usr/bin:/bin", "PARTS": str(parts),
           **({"PH": "traffic51:mmq,peak:volta"} if case == "volta-phase" else {})}
    r = subprocess.run(["bash", "-c", prebuilt_block(pack, mmq)], capture_output=True, text=True, env=env)
    progress = (pack / "res/progress.txt").read_text()
    if case == "ok":
        assert r.returncode == 0 and r.stdout.strip() == f"BIN={mmq}/bin BINS=mmq={mmq}/bin", r.stderr
        build = (pack / "res/build.txt").read_text()
        assert "llama-server: OK" in build and "version: 1 (6b0958f)" in build and build.endswith("prebuilt rc=0\n")
        assert progress.splitlines() == [f"prebuilt ok: prebuilt {hashlib.sha256(script).hexdigest()}  llama-server",
                                          "model written"]
        return
    assert r.returncode == 1 and (pack / "res/DONE").read_text() == "failed\n" and "model written" not in progress
    assert progress.strip() == {"tampered": "prebuilt: llama-server: FAILED",
                                "volta-phase": "prebuilt: phase peak:volta needs a build the pack does not hold",
                                "no-cublas": "prebuilt: llama-server: error while loading shared libraries: libcublas.so.13",
                                "no-part2": f"prebuilt: no {parts}/llama-server.xz.2 (the first call carries it there: "
                                            "bench/traffic/README.md)"}[case]


def test_the_readme_quotes_the_build_here_from_its_records():
    """bench/records/offbuild51 (this machine's BUILD_ONLY run) against session 15's build on the GPU machine: the same
    Volta rule and nvcc; the README's figures recomputed from both."""
    import re

    from tests.unit.records51 import assert_quoted

    rec, s15 = REPO / "bench/records/offbuild51", REPO / "bench/records/proof51/session15/call1"

    def seconds(path: Path, rc: str) -> int:
        (s,) = re.findall(rf"{rc} rc=0 seconds=(\d+)", path.read_text())
        return int(s)

    here = [seconds(rec / "build.txt", "build"), seconds(rec / "build-volta.txt", "volta"),
            seconds(rec / "build-mmq.txt", "mmq")]
    there = [seconds(s15 / "build.txt", "build"), seconds(s15 / "build-volta.txt", "volta"),
             seconds(s15 / "build-mmq.txt", "mmq")]
    assert (rec / "voltarule.diff").read_bytes() == (s15 / "voltarule.diff").read_bytes()
    assert "#define GGML_CUDA_FORCE_MMQ" in (rec / "variants.diff").read_text()
    nvcc = [re.search(r"release 13\.0, V[\d.]+", (d / "facts.txt").read_text()).group() for d in (rec, s15)]
    assert nvcc[0] == nvcc[1] == "release 13.0, V13.0.88"
    assert "as release 091a8d04c429c504 " in (rec / "build.txt").read_text()
    assert "built with GNU 12.2.0" in (rec / "build.txt").read_text()
    sums = dict(line.split() for line in (rec / "wheels.txt").read_text().splitlines())
    assert sorted(sums.values()) == sorted(w[2] for w in (*offbuild.WHEELS, offbuild.CMAKE))
    b = json.loads((rec / "binary.json").read_text())
    assert (rec / "SHA256SUMS").read_text() == f"{b['sha256']}  llama-server\n"
    stamps = re.findall(r"\[(\d\d):(\d\d):(\d\d)\] (build \S+ \(background\)|model written|mmq rc|varying file)",
                        (s15 / "progress.txt").read_text())
    t = {k.split()[0] + (" " + k.split()[1] if k.startswith("model") else ""): int(h) * 3600 + int(m) * 60 + int(x)
         for h, m, x, k in stamps}
    models = (t["model written"] - t["build"], t["varying"] - t["mmq"])
    assert not any("/work" in (rec / f).read_text() for f in offbuild.LOGS)  # no path of this machine's
    assert_quoted("bench/traffic/README.md", (
        f"Of session 15's 459 s before the phase, the build took {there[0]} s and Volta's choice and FORCE_MMQ "
        f"{there[1]} + {there[2]} s",
        f"Here, on 2 cores, the build took {here[0]:,} s and the variants {here[1]} + {here[2]} s",
        f"binary is {b['bytes']:,} bytes, {b['xz_bytes']:,} as xz",
        f"two halves of {b['xz_bytes'] // 2:,} bytes",
        f"the two model files took {models[0]} and {models[1]} s in session 15",
        "sessions 10, 11, 14 and 15 lost 931, 553, 271 and 466 s to asks that got no machine",
    ))
    # those losses as RESULTS has them from the device tool's status
    assert_quoted("bench/RESULTS.md", ("with 869 s of the session's 1,800 left", "553 s of the session's 1,800 went",
                                       "(271 s of the session's 1,800 gone)", "(466 s of the session's 1,800 gone)"))
