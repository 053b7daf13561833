"""Issue 51's FORCE_MMQ llama-server built off the GPU machine, so that a device session spends its time on the
traffic runs: the build took 348 s of an H100's 16 cores and the two variants 75 + 15 s more (session 15), a
third of what the last config needs.

    .venv/bin/python -m bench.gpu.pin_proof pack51 PACK         # the sources and plan.json
    .venv/bin/python -m bench.gpu.offbuild PACK DEST            # as root; 2 cores: about 27 min
    .venv/bin/python -m bench.gpu.pin_proof pack51 PACK --prebuilt DEST   # the pack with the binary, no sources

NVIDIA's wheels on PyPI (WHEELS: pinned versions and sha256; nvcc 13.0.88, the GPU machine's) are laid out as a
toolkit at the path plan.json's nvcc names (/usr/local/cuda-13.0), with a link-time stand-in for the driver's
libcuda.so.1 (the GPU machine has the real one); then PACK/gpu_proof.sh runs with BUILD_ONLY=1 and JOBS=nproc:
the same build script, argv, Volta rule and FORCE_MMQ that it runs on the GPU machine. DEST gets llama-server.xz,
SHA256SUMS (of llama-server; gpu_proof.sh checks it there before anything runs), binary.json and the run's logs
(build.txt, build-volta.txt, build-mmq.txt, voltarule.diff, variants.diff, facts.txt) with wheels.txt; on 2 cores
the build took 1,502 s and the variants 71 + 13 s (bench/records/offbuild51, bench/traffic/README.md).
What stays assumed against a build on the GPU machine: its host compiler (g++ 13.3 there, this machine's here)
compiles the host code, and cuBLAS's headers are 13.1.2's (the binary loads the GPU machine's cuBLAS 13 at run
time); the device code comes from the same nvcc, cicc and ptxas, so the kernels are the ones its build makes.
"""
from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from lab.fleet import sha256_file

# (project, version, sha256 of the manylinux x86-64 wheel): the GPU machine's nvcc 13.0.88 (CUDA 13.0 update 2)
WHEELS = (
    ("nvidia-cuda-nvcc", "13.0.88", "56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03"),
    ("nvidia-nvvm", "13.0.88", "c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0"),
    ("nvidia-cuda-crt", "13.0.88", "2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4"),
    ("nvidia-cuda-runtime", "13.0.96", "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548"),
    ("nvidia-cuda-cccl", "13.0.85", "e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649"),
    ("nvidia-cublas", "13.1.2.11", "e1ad7b57879088bc79e31cc172891a64332f76ae733084d4aaaaa65499b9b3de"),
)
# CMake from PyPI: the GPU machine builds with 4.4.3; PyPI's 4.4 line has 4.4.5
CMAKE = ("cmake", "4.4.5", "85625a9b6d5e88ff99c7eb79123d85570844e77ac076366cf75c609cc0b1b579")
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64")
MARK = ".voltafleet-offbuild"  # a toolkit this module laid out (never one it did not)
# the driver API llama.cpp's ggml-cuda calls at b11434 (its virtual-memory pool): the stand-in defines them so
# that llama-server links; each returns an error, so nothing here ever finds a GPU through it
DRIVER_SYMBOLS = ("cuDeviceGet", "cuDeviceGetAttribute", "cuGetErrorString", "cuMemAddressFree", "cuMemAddressReserve",
                  "cuMemCreate", "cuMemGetAllocationGranularity", "cuMemMap", "cuMemRelease", "cuMemSetAccess",
                  "cuMemUnmap", "cuInit", "cuDriverGetVersion", "cuGetProcAddress", "cuGetProcAddress_v2")
REPO = Path(__file__).resolve().parents[2]
LOGS = ("build.txt", "build-volta.txt", "build-mmq.txt", "voltarule.diff", "variants.diff", "facts.txt")


def checked(path: Path, sha256: str) -> Path:
    """`path` when its sha256 is the pinned one; SystemExit naming the file and both sums otherwise."""
    got = sha256_file(path)  # read in chunks: cuBLAS's wheel is 423 MB
    if got != sha256:
        raise SystemExit(f"{path}: sha256 {got}, pinned {sha256} (bench/gpu/offbuild.py WHEELS): remove it and fetch again")
    return path


