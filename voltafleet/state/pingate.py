"""The pin gate (issue 50): what must hold before a fleet moves llama.cpp to another ref, one step each,
and the verdict. Pure: the driver (rollout/pingate.py) runs the steps and hands their results here.

Steps, in order:
- resolve: the ref and the fleet's current pin, each resolved once to a commit (kept in the record);
- sm70-compile: the ref compiled for sm_70 with the fleet's toolkit (CUDA 12.x: CUDA 13 cannot build
  sm_70), linked, with its MMQ, MMVQ and flash-attention kernels listed (cuobjdump): evidence made where a
  CUDA 12.x nvcc exists (bench/gpu/pin_sm70.py), or on any machine by bench/pin/sm70_compile.py (clang in
  CUDA mode with CUDA 12.8's headers and ptxas: NVIDIA's 12.x wheels ship no nvcc; sm70_evidence reads
  that record, and the step says which compiler made the kernels), checked here;
- flags: every group's rendered llama-server argv against the new binary's own --help (a renamed or removed
  flag refused with its fix; every managed flag still known);
- h200-proof: the GPU proof at the shipped argv, old pin against new, both in one run (median of 3): the
  VRAM plan never under, throughput and single stream, the golden probe and the 64+ token guard;
- lab-rollout: the lab fleet rolled from the old pin to the new and back under pooled keep-alive load,
  0 failed requests, every host on the new release and then on its old one (not rebuilt).
Then the canary on the fleet, as for any rollout (not the gate's).

A step passes only on its own evidence. The verdict is `pass` only when every step passed; a step not run
(no CUDA 12.x compiler here, no GPU lent) makes it `incomplete`, never a pass; a failed step, `fail`.

    >>> verdict([Step("resolve", PASS), Step("flags", NOT_RUN, "no binary")])
    'fail'
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

PASS, FAIL, NOT_RUN = "pass", "fail", "not-run"
STEPS = ("resolve", "sm70-compile", "flags", "h200-proof", "lab-rollout")
# the kernels the sm_70 evidence must list, by the source they come from (cuobjdump -elf's section names)
KERNEL_FAMILIES = {"mmq": re.compile(r"mul_mat_q"), "mmvq": re.compile(r"mul_mat_vec_q"),
                   "fattn": re.compile(r"flash_attn")}


@dataclass(frozen=True)
class Step:
    name: str
    status: str           # PASS, FAIL or NOT_RUN
    detail: str = ""      # one line: why, or what was seen
    figures: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def verdict(steps: list[Step]) -> str:
    """`pass` only when every step of STEPS is there and passed; `fail` when one failed or is missing;
    else `incomplete` (a step not run)."""
    by = {s.name: s for s in steps}
    if any(s.status == FAIL for s in steps) or any(name not in by for name in STEPS):
        return FAIL
    if any(by[name].status != PASS for name in STEPS):
        return "incomplete"
    return PASS


def resolve_step(ref: str, commit: str | None, old_ref: str, old_commit: str | None, error: str = "") -> Step:
    if error or not commit or not old_commit:
        return Step("resolve", FAIL, error or "a ref did not resolve")
    if commit == old_commit:
        return Step("resolve", FAIL, f"{ref} is the fleet's pin already ({commit[:12]}): nothing to gate")
    return Step("resolve", PASS, f"{ref} = {commit[:12]}, the pin {old_ref} = {old_commit[:12]}",
                {"ref": ref, "commit": commit, "old_ref": old_ref, "old_commit": old_commit})


def flags_step(problems: dict[str, list[str]], help_source: str | None) -> Step:
    """problems: {group: [a refused flag, its fix]} from checking each group's argv against the new
    binary's --help (voltafleet.planning.flags.check_against_help); help_source: where that --help came
    from (None: no new binary to ask)."""
    if help_source is None:
        return Step("flags", NOT_RUN, "no binary of the ref to ask for its --help (the lab step builds one)")
    bad = {g: p for g, p in problems.items() if p}
    if bad:
        return Step("flags", FAIL, "; ".join(f"{g}: {', '.join(p)}" for g, p in sorted(bad.items())),
                    {"groups": sorted(problems), "source": help_source})
    return Step("flags", PASS, f"every flag of {len(problems)} groups' argv is current in {help_source}",
                {"groups": sorted(problems), "source": help_source})


def sm70_evidence(record: dict, kernel_names: list[str]) -> dict:
    """bench/pin/sm70_compile.py's record (its `toolchain`, `source`, `build_rc`, `elf_archs`) in the form
    sm70_step reads (bench/gpu/pin_sm70.py's): the commit the lab mirror holds the source as, CUDA's version
    from the ptxas that assembled the sm_70 code, linked only with every library resolved and sm_70 cubins
    alone, and the kernels from its kept list (`kernel_names`, read by the caller), not its own counts."""
    tc, src = record.get("toolchain") or {}, record.get("source") or {}
    return {"commit": src.get("commit") or src.get("lab_commit"), "nvcc_version": tc.get("ptxas_version"),
            "rc": record.get("build_rc"),
            "linked": bool(record.get("linked")) and not record.get("unresolved") and record.get("elf_archs") == ["sm_70"],
            "seconds": (record.get("seconds") or {}).get("total"), "kernels_sm70": list(kernel_names),
            "compiler": tc.get("cuda_compiler")}


def sm70_step(record: dict | None, commit: str, where: str) -> Step:
    """The sm_70 compile's evidence (bench/gpu/pin_sm70.py's record at `where`, or sm70_evidence's reading of
    bench/pin/sm70_compile.py's) for this commit."""
    if record is None:
        return Step("sm70-compile", NOT_RUN, f"no evidence at {where}: run `python3 -m bench.gpu.pin_sm70 REPO REF "
                    "OUT_DIR` where CUDA 12.x's nvcc is (a fleet host's toolkit; CUDA 13 cannot build sm_70)")
    problems = []
    if record.get("commit") != commit:
        problems.append(f"its commit {str(record.get('commit'))[:12]} is not {commit[:12]}")
    toolkit = str(record.get("nvcc_version", ""))
    if not re.match(r"12\.\d", toolkit):
        problems.append(f"{'ptxas' if record.get('compiler') else 'nvcc'} {toolkit or '?'} is not CUDA 12.x")
    if record.get("rc") != 0 or not record.get("linked"):
        problems.append("the build or its link failed")
    kernels = record.get("kernels_sm70", [])
    counts = {fam: sum(bool(rx.search(k)) for k in kernels) for fam, rx in KERNEL_FAMILIES.items()}
    problems += [f"no sm_70 {fam} kernel listed" for fam, n in counts.items() if n == 0]
    if problems:
        return Step("sm70-compile", FAIL, "; ".join(problems), {"kernels": counts})
    made = (f"{record['compiler']} with CUDA {toolkit}'s ptxas (no nvcc: nvcc's own front end unproven)"
            if record.get("compiler") else f"nvcc {toolkit}")
    return Step("sm70-compile", PASS, f"{made}: sm_70 kernels mmq {counts['mmq']}, mmvq {counts['mmvq']}, "
                f"fattn {counts['fattn']} ({where})", {"kernels": counts, "seconds": record.get("seconds"),
                                                       "compiler": record.get("compiler") or "nvcc"})


def proof_step(record: dict | None, commit: str, old_commit: str, where: str) -> Step:
    """The H200 proof's verdicts for the two pins, side by side in one run (its record at `where`)."""
    if record is None:
        return Step("h200-proof", NOT_RUN, f"no record at {where}: the GPU proof with both pins (Volta's kernel "
                    "choice) has not run; it needs a GPU")
    sides = record.get("sides", {})
    if set(sides) != {commit, old_commit}:
        return Step("h200-proof", FAIL, f"its sides {sorted(s[:12] for s in sides)} are not the two pins")
    new, old = sides[commit], sides[old_commit]
    problems = [f"{k} failed" for k in ("vram_plan_never_under", "golden_probe", "guard_64") if not new.get(k)]
    problems += [f"the {side} side did not run the shipped build (volta_choice)" for side, x in (("new", new), ("old", old))
                 if not x.get("volta_choice")]
    for k in ("tok_s_16", "tok_s_1"):
        if not (isinstance(new.get(k), (int, float)) and isinstance(old.get(k), (int, float))):
            problems.append(f"no {k} for both sides")
    if problems:
        return Step("h200-proof", FAIL, "; ".join(problems))
    ratio = {k: round(new[k] / old[k], 4) for k in ("tok_s_16", "tok_s_1")}
    worse = [k for k, r in ratio.items() if r < 1 - record.get("noise", 0.02)]
    status = FAIL if worse else PASS
    device = str(record.get("device") or "an unnamed GPU").split(",")[0]
    return Step("h200-proof", status, f"{device}: new/old tok/s at 16 clients {ratio['tok_s_16']}, single "
                f"{ratio['tok_s_1']}, VRAM plan never under, probes equal ({where})"
                + (f": worse beyond noise on {', '.join(worse)}" if worse else ""),
                {"ratio": ratio, "device": record.get("device"), "noise": record.get("noise")})


def lab_step(load: dict, moved: dict[str, str], back: dict[str, str], new_release: dict[str, str],
             old_release: dict[str, str], rebuilt_back: list[str], runs_ok: tuple[bool, bool]) -> Step:
    """load: the pooled keep-alive load's summary ({"requests": n, "failed": n, ...}) over both rollouts;
    moved/back: {host: its release after each rollout}; new_release/old_release: {host: the release each
    should have}; rebuilt_back: hosts that compiled on the way back (the old release must be kept)."""
    problems = []
    if not all(runs_ok):
        problems.append(f"a rollout failed (to the ref: {'ok' if runs_ok[0] else 'failed'}, "
                        f"back: {'ok' if runs_ok[1] else 'failed'})")
    if load.get("failed", 1) != 0 or load.get("requests", 0) <= 0:
        problems.append(f"{load.get('failed')} of {load.get('requests')} requests failed under the rollouts")
    wrong = sorted(h for h in new_release if moved.get(h) != new_release[h])
    if wrong:
        problems.append(f"not on the ref's release after the move: {', '.join(wrong)}")
    wrong = sorted(h for h in old_release if back.get(h) != old_release[h])
    if wrong:
        problems.append(f"not back on the old release: {', '.join(wrong)}")
    if rebuilt_back:
        problems.append(f"compiled again on the way back (the old release was not kept): {', '.join(rebuilt_back)}")
    figures = {"requests": load.get("requests"), "failed": load.get("failed"), "hosts": sorted(new_release)}
    if problems:
        return Step("lab-rollout", FAIL, "; ".join(problems), figures)
    return Step("lab-rollout", PASS, f"{len(new_release)} hosts to the ref and back, {load['requests']} requests "
                "under pooled keep-alive load, 0 failed", figures)
