"""The pin gate's GPU proof (issue 50): the pin and a newer llama.cpp side by side in one run on a GPU machine,
each with Volta's exact kernel choice (bench/gpu/voltarule.py, which takes b11434's move of Volta to MMVQ's
Turing table) and GGML_CUDA_FORCE_MMQ as both V100 groups ship it; then the gate's record.

    .venv/bin/python -m bench.gpu.pin_proof pack [DEST]          # both sources, plan50's argv (< 64 MiB)
    # on the GPU machine: PHASES=<PHASES50> bash DEST/gpu_proof.sh   (RES=dir for the results)
    .venv/bin/python -m bench.gpu.pin_proof record RUN_DIR [OUT]  # the gate's h200.json from the run's results
    .venv/bin/python -m bench.gpu.pin_proof pack51 [DEST] [--prebuilt DIR]  # issue 51's traffic runs at b11434
                                                                 # (DIR: bench/gpu/offbuild.py's binary, no build)

The run (plan50, phases PHASES50) measures on each side, the old pin `mmq` and the new `mmqnew`:
  peaks    one long prompt per slot at once at both V100 groups' shipped argv: the GPU peak against the
           group's VRAM plan (voltafleet.planning.vram.decide at the V100's memory, Volta's arch)
  serve27  the shipped v100_32gb argv, 3 rounds at 1, 4 and 16 clients (512-token prompts, 128 tokens)
  probe27  the smoke client's short and long probes, greedy, 3 times, on the 27B shape and on a random-weight
           qwen35 quantized to Q8_0: the new side against the old side's tokens and log-probabilities
h200_record turns that into the gate's record (voltafleet.state.pingate.proof_step reads it): for each side's
commit the VRAM verdict, the medians of tok/s at 16 clients and single stream, the golden probe and the 64+
token guard, and volta_choice (every server of the side logged FORCE_MMQ); `noise` is the widest spread of the
repetitions around their median at 1 and 16 clients on either side (2 % at least). Errors in a round or a peak's
requests leave its figure out (None, never a pass).
"""
from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from bench.gpu import gpu_proof
from bench.gpu.groups import group_cfg

REPO = gpu_proof.REPO
OLD_REF, NEW_REF = "b11312", "b11434"
NEW_COMMIT = "6b0958fe153a3dcc31f6616835d6f2c3119d7d3f"   # the lab mirror's b11434 (lab/fleet.py ensure_git_mirror)
OLD, NEW = "mmq", "mmqnew"                                 # the two sides' build labels on the GPU machine
NEW_ROOT = "/tmp/vfnew"
PHASES50 = f"peak:{OLD},peak:{NEW},serve27:{OLD},serve27:{NEW},probe27:{OLD}+{NEW}"
GROUP_MIB = {"v100_32gb": 32768, "v100_16gb": 16384}      # the V100's memory the VRAM plan is made for
NOISE_FLOOR = 0.02


def plan50(new_commit: str = NEW_COMMIT) -> dict:
    """plan.json's entries for the run: build_new (the second pin, built by voltafleet's script under its own
    root), the peaks at both groups' shipped argv on each side, serve27's shipped v100_32gb argv on each side."""
    base = gpu_proof.plan27()
    peaks = [p for p in base["peaks"] if p["build"] == OLD and p["kind"] == "plain"]
    serve = [x for x in base["serve27"] if x["build"] == OLD]
    return {"build_new": {**gpu_proof.build_plan(targets=["llama-server"], commit=new_commit, root=NEW_ROOT),
                          "ref": NEW_REF, "old_ref": OLD_REF, "old_commit": gpu_proof.COMMIT},
            "peaks": peaks + [{**p, "build": NEW} for p in peaks],
            "serve27": serve + [{**x, "build": NEW} for x in serve]}


def mirror() -> Path:
    """The lab's llama.cpp mirror, which holds both pins (made from the two sdists if it is not there yet)."""
    from lab.fleet import CACHE, ensure_git_mirror

    info = ensure_git_mirror()
    if info["new_commit"] != NEW_COMMIT:
        raise SystemExit(f"the lab mirror's {NEW_REF} is {info['new_commit']}, not {NEW_COMMIT}")
    return CACHE / "mirror/git/llama.cpp.git"


