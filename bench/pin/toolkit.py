"""A private CUDA 12.8 toolkit for the sm_70 compile (issue 50), assembled from pinned packages under
`.voltafleet/pin50/` (git-ignored); nothing is installed on the machine itself.

Why not simply NVIDIA's nvcc 12.8 wheel: `nvidia-cuda-nvcc-cu12` 12.8.93 ships `ptxas`, the `crt/` headers,
libnvvm and libdevice, but no `nvcc` driver, no `cicc`, `cudafe++`, `fatbinary` or `nvlink` (nor do 12.8.61
and 12.9.86); CUDA 13's wheels have an nvcc, and CUDA 13 cannot build sm_70; Debian 12's main archive has no
CUDA toolkit. So the CUDA compiler here is Debian 12's clang 19 in CUDA mode (`clang++ -x cuda
--cuda-gpu-arch=sm_70`), fed CUDA 12.8's headers, libdevice and `ptxas` (the SASS for sm_70 is assembled by
CUDA 12.8's ptxas); the host code links against CUDA 12.8's libcudart and libcublas. What that leaves
unproven (nvcc's own front end and NVVM, the fatbin's container made by CUDA 13's `fatbinary`):
docs/pin.md.

The pieces, every version pinned (PIP_PINS, DEB_PINS), and the toolkit root they make (`cuda-12.8/`):

    bin/ptxas          CUDA 12.8's (nvidia-cuda-nvcc-cu12)
    bin/fatbinary      CUDA 13.0's (nvidia-cuda-nvcc, its only use), behind a shim: clang 19 speaks the
                       old `--image=profile=sm_70,file=F`, CUDA 13's fatbinary `--image3=kind=elf,sm=70,file=F`
    bin/nvcc           a locator, not a compiler: CMake 3.25 finds a clang-CUDA toolkit through `nvcc -v`
                       (its TOP and NVVMIR_LIBRARY_DIR lines) and reads its version from `nvcc --version`;
                       it answers those two from this root and CUDA 12.8's ptxas, and refuses anything else
    include/           the runtime's, cuBLAS's, CCCL's, cuRAND's and nvcc's (crt/) headers, merged (12.8.x)
    nvvm/libdevice     CUDA 12.8's
    lib64/             libcudart.so.12 (12.8.90), libcublas.so.12 and libcublasLt.so.12 (12.8.4.1)
    lib64/libcudadevrt.a  empty: CMake names it on every clang-CUDA link; llama.cpp uses no -rdc
    lib64/stubs/       libcuda.so: no wheel ships the driver's stub, so one is made here exporting every
                       function CUDA 12.8's cuda.h declares (soname libcuda.so.1, like NVIDIA's stub); the
                       compile already checked each call against that cuda.h, and the real driver is the host's
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PREFIX = REPO / ".voltafleet" / "pin50"

# NVIDIA's wheels, each exactly pinned. cuobjdump: no CUDA 12 wheel exists; 13.2.51 is the oldest, and it
# lists and reads sm_70 cubins (its --list-elf and --dump-resource-usage; CUDA 13 dropped sm_70 from
# compiling, not from reading).
PIP_PINS = {
    "nvidia-cuda-nvcc-cu12": "12.8.93",      # ptxas, crt/ headers, libnvvm, libdevice (no nvcc in it)
    "nvidia-cuda-runtime-cu12": "12.8.90",   # cuda_runtime.h, cuda.h, libcudart.so.12
    "nvidia-cublas-cu12": "12.8.4.1",        # cublas_v2.h, libcublas(Lt).so.12
    "nvidia-cuda-cccl-cu12": "12.8.90",      # cub/thrust/libcu++ headers (ggml-cuda includes cub)
    "nvidia-curand-cu12": "10.3.9.90",       # CUDA 12.8.1's cuRAND: its headers, which clang's CUDA wrapper includes
    "nvidia-cuda-nvcc": "13.0.88",           # fatbinary only (a container tool)
    "nvidia-cuda-cuobjdump": "13.2.51",      # the kernel list
}
# Debian 12's clang 19 (main archive), unpacked with dpkg-deb, not installed
DEB_PINS = {
    "clang-19": "1:19.1.7-3~deb12u1",
    "libclang-common-19-dev": "1:19.1.7-3~deb12u1",
    "libclang-cpp19": "1:19.1.7-3~deb12u1",
    "libllvm19": "1:19.1.7-3~deb12u1",
}
CLANG = "usr/lib/llvm-19/bin/clang++"

# nvcc-only options ggml-cuda's CMakeLists gives the CUDA compiler, and what clang gets instead:
# -use_fast_math is nvcc's --ftz=true --prec-div=false --prec-sqrt=false --fmad=true, device code only
NVCC_FLAG_MAP = {
    "-use_fast_math": ["-fgpu-flush-denormals-to-zero", "-fgpu-approx-transcendentals"],
    "-extended-lambda": [], "--extended-lambda": [],
}
NVCC_FLAG_DROP_PREFIX = ("-compress-mode=", "--compress-mode=")  # the fatbin's compression: no clang equivalent


def log(msg: str) -> None:
    print(f"[pin50] {msg}", file=sys.stderr, flush=True)


def map_nvcc_flags(argv: list[str]) -> list[str]:
    """The clang argv for an argv CMake built for nvcc-style flags (pure; the shell shim does the same).

    >>> map_nvcc_flags(["-O3", "-use_fast_math", "-extended-lambda", "-compress-mode=size", "-Xcompiler", "-Wno-pedantic -Wall", "-c"])
    ['-O3', '-fgpu-flush-denormals-to-zero', '-fgpu-approx-transcendentals', '-Wno-pedantic', '-Wall', '-c']
    """
    out: list[str] = []
    it = iter(argv)
    for a in it:
        if a in NVCC_FLAG_MAP:
            out += NVCC_FLAG_MAP[a]
        elif a.startswith(NVCC_FLAG_DROP_PREFIX):
            continue
        elif a == "-Xcompiler":
            out += next(it, "").split()
        else:
            out.append(a)
    return out


@dataclass(frozen=True)
class Toolkit:
    prefix: Path

    @property
    def venv(self) -> Path:
        return self.prefix / "venv"

    @property
    def root(self) -> Path:
        return self.prefix / "cuda-12.8"

    @property
    def clang_dir(self) -> Path:
        return self.prefix / "clang"

    @property
    def cuda_compiler(self) -> Path:
        return self.prefix / "bin" / "clang-cuda"

    @property
    def cuobjdump(self) -> Path:
        return self.site / "nvidia/cu13/bin/cuobjdump"

    @property
    def site(self) -> Path:
        found = sorted(self.venv.glob("lib/python3*/site-packages"))
        if not found:
            raise FileNotFoundError(f"no site-packages in {self.venv}")
        return found[0]

    def wheel_versions(self) -> dict[str, str]:
        """The installed wheels' versions, read from their dist-info (what the record keeps)."""
        got = {}
        for d in self.site.glob("*.dist-info"):
            name, _, version = d.name.removesuffix(".dist-info").rpartition("-")
            got[name.replace("_", "-").lower()] = version
        return {k: got.get(k, "") for k in PIP_PINS}

    def clang_version(self) -> str:
        out = subprocess.run([str(self.clang_dir / CLANG), "--version"], capture_output=True, text=True,
                             env=self.clang_env()).stdout
        m = re.search(r"clang version (\S+)", out)
        return m.group(1) if m else ""

    def ptxas_version(self) -> str:
        out = subprocess.run([str(self.root / "bin/ptxas"), "--version"], capture_output=True, text=True).stdout
        m = re.search(r"V(\d+\.\d+\.\d+)", out)
        return m.group(1) if m else ""

    def clang_env(self) -> dict:
        lib = str(self.clang_dir / "usr/lib/x86_64-linux-gnu")
        return {**os.environ, "LD_LIBRARY_PATH": lib + (":" + os.environ["LD_LIBRARY_PATH"]
                                                         if os.environ.get("LD_LIBRARY_PATH") else "")}

    def runtime_libs(self) -> list[Path]:
        """Where llama-server's CUDA libraries are found here (the wheels' and the libcuda stub)."""
        return [self.root / "lib64", self.root / "lib64/stubs"]


