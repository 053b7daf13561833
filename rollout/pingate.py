"""The pin gate, one command for any bump of llama.cpp (issue 50; the steps and the verdict:
voltafleet/state/pingate.py):

    .venv/bin/python -m rollout.pingate b11434                     # the lab fleet (inventory/lab.py)
    .venv/bin/python -m rollout.pingate b11434 --evidence DIR       # where sm70.json and h200.json are looked for

It resolves the ref and the fleet's pin once; rolls the lab fleet to the ref and back to the pin with the
rolling driver (`python -m rollout`, each run under the fleet's lock) while pooled keep-alive clients load the
gateway; asks the new binary for its --help on the canary and checks every group's argv against it; reads the
sm_70 compile's and the H200 proof's evidence (made where a CUDA 12.x nvcc and a GPU exist). The record goes to
reports/pin-check-<id>/gate.json (and --out); exit 0 when the verdict is `pass`, 3 when `incomplete` (a step
not run), 1 when `fail`.
Loopback only (the lab gateway); bounded (the load stops with the second rollout).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

from voltafleet.state import pingate, refs, runctx

REPO = Path(__file__).resolve().parents[1]
GROUPS = ("v100_16gb", "v100_32gb", "latency", "lab")
EXIT = {pingate.PASS: 0, pingate.FAIL: 1, "incomplete": 3}  # the command's exit code by verdict


def say(msg: str) -> None:
    print(f"[pin-check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def group_argv(group: str) -> list[str]:
    """The llama-server argv a host of the group gets (the inventory loader's merge: all.yml, the group's file
    and its tuned values), every optional flag on (a key file, a draft model) so that each flag voltafleet can
    render is checked."""
    from voltafleet.inputs.groupvars import host_vars
    from voltafleet.inputs.settings import Settings
    from voltafleet.planning import flags

    cfg = Settings.of(host_vars([group], {}, "the pin gate").values)
    cfg = cfg.replace(server_ctx=cfg.server.ctx or 8192, server_parallel=cfg.server.parallel or 4,
                      voltafleet_backend="cuda")
    return flags.server_args(cfg, "MODEL", port=8080, api_key_file="/etc/KEY", draft_path="DRAFT")


def check_flags(help_text: str) -> dict[str, list[str]]:
    from voltafleet.planning import flags

    return {g: flags.check_against_help(group_argv(g), help_text) for g in GROUPS}


def evidence(folder: Path, name: str) -> dict | None:
    path = folder / name if folder.is_absolute() else REPO / folder / name
    return json.loads(path.read_text()) if path.exists() else None


COMPILE_RECORDS = Path("bench/records/pin50")  # bench/pin/sm70_compile.py's records: REF.json, REF-kernels.tsv


def sm70_evidence(folder: Path, ref: str) -> tuple[dict | None, str]:
    """The sm_70 compile's evidence and where it is: the folder's sm70.json (bench/gpu/pin_sm70.py, an nvcc
    12.x), else bench/pin/sm70_compile.py's record of the ref with its kernel list (checked against the sha256
    the record keeps); (None, where sm70.json was looked for) when neither is there."""
    found = evidence(folder, "sm70.json")
    if found is not None:
        return found, str(folder / "sm70.json")
    rec = evidence(COMPILE_RECORDS, f"{ref}.json")
    if rec is None or rec.get("step") != "sm70-compile":
        return None, str(folder / "sm70.json")
    tsv = REPO / rec.get("kernel_list", "")
    text = tsv.read_bytes() if tsv.is_file() else b""
    names = ([line.split("\t")[-1] for line in text.decode().splitlines() if line and not line.startswith("#")]
             if hashlib.sha256(text).hexdigest() == rec.get("kernel_list_sha256") else [])
    return pingate.sm70_evidence(rec, names), str(COMPILE_RECORDS / f"{ref}.json")


def roll(ref: str, tmp: Path, log: Path) -> tuple[int, dict]:
    """One rolling rollout of the lab fleet with llama_cpp_ref = ref: (exit code, its fleet report)."""
    import subprocess

    vars_file = tmp / f"ref-{ref}.yml"
    vars_file.write_text(yaml.safe_dump({"llama_cpp_ref": ref}))
    latest = REPO / "reports/rollout-latest.json"
    latest.unlink(missing_ok=True)
    with log.open("a") as out:
        rc = subprocess.run([sys.executable, "-m", "rollout", "inventory/lab.py", "--canary", "1", "--batch", "2"],
                            cwd=REPO, env={**os.environ, runctx.ENV["vars_file"]: str(vars_file)}, stdout=out,
                            stderr=subprocess.STDOUT, timeout=3600).returncode
    return rc, (json.loads(latest.read_text()) if latest.exists() else {})


def releases(report: dict) -> dict[str, str]:
    """{host: the release (fingerprint) it serves after the rollout}, from its fleet report."""
    return {h["host"]: h.get("fingerprint") for h in report.get("hosts", [])}


def compiled(report: dict) -> list[str]:
    """Hosts whose build record in the rollout's run directory says they compiled."""
    from voltafleet.state import records

    run = runctx.RunDir(REPO / "reports" / f"rollout-{report.get('rollout')}")
    return sorted({r.host for r in run.all(records.Build) if r.built})


def lab_ssh(host: str, command: str):
    """One command on a lab host over the lab's ssh (its known_hosts checked): the CompletedProcess."""
    import subprocess

    from lab.fleet import load_state

    return subprocess.run(["ssh", "-F", load_state()["ssh_config"], host, command], capture_output=True, text=True,
                          timeout=60)