def fetch(dest: Path, wheels=(*WHEELS, CMAKE)) -> list[Path]:
    """Each pinned wheel into dest (pip download, binary only, no dependencies), its sha256 checked."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    for name, version, sha in wheels:
        pattern = f"{name.replace('-', '_')}-{version}-*.whl"
        if not any(dest.glob(pattern)):
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "--python-version", "3.11", *plat, "-d", str(dest), f"{name}=={version}"], check=True)
        have = list(dest.glob(pattern))
        if len(have) != 1:
            raise SystemExit(f"{dest}: {len(have)} wheels of {name} {version}, want one")
        out.append(checked(have[0], sha))
    return out


def unzip(wheel: Path, under: str, dest: Path) -> None:
    """The wheel's files under `under` extracted into dest with the modes the wheel gives them (0o644 where none)."""
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if info.filename.startswith(under) and not info.is_dir():
                z.extract(info, dest)
                os.chmod(dest / info.filename, (info.external_attr >> 16) & 0o777 or 0o644)


def layout(wheels: list[Path], prefix: Path) -> None:
    """The toolkit wheels' nvidia/cu13 trees as CUDA's own layout under prefix: bin/ and nvvm/ (nvcc's profile
    finds cicc and libdevice there), targets/x86_64-linux/{include,lib} with include/ and lib64/ pointing at them,
    and each shared library's unversioned name for the linker. A prefix this module did not lay out is refused;
    one it laid out from the same wheels is left as it is (new files would be new to make: everything again)."""
    mark = json.dumps([w.name for w in wheels]) + "\n"
    if prefix.exists() and not (prefix / MARK).exists():
        raise SystemExit(f"{prefix}: a toolkit bench/gpu/offbuild.py did not lay out; leave it be and build on a "
                         "machine without one, or move it away")
    if (prefix / MARK).exists() and (prefix / MARK).read_text() == mark:
        return
    with tempfile.TemporaryDirectory() as tmp:
        for w in wheels:
            unzip(w, "nvidia/cu13/", Path(tmp))
        top = Path(tmp, "nvidia/cu13")
        for d in ("bin", "nvvm", "include", "lib"):
            if not (top / d).is_dir():
                raise SystemExit(f"{prefix}: the wheels ({', '.join(w.name for w in wheels)}) hold no nvidia/cu13/{d}")
        shutil.rmtree(prefix, ignore_errors=True)
        target = prefix / "targets/x86_64-linux"
        target.mkdir(parents=True)
        for d, to in (("bin", prefix), ("nvvm", prefix), ("include", target), ("lib", target)):
            shutil.move(str(top / d), str(to / d))
    (prefix / "include").symlink_to("targets/x86_64-linux/include")
    (prefix / "lib64").symlink_to("targets/x86_64-linux/lib")
    for so in (target / "lib").glob("*.so.*"):
        link = so.with_name(so.name.split(".so.")[0] + ".so")
        if not link.exists():
            link.symlink_to(so.name)
    (prefix / MARK).write_text(mark)


def stub(prefix: Path, symbols=DRIVER_SYMBOLS) -> Path:
    """lib/stubs/libcuda.so (soname libcuda.so.1, and that name beside it): the stand-in CMake's CUDA::cuda_driver
    links against. Returns the stubs folder (LD_LIBRARY_PATH for the build's own `llama-server --version`)."""
    stubs = prefix / "targets/x86_64-linux/lib/stubs"
    stubs.mkdir(parents=True, exist_ok=True)
    src = stubs / "libcuda-stub.c"
    text = ("/* link-time stand-in for the NVIDIA driver's libcuda.so.1: every call fails */\n"
            + "".join(f"int {s}(void) {{ return 999; }}\n" for s in symbols))
    if not (src.exists() and src.read_text() == text and (stubs / "libcuda.so").exists()):  # else as it was: no relink
        src.write_text(text)
        subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stubs / "libcuda.so"),
                        str(src)], check=True)
    one = stubs / "libcuda.so.1"
    if not one.exists():
        one.symlink_to("libcuda.so")
    return stubs