def _pip(tk: Toolkit) -> None:
    want = tk.wheel_versions() if tk.venv.exists() and list(tk.venv.glob("lib/python3*/site-packages")) else {}
    if want == PIP_PINS:
        return
    if not (tk.venv / "bin/python").exists():
        log(f"python -m venv {tk.venv.relative_to(REPO)}")
        subprocess.run([sys.executable, "-m", "venv", str(tk.venv)], check=True)
    pins = [f"{k}=={v}" for k, v in PIP_PINS.items()]
    log("pip install --no-deps " + " ".join(pins))
    subprocess.run([str(tk.venv / "bin/python"), "-m", "pip", "install", "-q", "--no-deps", *pins], check=True)
    got = tk.wheel_versions()
    if got != PIP_PINS:
        raise SystemExit(f"pin50: the wheels installed are {got}, not the pins {PIP_PINS}")


def _debs(tk: Toolkit) -> None:
    stamp = tk.clang_dir / ".pins"
    want = "".join(f"{k}={v}\n" for k, v in sorted(DEB_PINS.items()))
    if stamp.exists() and stamp.read_text() == want and (tk.clang_dir / CLANG).exists():
        return
    debs = tk.prefix / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tk.clang_dir, ignore_errors=True)
    tk.clang_dir.mkdir(parents=True)
    for name, version in sorted(DEB_PINS.items()):
        if not list(debs.glob(f"{name}_*.deb")):
            log(f"apt-get download {name}={version}")
            subprocess.run(["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", f"{name}={version}"], cwd=debs, check=True,
                           stdout=subprocess.DEVNULL)
        (deb,) = debs.glob(f"{name}_*.deb")
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tk.clang_dir)], check=True)
    stamp.write_text(want)


