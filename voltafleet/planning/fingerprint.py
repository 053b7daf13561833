"""Build fingerprints: one release directory per distinct build.

A fingerprint covers everything that changes a release: the resolved llama.cpp
commit, the CMake flags, the CUDA toolkit, the C++ compiler and the targets it holds.

    >>> fingerprint("0c1e57098bba43ac29e6e3b677cdceebdd22334f", ["-DGGML_CUDA=ON"], "12.9.86", "12.2.0 x86_64-linux-gnu")
    '...'
"""
from __future__ import annotations

import hashlib
import json

ARCH_FLAG = "-DCMAKE_CUDA_ARCHITECTURES="


def cmake_flags(backend: str, cuda_archs: list[int], extra: list[str],
                kv_types: tuple[str, str] = ("q8_0", "q8_0"), nvcc: str | None = None) -> list[str]:
    """The CMake configure flags for a release. CUDA hosts get their archs; the lab the CPU.

    The FlashAttention K/V combinations compiled are the served one plus f16-f16, under
    the name the pinned llama.cpp uses (GGML_CUDA_FA_QUANTS; GGML_CUDA_FA_ALL_QUANTS is
    the old all-or-nothing switch and makes the CUDA build several times longer).
    """
    flags = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF",        # one self-contained binary per target: a release ships whole
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",    # the build must not download the web UI
        "-DLLAMA_OPENSSL=OFF",            # models come through the deploy, not -hf
        "-DGGML_NATIVE=OFF",              # a shared release runs on every host of the group
    ]
    if backend == "cuda":
        if not cuda_archs:
            raise ValueError("a CUDA build needs at least one architecture")
        archs = ";".join(str(a) for a in sorted(set(cuda_archs)))
        flags += [
            "-DGGML_CUDA=ON",
            ARCH_FLAG + archs,
            "-DGGML_CUDA_FA_QUANTS=" + ";".join(sorted({f"{kv_types[0]}-{kv_types[1]}", "f16-f16"})),
        ]
        if nvcc:  # the pinned toolkit, not whatever `nvcc` is first on PATH
            flags.append("-DCMAKE_CUDA_COMPILER=" + nvcc)
    return flags + list(extra)


def fingerprint(commit: str, flags: list[str], toolkit: str | None, compiler: str,
                targets: list[str] = ("llama-server",)) -> str:
    """A short, stable id of a build. Flag and target order do not matter; values do."""
    blob = json.dumps({"commit": commit, "flags": sorted(flags), "toolkit": toolkit or "none",
                       "compiler": compiler, "targets": sorted(targets)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def releases_to_prune(releases: list[tuple[str, float]], keep: int, protect: set[str]) -> list[str]:
    """Oldest releases beyond `keep` (by mtime), never one in `protect` (current, last good)."""
    ordered = sorted(releases, key=lambda r: r[1], reverse=True)
    kept = 0
    prune = []
    for name, _ in ordered:
        if name in protect or kept < keep:
            kept += name not in protect
            continue
        prune.append(name)
    return prune