def canary_help(report: dict) -> tuple[str | None, str | None]:
    """(the canary's new llama-server --help, where it came from), asked on the host (a static release)."""
    from lab.fleet import load_state

    canary = (report.get("canary") or [None])[0]
    if canary not in {h["name"] for h in load_state()["hosts"]}:
        return None, None
    command = "/opt/voltafleet/current/bin/llama-server --help"
    out = lab_ssh(canary, command)
    if out.returncode != 0 or "--port" not in out.stdout:
        return None, None
    return out.stdout, f"{canary}:{command}"


def lab_move(ref: str, old_ref: str, clients: int, tmp: Path, log: Path) -> tuple[pingate.Step, str | None, str | None]:
    """The lab step: to the ref and back under load. Also (the new binary's --help, its source)."""
    from bench.lab.load import Load

    before = current_releases()
    say(f"the lab fleet to {ref}, then back to {old_ref}, under {clients} pooled keep-alive clients")
    # steady, light traffic (a pause between a client's requests): it crosses every drain and restart while the
    # canary's compile keeps the machine's cores
    from lab.fleet import load_state

    load = Load(load_state()["gateway_url"], clients=clients, tokens=16, seconds=3600, max_requests=100000, pause_s=0.25).start()
    try:
        rc1, moved = roll(ref, tmp, log)
        help_text, source = canary_help(moved) if rc1 == 0 else (None, None)
        rc2, back = roll(old_ref, tmp, log)
    finally:
        summary = load.stop()
    failed = (summary.get("failed") or 0) + (summary.get("cut") or 0)
    moved_r, back_r = releases(moved), releases(back)
    one = len(set(moved_r.values())) == 1 and not set(moved_r.values()) & set(before.values())
    expected = {h: moved_r[h] if one else "one new release on every host" for h in before}
    step = pingate.lab_step({"requests": summary.get("requests", 0), "failed": failed}, moved_r, back_r,
                            expected, before, compiled(back), (rc1 == 0, rc2 == 0))
    step.figures.update(summary={k: summary.get(k) for k in ("requests", "served", "failed", "cut", "ttft_p50_ms")},
                        to_ref=moved.get("rollout"), back=back.get("rollout"), compiled_to_ref=compiled(moved),
                        releases={"before": before, "to_ref": moved_r, "back": back_r})
    return step, help_text, source


def current_releases() -> dict[str, str]:
    """{lab host: the release it serves now}."""
    from lab.fleet import load_state

    return {h["name"]: lab_ssh(h["name"], "basename $(readlink /opt/voltafleet/current)").stdout.strip()
            for h in load_state()["hosts"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rollout.pingate", description=__doc__.split("\n")[0])
    ap.add_argument("ref", help="the llama.cpp ref to gate (a tag, a branch or a commit)")
    ap.add_argument("--clients", type=int, default=3, help="pooled keep-alive clients loading the gateway (default 3)")
    ap.add_argument("--evidence", default=None,
                    help="folder of sm70.json and h200.json (default bench/records/pin-gate/<ref>)")
    ap.add_argument("--out", default=None, help="also write the gate's record here")
    a = ap.parse_args(argv)
    from lab.fleet import load_state

    state = load_state()
    repo, old_ref = state["llama_cpp_repo"], state.get("llama_cpp_pin_tag") or state["llama_cpp_ref"]
    run_dir = REPO / "reports" / f"pin-check-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    folder = Path(a.evidence) if a.evidence else Path("bench/records/pin-gate") / a.ref  # relative to the repository
    steps: list[pingate.Step] = []
    try:
        commit, old_commit = refs.resolve(repo, a.ref), refs.resolve(repo, old_ref)
        steps.append(pingate.resolve_step(a.ref, commit, old_ref, old_commit))
    except refs.RefError as e:
        commit = old_commit = None
        steps.append(pingate.resolve_step(a.ref, None, old_ref, None, str(e)))
    help_text = source = None
    if steps[0].status == pingate.PASS:
        sm70, where = sm70_evidence(folder, a.ref)
        steps.append(pingate.sm70_step(sm70, commit, where))
        with tempfile.TemporaryDirectory() as tmp:
            lab, help_text, source = lab_move(a.ref, old_ref, a.clients, Path(tmp), run_dir / "rollouts.log")
        steps.append(pingate.flags_step(check_flags(help_text) if help_text else {}, source))
        steps.append(pingate.proof_step(evidence(folder, "h200.json"), commit, old_commit, str(folder / "h200.json")))
        steps.append(lab)
        if help_text:
            (run_dir / "llama-server-help.txt").write_text(help_text)
    verdict = pingate.verdict(steps)
    record = {"ref": a.ref, "commit": commit, "old_ref": old_ref, "old_commit": old_commit, "repo": repo,
              "verdict": verdict, "steps": [s.to_dict() for s in steps], "argv": ["-m rollout.pingate", *(argv or sys.argv[1:])]}
    text = json.dumps(record, indent=1) + "\n"
    (run_dir / "gate.json").write_text(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
    print(f"\npin gate for {a.ref} ({(commit or '?')[:12]}) against {old_ref} ({(old_commit or '?')[:12]})")
    for s in steps:
        print(f"  {s.name:13} {s.status:8} {s.detail}")
    print(f"verdict: {verdict}; record: {(run_dir / 'gate.json').relative_to(REPO)}")
    return EXIT[verdict]


if __name__ == "__main__":
    sys.exit(main())