def _write(path: Path, text: str, mode: int = 0o755) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _link(dst: Path, src: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.is_symlink() or dst.exists():
        dst.unlink()
    dst.symlink_to(src)


def driver_functions(cuda_h_preprocessed: str) -> list[str]:
    """The driver API's function names in a preprocessed cuda.h (the names a libcuda stub exports: the
    `_v2`-style names cuda.h's macros select, as the compiled objects call them).

    >>> driver_functions("CUresult cuInit(unsigned int Flags);\\ntypedef CUresult (*PFN)(void);\\nCUresult cuMemAlloc_v2(CUdeviceptr *d, size_t n);")
    ['cuInit', 'cuMemAlloc_v2']
    """
    return sorted(set(re.findall(r"^\s*(?:extern\s+)?CUresult\s+(?:__attribute__\(\([^)]*\)\)\s*)?(cu\w+)\s*\(",
                                 cuda_h_preprocessed, re.M)))


def _libcuda_stub(tk: Toolkit) -> int:
    out = tk.root / "lib64/stubs/libcuda.so"
    pre = subprocess.run(["gcc", "-E", "-P", "-x", "c", "-I", str(tk.root / "include"), "-"],
                         input="#include <cuda.h>\n", capture_output=True, text=True, check=True).stdout
    names = driver_functions(pre)
    if len(names) < 300:  # cuda.h 12.8 declares ~500
        raise SystemExit(f"pin50: only {len(names)} driver functions found in cuda.h: the stub would be wrong")
    src = tk.prefix / "libcuda-stub.c"
    src.write_text("/* libcuda stub: CUDA 12.8 cuda.h's functions, for linking only */\n"
                   + "".join(f"int {n}(void) {{ return 999; }}\n" for n in names))
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", "-Wl,-soname,libcuda.so.1", "-o", str(out), str(src)],
                   check=True)
    _link(out.with_name("libcuda.so.1"), Path("libcuda.so"))
    return len(names)


