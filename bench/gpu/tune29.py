"""Issue 29 on the H200: the tune of the v100_32gb group through the GPU proof.

The controller side (`plan29`, in the pack's plan.json): voltafleet.measure.tune.candidates of the
v100_32gb group's variables, each setting's llama-server argv rendered as a host of the group
gets it and its VRAM plan for a V100-32GB (32,768 MiB; a setting that does not fit is kept,
refused, never run), and the build it runs on: the shipped FORCE_MMQ release (`mmq`), or for the
build-variant setting the Volta-rule release (`volta`).

The GPU side (phase tune29 of proof_bench.py: bench/gpu/proof/tuning.py): each setting's server, its GPU's memory
once loaded (`loaded_mib`, since issue 38: runs 1 and 2 have only the workload's `after_load_mib`,
read after the golden probe's request), then the group's workload (voltafleet/hostside/workload.py, as
shipped to hosts: tune_* of group_vars/all.yml) on it, tune_repetitions times; the records go to
results.json["tune29"]. `report` judges them with voltafleet.measure.tune (the winner against the
shipped setting, one session) from the records alone.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

V100_32GB_MIB = 32768
GROUP = "v100_32gb"


# the group's workload (tune_* of group_vars/all.yml) cut to fit the device's 30 minutes: each of
# the 16 clients sends one 512-token prompt for 128 tokens a repetition (the issue-27 serve shape)
PROOF_WORKLOAD = {"tune_requests": 16, "tune_prompt_tokens": 512, "tune_answer_tokens": 128}
# run 2 (tune29b): two requests a client a repetition, conversations opened before the first and carried
# over (workload.py since run 1, whose clients sent one request each and so never continued one), for the
# shipped setting against run 1's winner, in one session
FOLLOWUP_WORKLOAD = {**PROOF_WORKLOAD, "tune_requests": 32}
FOLLOWUP_SETTINGS = ("shipped", "no checkpoints")


def plan29(group_cfg, render_args, header: dict, workload: dict = PROOF_WORKLOAD, names=None) -> dict:
    """Every setting of the tune (or those `names`): name, values, argv (MODEL for the model), build, plan."""
    from voltafleet.measure import tune
    from voltafleet.planning import vram

    cfg = group_cfg(GROUP).replace(**{"voltafleet_backend": "cuda", **workload})
    out = []
    for s in tune.candidates(cfg):
        if names is not None and s.name not in names:
            continue
        c = cfg.replace(**s.values)
        build = "mmq" if tune.FORCE_MMQ in (c.build.cmake_extra or []) else "volta"
        d = vram.decide(c, V100_32GB_MIB, header, archs=[70])
        p = d.plan
        out.append({"name": s.name, "values": s.values, "build": build, "args": render_args(c),
                    "fits": d.error is None, "refusal": d.error,
                    "planned_mib": round(p.needed / vram.MIB, 1) if p else None,
                    "planned_static_mib": round((p.needed - p.overhead - p.pool) / vram.MIB, 1) if p else None})
    w = tune.Workload.of(cfg)
    return {"settings": out, "workload": w.argv(), "repetitions": w.repetitions, "gpu_mib": V100_32GB_MIB,
            "objective_ttft_p99_ms": cfg.tune.max_ttft_p99_ms, "headroom_mib": cfg.tune.headroom_mib}


def trials(records: list[dict], followups_sent: bool = True):
    """voltafleet.measure.tune.Trial of each record; its probe: its greedy tokens against the shipped
    setting's (the first record), as the fleet compares every host with the golden probe.
    followups_sent False (run 1): the records' `followups` are the workload's draws, none of which
    could be sent (no client had a conversation yet): left out rather than quoted."""
    from voltafleet.measure import tune

    out = []
    gold = records[0].get("probe_tokens") if records else None
    for r in records:
        if not followups_sent:
            r = {**r, "reps": [{**x, "followups": None} for x in r.get("reps", [])]}
        probe = None if r.get("probe_tokens") is None or gold is None else \
            "match" if r["probe_tokens"] == gold else "diverged from the shipped setting's tokens"
        out.append(tune.Trial.of(tune.Setting(r["name"], r["values"]), r, probe=probe,
                                 reason=r.get("refusal") or r.get("reason") or ""))
    return out


def report(records: list[dict], cfg: dict) -> str:
    from voltafleet.measure import tune

    ts = trials(records, False)
    best = tune.winner(ts, cfg, V100_32GB_MIB)
    return tune.table(ts, cfg, V100_32GB_MIB, best)


def machine(run: Path) -> dict:
    """The record's GPU, driver and llama.cpp commit, from its facts.txt and build.txt."""
    import re

    name, driver, mib = re.search(r"^(NVIDIA [^,]+), ([\d.]+), (\d+) MiB$", (run / "facts.txt").read_text(), re.M).groups()
    commit = re.search(r"commit ([0-9a-f]+)", (run / "build.txt").read_text()).group(1)
    return {"host": "the GPU proof's H200 (bench/records/proof29)", "backend": "cuda",
            "gpu": {"name": name, "driver": driver, "memory_mib": int(mib), "judged_as_mib": V100_32GB_MIB},
            "llama_cpp": {"commit": commit, "builds": "mmq: Volta rule + FORCE_MMQ (shipped); volta: Volta rule"},
            "model_sha256": None, "model": "the shape-exact Qwen3.6-27B Q4_K_S with zero weights (qwen35gen.py)",
            "records": os.path.relpath(run.resolve(), Path(__file__).resolve().parents[2])}


def document(records: list[dict], cfg: dict, meta: dict, followups_sent: bool = True) -> str:
    """The group_vars/v100_32gb.tuned.yml a canary would write from these trials."""
    from voltafleet.measure import tune

    ts = trials(records, followups_sent)
    return tune.document(GROUP, tune.winner(ts, cfg, V100_32GB_MIB), ts, cfg, meta, V100_32GB_MIB)


if __name__ == "__main__":  # python -m bench.gpu.tune29 RESULTS.json [--tuned]: the table, or the tuned file
    from bench.gpu.groups import group_cfg

    path = Path(sys.argv[1])
    results = json.loads(path.read_text())
    run2 = "tune29b" in results  # run 2: the follow-up workload; run 1: every setting, no follow-up sent
    cfg = group_cfg(GROUP).replace(**{"voltafleet_backend": "cuda", **(FOLLOWUP_WORKLOAD if run2 else PROOF_WORKLOAD)})
    records = results["tune29b" if run2 else "tune29"]
    print(document(records, cfg, machine(path.parent), run2) if "--tuned" in sys.argv[2:] else report(records, cfg))
    os._exit(0)