def cmake(wheel: Path, dest: Path) -> Path:
    """The CMake wheel's own binaries (cmake/data/bin), unpacked into dest: the folder for PATH."""
    unzip(wheel, "cmake/data/", dest)
    return dest / "cmake/data/bin"


def build(pack: Path, res: Path, prefix: Path, cmake_bin: Path, stubs: Path, jobs: int) -> None:
    """PACK/gpu_proof.sh with BUILD_ONLY=1 (the build and the Volta and FORCE_MMQ variants, nothing else),
    waiting for its end; SystemExit with its last progress line unless it ends ok."""
    shutil.rmtree(res, ignore_errors=True)
    res.mkdir(parents=True)
    env = {**os.environ, "PATH": f"{prefix / 'bin'}:{cmake_bin}:{os.environ['PATH']}", "LD_LIBRARY_PATH": str(stubs),
           "BUILD_ONLY": "1", "JOBS": str(jobs), "PHASES": "traffic51:mmq", "RES": str(res), "WAIT": "0"}
    env.pop("OUT", None)
    subprocess.run(["bash", str(pack / "gpu_proof.sh")], env=env, check=False)
    done = (res / "DONE").read_text().strip() if (res / "DONE").exists() else "no DONE"
    if done != "ok":
        last = (res / "progress.txt").read_text().strip().splitlines()[-1:] if (res / "progress.txt").exists() else []
        raise SystemExit(f"{res}: the build ended {done!r}: {last[0] if last else 'no progress line'}")


def collect(res: Path, binary: Path, dest: Path, wheels: dict[str, str], pack: Path | None = None) -> dict:
    """DEST: llama-server.xz, SHA256SUMS (sha256sum's form, of llama-server), the run's LOGS, wheels.txt (`wheels`:
    each wheel's file name and the sha256 fetch checked it against) and binary.json: {"sha256", "bytes", "xz_bytes"}, which it returns. The pack's path
    (`pack`) reads @PACK@ in the logs, as in plan.json's argv."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    data = binary.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    (dest / "llama-server.xz").write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    (dest / "SHA256SUMS").write_text(f"{sha}  llama-server\n")
    for f in LOGS:
        if not (res / f).exists():
            raise SystemExit(f"{res}: no {f}: the build's logs are incomplete")
        text = (res / f).read_text(errors="replace")
        (dest / f).write_text(text.replace(str(pack), "@PACK@") if pack else text)  # no path of this machine's
    (dest / "wheels.txt").write_text("".join(f"{name} {sha}\n" for name, sha in wheels.items()))
    m = {"sha256": sha, "bytes": len(data), "xz_bytes": (dest / "llama-server.xz").stat().st_size}
    (dest / "binary.json").write_text(json.dumps(m, indent=1) + "\n")
    return m


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    pack, dest = Path(argv[0]).resolve(), Path(argv[1]).resolve()
    if (pack / "gpu_proof.sh").read_bytes() != (REPO / "bench/gpu/gpu_proof.sh").read_bytes():
        raise SystemExit(f"{pack}/gpu_proof.sh is not this checkout's (BUILD_ONLY, JOBS): pack again with "
                         f"`python -m bench.gpu.pin_proof pack51 {argv[0]}`")
    plan = json.loads((pack / "plan.json").read_text())
    prefix = Path(plan["build"]["nvcc"]).parent.parent
    cache = REPO / ".voltafleet/offbuild"
    wheels = fetch(cache / "wheels")
    layout(wheels[:-1], prefix)
    stubs = stub(prefix)
    cm = cmake(wheels[-1], cache / "cmake")
    res = cache / "res"
    build(pack, res, prefix, cm, stubs, os.cpu_count() or 2)
    pins = {w.name: sha for w, (_, _, sha) in zip(wheels, (*WHEELS, CMAKE))}  # the sums fetch checked
    m = collect(res, Path("/tmp/mmq/bin/llama-server"), dest, pins, pack)
    print(f"{dest}: llama-server {m['bytes'] / 2**20:.1f} MiB ({m['xz_bytes'] / 2**20:.1f} MiB as xz), sha256 {m['sha256']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