def _root(tk: Toolkit) -> None:
    site = tk.site
    root = tk.root
    shutil.rmtree(root, ignore_errors=True)
    (root / "bin").mkdir(parents=True)
    # headers: copied (small), merged; a name two wheels ship must be the same file
    for part in ("cuda_runtime", "cublas", "cuda_cccl", "curand", "cuda_nvcc"):
        src = site / "nvidia" / part / "include"
        for f in src.rglob("*"):
            if f.is_file() and f.name != "__init__.py" and "__pycache__" not in f.parts:
                dst = root / "include" / f.relative_to(src)
                if dst.exists() and dst.read_bytes() != f.read_bytes():
                    raise SystemExit(f"pin50: {dst.relative_to(root)} differs between two wheels")
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, dst)
    _link(root / "bin/ptxas", site / "nvidia/cuda_nvcc/bin/ptxas")
    _link(root / "nvvm/libdevice", site / "nvidia/cuda_nvcc/nvvm/libdevice")
    for lib, part in (("libcudart.so.12", "cuda_runtime"), ("libcublas.so.12", "cublas"),
                      ("libcublasLt.so.12", "cublas")):
        _link(root / "lib64" / lib, site / "nvidia" / part / "lib" / lib)
        _link(root / "lib64" / lib.removesuffix(".12"), Path(lib))
    # CMake names -lcudadevrt on every clang-CUDA link; it serves device-side launches (-rdc), which
    # llama.cpp does not use, and no CUDA 12 wheel ships it: an empty archive (a symbol needed from it
    # would fail the link, not pass it)
    (root / "lib64/libcudadevrt.a").write_bytes(b"!<arch>\n")
    fatbinary = site / "nvidia/cu13/bin/fatbinary"
    _write(root / "bin/fatbinary", f"""#!/bin/bash
# CUDA 13.0's fatbinary for clang 19: its old --image=profile=sm_NN|compute_NN,file=F as --image3 (bench/pin/toolkit.py)
args=()
for a in "$@"; do
  case "$a" in
    --image=profile=sm_*)      s=${{a#--image=profile=sm_}}; args+=("--image3=kind=elf,sm=${{s%%,*}},file=${{a#*,file=}}");;
    --image=profile=compute_*) s=${{a#--image=profile=compute_}}; args+=("--image3=kind=ptx,sm=${{s%%,*}},file=${{a#*,file=}}");;
    *) args+=("$a");;
  esac
done
exec {fatbinary} "${{args[@]}}"
""")
    _write(root / "bin/nvcc", f"""#!/bin/bash
# A locator for CMake, not a compiler (bench/pin/toolkit.py): this toolkit has no nvcc. It answers CMake's
# `nvcc -v __cmake_determine_cuda` (where the toolkit is) and `nvcc --version` (CUDA 12.8's ptxas's own
# version line) and refuses everything else.
case " $* " in
  *__cmake_determine_cuda*) echo "#\\$ TOP={root}"; echo "#\\$ NVVMIR_LIBRARY_DIR={root}/nvvm/libdevice"; exit 1;;
  *" --version "*|*" -V "*) exec {root}/bin/ptxas --version;;
esac
echo "nvcc (voltafleet pin50 locator): not a compiler; the CUDA compiler is clang (bench/pin/toolkit.py)" >&2
exit 1
""")
    drop = " ".join(f"{p}*" for p in NVCC_FLAG_DROP_PREFIX)
    maps = "\n".join(f"    {k}) args+=({' '.join(v)});;" for k, v in NVCC_FLAG_MAP.items())
    _write(tk.cuda_compiler, f"""#!/bin/bash
# clang 19 as the CUDA compiler with the CUDA 12.8 root beside it (bench/pin/toolkit.py's map_nvcc_flags)
export LD_LIBRARY_PATH={tk.clang_dir}/usr/lib/x86_64-linux-gnu${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}
args=(--cuda-path={root} -Wno-unknown-cuda-version)
while [ $# -gt 0 ]; do
  case "$1" in
{maps}
    {drop.replace(' ', '|')}) ;;
    -Xcompiler) shift; read -r -a more <<< "$1"; args+=("${{more[@]}}");;
    *) args+=("$1");;
  esac
  shift
done
exec {tk.clang_dir / CLANG} "${{args[@]}}"
""")


# the root's layout: a new value makes ensure() assemble it again (never while a build may use it: an
# unchanged stamp leaves it alone, so two builds and a record-only run can share one root)
ASSEMBLY = 1


def stamp_text() -> str:
    return json.dumps({"assembly": ASSEMBLY, "pip": PIP_PINS, "deb": DEB_PINS}, sort_keys=True) + "\n"


def ensure(prefix: Path = PREFIX) -> Toolkit:
    """The toolkit under `prefix`, made or checked (idempotent; the downloads are kept)."""
    tk = Toolkit(prefix)
    prefix.mkdir(parents=True, exist_ok=True)
    stamp = tk.root / ".voltafleet-pins"
    if not (stamp.exists() and stamp.read_text() == stamp_text() and tk.wheel_versions() == PIP_PINS):
        _pip(tk)
        _debs(tk)
        _root(tk)
        n = _libcuda_stub(tk)
        stamp.write_text(stamp_text())
        log(f"toolkit made: clang {tk.clang_version()}, ptxas {tk.ptxas_version()}, libcuda stub of {n} functions")
    st = tk.cuda_compiler.stat()
    assert st.st_mode & stat.S_IXUSR
    return tk


if __name__ == "__main__":
    ensure()