def pack50(dest: Path, bare: Path | None = None, checkout: Path | None = None, commit: str = gpu_proof.COMMIT,
           new_commit: str = NEW_COMMIT, overlay: dict | None = None) -> dict:
    """gpu_proof.pack with plan50 (or `overlay`) over its plan, and the new pin's commit in the pack's
    llama.cpp.git (fetched from the lab mirror, or `bare`, two commits deep: the pin is its parent, so the
    objects are shared). `checkout`, `commit`, `new_commit`: as gpu_proof.pack's (a test's tiny repository)."""
    m = gpu_proof.pack(dest, checkout=checkout, commit=commit, overlay=plan50(new_commit) if overlay is None else overlay)
    git = Path(dest) / "llama.cpp.git"
    src = bare or mirror()
    subprocess.run(["git", "-C", str(git), "fetch", "-q", "--depth", "2", f"file://{src}",
                    f"refs/tags/{NEW_REF}:refs/tags/{NEW_REF}"], check=True)
    subprocess.run(["git", "-C", str(git), "repack", "-a", "-d", "-q"], check=True)
    got = subprocess.run(["git", "-C", str(git), "rev-parse", f"{NEW_REF}^{{commit}}"], capture_output=True,
                         text=True, check=True).stdout.strip()
    if got != new_commit:
        raise SystemExit(f"{git}: {NEW_REF} is {got}, not {new_commit}")
    return {**m, **gpu_proof.listed(dest)}


def plan51_new(new_commit: str = NEW_COMMIT) -> dict:
    """Issue 51's traffic runs on the shipped pin: the first build is b11434 (its FORCE_MMQ variant `mmq` with
    Volta's exact choice, voltarule taking b11434's MMVQ form), the host plans at its compute graph."""
    return {"build": gpu_proof.build_plan(commit=new_commit), **gpu_proof.plan51(ref=new_commit)}


