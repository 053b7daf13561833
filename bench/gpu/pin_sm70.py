"""The pin gate's sm_70 evidence (issue 50): llama.cpp at a ref compiled for sm_70 with a CUDA 12.x nvcc (the
fleet's toolkit: CUDA 13 cannot build sm_70), with voltafleet's own CMake flags for a V100 release, linked, and
the sm_70 kernels of MMQ, MMVQ and flash attention listed from the binary (cuobjdump). Run it where such an
nvcc exists (a fleet host after the toolchain role; this workplace has only CUDA 13): the gate
(rollout/pingate.py) reads its record.

    python3 -m bench.gpu.pin_sm70 REPO REF OUT_DIR [--nvcc /usr/local/cuda-12.8/bin/nvcc] [--jobs N]

OUT_DIR/sm70.json: {commit, nvcc_version, rc, linked, seconds, kernels_sm70, cmake_flags, why}; the build log
beside it. An nvcc that is not 12.x is refused before any compile (rc 2, `why` says so)."""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from voltafleet.planning.fingerprint import cmake_flags
from voltafleet.state.pingate import KERNEL_FAMILIES

# the kernel sections of the families the gate asks for (its KERNEL_FAMILIES), by name
KERNELS = re.compile(r"\.text\.(\S*(?:%s)\S*)" % "|".join(rx.pattern for rx in KERNEL_FAMILIES.values()))


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release [\d.]+, V([\d.]+)", out)
    return m.group(1) if m else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("repo")
    ap.add_argument("ref")
    ap.add_argument("out")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--jobs", default=str(os.cpu_count() or 2))
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    record: dict = {"repo": a.repo, "ref": a.ref, "commit": None, "nvcc": a.nvcc, "rc": 2, "linked": False,
                    "kernels_sm70": [], "argv": ["-m bench.gpu.pin_sm70", *(argv or sys.argv[1:])]}

    def done(rc: int, why: str = "") -> int:
        record.update(rc=rc, why=why)
        (out / "sm70.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"pin_sm70: rc {rc}{': ' + why if why else ''}; {out / 'sm70.json'}", file=sys.stderr)
        return rc

    version = nvcc_version(a.nvcc) if os.path.exists(a.nvcc) else ""
    record["nvcc_version"] = version
    if not version.startswith("12."):
        return done(2, f"nvcc {version or 'not found'} at {a.nvcc}: sm_70 needs CUDA 12.x (CUDA 13 dropped Volta)")
    src, build = out / "llama.cpp", out / "build"
    subprocess.run(["git", "init", "-q", str(src)], check=True)
    fetch = subprocess.run(["git", "-C", str(src), "fetch", "-q", "--depth", "1", "--", a.repo, a.ref])
    if fetch.returncode != 0:
        return done(2, f"cannot fetch {a.ref} from {a.repo}")
    subprocess.run(["git", "-C", str(src), "checkout", "-q", "--force", "--detach", "FETCH_HEAD"], check=True)
    record["commit"] = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                                      text=True).stdout.strip()
    flags = cmake_flags("cuda", [70], [], nvcc=a.nvcc)
    record["cmake_flags"] = flags
    t0 = time.monotonic()
    with (out / "build.log").open("w") as log:
        rc = subprocess.run(["cmake", "-S", str(src), "-B", str(build), *flags], stdout=log, stderr=subprocess.STDOUT).returncode
        if rc == 0:
            rc = subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", "-j", a.jobs],
                                stdout=log, stderr=subprocess.STDOUT).returncode
    record["seconds"] = round(time.monotonic() - t0, 1)
    binary = build / "bin/llama-server"
    record["linked"] = rc == 0 and binary.exists()
    if not record["linked"]:
        return done(rc or 1, "the build failed: see build.log")
    cuobjdump = str(Path(a.nvcc).with_name("cuobjdump"))
    elfs = subprocess.run([cuobjdump, "--list-elf", str(binary)], capture_output=True, text=True).stdout
    record["elf_files"] = [line.split(":", 1)[-1].strip() for line in elfs.splitlines() if "sm_70" in line]
    dump = subprocess.run([cuobjdump, "-elf", "-arch", "sm_70", str(binary)], capture_output=True, text=True).stdout
    record["kernels_sm70"] = sorted(set(KERNELS.findall(dump)))
    return done(0)


if __name__ == "__main__":
    sys.exit(main())