def pack51(dest: Path, bare: Path | None = None, checkout: Path | None = None, commit: str = gpu_proof.COMMIT,
           new_commit: str = NEW_COMMIT, prebuilt: Path | None = None) -> dict:
    """pack50's pack (both commits in llama.cpp.git; gguf-py, vocabulary and template from the pin's sdist,
    which qwen35gen was proven with) with plan51_new over its plan: `PHASES=traffic51:mmq` builds b11434.
    `prebuilt`: bench/gpu/offbuild.py's folder for this plan's build. The pack then holds the vocabulary as a file,
    not the sources (llama.cpp.git stays out), and its llama-server.xz in two halves, since the whole (40 MiB) and
    the checkout are more than one device call carries: prebuilt/llama-server.xz.1 with SHA256SUMS in the pack, and
    llama-server.xz.2 alone in DEST-part2, which the session's first call carries to the GPU machine's
    /tmp/prebuilt51 (bench/traffic/README.md); gpu_proof.sh joins them, checks the sum and runs that binary."""
    m = pack50(dest, bare, checkout, commit, new_commit, overlay=plan51_new(new_commit))
    if prebuilt is None:
        return m
    dest, prebuilt = Path(dest), Path(prebuilt)
    fp = json.loads((dest / "plan.json").read_text())["build"]["fingerprint"]
    for f in ("llama-server.xz", "SHA256SUMS", "build.txt", "build-mmq.txt", "variants.diff"):
        if not (prebuilt / f).is_file():
            raise SystemExit(f"{prebuilt}: no {f}; build it with `python -m bench.gpu.offbuild {dest} {prebuilt}`")
    if f"as release {fp} " not in (prebuilt / "build.txt").read_text():
        raise SystemExit(f"{prebuilt}/build.txt: not release {fp}, this pack's build; build it again with "
                         f"`python -m bench.gpu.offbuild {dest} {prebuilt}`")
    if "FORCE_MMQ" not in (prebuilt / "variants.diff").read_text():
        raise SystemExit(f"{prebuilt}/variants.diff: no FORCE_MMQ: not the mmq variant the traffic runs take")
    git = dest / "llama.cpp.git"
    for line in (dest / "vocab-blobs.txt").read_text().splitlines():
        name, blob = line.split()
        (dest / name).write_bytes(subprocess.run(["git", "--git-dir", str(git), "cat-file", "blob", blob],
                                                 capture_output=True, check=True).stdout)
    (dest / "vocab-blobs.txt").unlink()
    shutil.rmtree(git)
    (dest / "prebuilt").mkdir()
    shutil.copy(prebuilt / "SHA256SUMS", dest / "prebuilt/SHA256SUMS")
    xz = (prebuilt / "llama-server.xz").read_bytes()
    part2 = dest.with_name(dest.name + "-part2")
    shutil.rmtree(part2, ignore_errors=True)
    part2.mkdir()
    (dest / "prebuilt/llama-server.xz.1").write_bytes(xz[:len(xz) // 2])
    (part2 / "llama-server.xz.2").write_bytes(xz[len(xz) // 2:])
    return {**m, **gpu_proof.listed(dest), "part2": str(part2), "part2_bytes": gpu_proof.listed(part2)["bytes"],
            "prebuilt": (dest / "prebuilt/SHA256SUMS").read_text().split()[0]}


# ---------------------------------------------------------------- the gate's record from the run's results

def vram_verdicts(peaks: list, build: str, ref: str = gpu_proof.COMMIT) -> dict:
    """Each shipped group's peak on `build` against its VRAM plan at llama.cpp `ref` (the side's commit; its
    compute graph, vram.graph_extra_bytes), Volta's arch, the V100's memory, the 27B's header:
    name -> planned, measured, never_under."""
    from voltafleet.planning import vram

    header = gpu_proof.qwen_header()
    out = {}
    for r in peaks:
        if r.get("build") != build:
            continue
        cfg = group_cfg(r["group"], ref).replace(voltafleet_backend="cuda", model_url="MODEL")
        planned = vram.decide(cfg, GROUP_MIB[r["group"]], header, archs=[70]).plan.needed / 2**20
        peak = r.get("mem_peak")
        errors = sum(1 for q in r.get("requests", []) if q.get("error"))
        out[r["name"]] = {"planned_mib": round(planned, 1), "measured_mib": peak, "healthy": r.get("healthy"),
                          "never_under": (bool(r.get("healthy")) and not errors and peak is not None
                                          and (r.get("mem_load") or 0) < peak <= planned),
                          "errors": errors}
    return out


def rates(serve: list, build: str) -> dict:
    """serve27's rounds on `build`: each client count's tok/s (tokens over the round's wall time) per
    repetition, their median, and the median TTFT."""
    from bench.gpu.proof.runner import wall_rate

    out = {}
    for r in serve:
        if r.get("build") != build:
            continue
        for x in r["rounds"]:
            k = out.setdefault(x["streams"], {"tok_s": [], "ttft_ms": [], "errors": 0})
            k["tok_s"].append(wall_rate(x["recs"]))
            k["ttft_ms"] += [q["ttft_ms"] for q in x["recs"] if q.get("ttft_ms") is not None]
            k["errors"] += sum(1 for q in x["recs"] if q.get("error") or not q.get("times_ms"))
    for k in out.values():
        good = [v for v in k["tok_s"] if v is not None]
        k["median"] = statistics.median(good) if len(good) == len(k["tok_s"]) and good and not k["errors"] else None
        k["spread"] = round(max(abs(v / k["median"] - 1) for v in good), 4) if k["median"] else None
        k["ttft_ms"] = statistics.median(k["ttft_ms"]) if k["ttft_ms"] else None
    return out


PROBE_MODELS = ("q4ks.gguf", "tiny-q8_0.gguf")  # the 27B shape (zero weights) and the random-weight tiny qwen35


def shipped_build(results: dict, build: str) -> bool:
    """Every server of `build` in the run's peaks and serve27 ran a FORCE_MMQ build (its load log's system_info
    line), as both V100 groups ship: a variant whose rebuild failed would be the stock build."""
    recs = [r for key in ("peaks", "serve27") for r in results.get(key, []) if r.get("build") == build]
    return bool(recs) and all(any("FORCE_MMQ = 1" in line for line in r.get("log", [])) for r in recs)


def probe_verdicts(probes: list, tolerance: float, min_tokens: int) -> dict:
    """The new side's probes against the old side's first run (the golden probe), model by model: every run's
    short and long probe matches it (voltafleet.models.probe.compare); the 64+ guard: every long probe on the
    new side evaluated at least `min_tokens` prompt tokens and no NaN. The old side matches itself too."""
    from voltafleet.models.probe import compare

    by = {(r["build"], r["model"]): r for r in probes}
    models = sorted({m for (_, m) in by})
    golden_ok, guard_ok, why = bool(models), bool(models), []
    missing = sorted(set(PROBE_MODELS) - set(models))
    if missing:  # the zero-weight 27B alone answers token 0 at every step: it proves the path, not the numbers
        golden_ok = guard_ok = False
        why.append(f"no probe of {', '.join(missing)}")
    for m in models:
        old, new = by.get((OLD, m)), by.get((NEW, m))
        if not (old and new and old.get("runs") and new.get("runs")):
            golden_ok = guard_ok = False
            why.append(f"{m}: a side has no probe runs")
            continue
        for w in ("short", "long"):
            gold = old["runs"][0][w]
            for side, r in ((OLD, old), (NEW, new)):
                for i, run in enumerate(r["runs"]):
                    bad = compare(gold, run[w], tolerance)
                    if bad:
                        golden_ok = False
                        why.append(f"{m} {w} {side} run {i}: {bad}")
        for i, run in enumerate(new["runs"]):
            n = run["long"].get("prompt_n")
            if n is None or n < min_tokens:
                guard_ok = False
                why.append(f"{m} long {NEW} run {i}: {n} prompt tokens, fewer than {min_tokens}")
    return {"golden_probe": golden_ok, "guard_64": guard_ok, "models": models, "why": why}


def h200_record(results: dict, device: str) -> dict:
    """The gate's record (pingate.proof_step): sides by commit, each with vram_plan_never_under, tok_s_16,
    tok_s_1 (medians of 3), golden_probe and guard_64 (the new side's; the old side's probes are the golden
    ones), and the figures behind them."""
    cfg = group_cfg("v100_32gb")
    probes = probe_verdicts(results.get("probe", []), cfg.smoke.probe_tolerance, cfg.smoke.probe_long_min_tokens)
    sides, spreads = {}, []
    for build, commit in ((OLD, gpu_proof.COMMIT), (NEW, NEW_COMMIT)):
        v = vram_verdicts(results.get("peaks", []), build, commit)
        r = rates(results.get("serve27", []), build)
        spreads += [r[n]["spread"] for n in (1, 16) if r.get(n, {}).get("spread") is not None]  # what the gate checks
        sides[commit] = {
            "build": build, "ref": OLD_REF if build == OLD else NEW_REF,
            "vram_plan_never_under": bool(v) and len(v) == len(GROUP_MIB) and all(x["never_under"] for x in v.values()),
            "tok_s_16": (r.get(16) or {}).get("median"), "tok_s_1": (r.get(1) or {}).get("median"),
            "golden_probe": probes["golden_probe"], "guard_64": probes["guard_64"],
            "volta_choice": shipped_build(results, build),
            "vram": v, "rates": {str(k): x for k, x in sorted(r.items())},
            "errors": sum(x["errors"] for x in r.values()) + sum(x["errors"] for x in v.values()),
        }
    errors = results.get("errors", [])
    return {"ref": NEW_REF, "old_ref": OLD_REF, "device": device, "phases": PHASES50,
            "noise": round(max([NOISE_FLOOR, *spreads]), 4), "sides": sides, "probe": probes,
            "run_errors": errors}


def device_of(run_dir: Path) -> str:
    """The GPU's name and driver from the run's facts.txt (nvidia-smi's CSV line)."""
    for line in (Path(run_dir) / "facts.txt").read_text().splitlines():
        if line.startswith("NVIDIA ") and "," in line:
            return line.strip()
    return "unknown"


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else ""
    if cmd == "pack":
        m = pack50(Path(argv[1]) if len(argv) > 1 else REPO / ".voltafleet" / "gp50")
        print(f"packed {m['dest']}: {m['bytes'] / 2**20:.1f} MiB, release {m['fingerprint']}")
        print(f"on the GPU machine: PHASES={PHASES50} bash {m['dest']}/gpu_proof.sh  (RES=dir for the results)")
        return 0
    if cmd == "pack51":
        rest, pre = argv[1:], None
        if "--prebuilt" in rest:
            i = rest.index("--prebuilt")
            pre, rest = Path(rest[i + 1]), rest[:i] + rest[i + 2:]
        m = pack51(Path(rest[0]) if rest else REPO / ".voltafleet" / "gpu51", prebuilt=pre)
        print(f"packed {m['dest']}: {m['bytes'] / 2**20:.1f} MiB, release {m['fingerprint']} ({NEW_REF})"
              + (f", prebuilt llama-server {m['prebuilt'][:16]}; its second half in {m['part2']}: "
                 f"{m['part2_bytes'] / 2**20:.1f} MiB" if pre else ""))
        print(f"on the GPU machine: PHASES=traffic51:mmq bash {m['dest']}/gpu_proof.sh  (RES=dir for the results)")
        return 0
    if cmd == "record":
        run_dir = Path(argv[1])
        rec = h200_record(json.loads((run_dir / "results.json").read_text()), device_of(run_dir))
        out = Path(argv[2]) if len(argv) > 2 else REPO / "bench/records/pin-gate" / NEW_REF / "h200.json"
        out.write_text(json.dumps(rec, indent=1) + "\n")
        print(json.dumps({c[:12]: {k: s[k] for k in ("ref", "vram_plan_never_under", "tok_s_16", "tok_s_1",
                                                       "golden_probe", "guard_64")} for c, s in rec["sides"].items()},
                         indent=1))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
