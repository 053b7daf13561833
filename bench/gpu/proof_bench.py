"""The GPU proof's measurements (issue 19 onwards), run on the GPU machine by gpu_proof.sh; stdlib only.

    PYTHONPATH=PACK python3 -m bench.gpu.proof_bench --plan plan.json --bin BIN [--cublas-bin BIN] \
        [--bins LABEL=DIR,...] --models DIR --res DIR --phases NAME[:ARG],...

Each phase appends raw records to RES/results.json, saved after every step; a phase that fails is an
entry of results["errors"] and the next one runs. A phase list with a name not in PHASES, or an
argument missing or not taken, is refused before anything starts. The phases, by what they measure
(each module of bench/gpu/proof says what its records hold):

  GPU memory under load (proof/loads.py)
    vram:BUILD[:once]      the v100_16gb argv at 2/3/4 slots (and v100_32gb's variants): memory after
                           load, its peak while one 1,536-token prompt per slot runs at once, and after
    vram_named:BUILD=A+B   one run each of the named vram entries
    peak:BUILD             issue 27: short and long prompts on every slot, at 2-16 slots
  the kernels' speed, no server (proof/kernel_speed.py)
    pp:BUILD               llama-bench prompt processing (every repetition's tok/s)
    tg                     llama-bench tg128 (the single-stream ceiling)
    bench27:BUILD          issue 27: pp128/512/2048 and tg128
    batched                llama-batched-bench, 1-32 parallel sequences, 3 runs (+ 1 with a unified KV cache)
  a server's rounds (proof/serving.py)
    serve[:A+B]            each server config: after a warm-up, 3 rounds of 1 and N concurrent streams
                           (TTFT and every token's arrival kept), then multi-turn conversations
    serve27:BUILD          issue 27: the shipped argv, 512-token prompts at 1/4/16 clients
    spec[:A+B]             n-gram drafting: drafts drafted and accepted, each greedy text's hash
  what voltafleet's own clients see (proof/probes.py, proof/tuning.py)
    probe27[:A+B]          the smoke client's quality probes through both builds (or the named ones: issue 50's two pins)
    tune29[:KEY]           the group's tune settings under its workload (KEY: tune29 or tune29b)
  thinking, host memory, tiers (proof/thinking.py, proof/hostmem.py, proof/tiers.py)
    think32:BUILD          streamed chats, thinking off, budgets 0/256/1024 and unbounded, at 1 and 16
                           clients over kept-alive connections: every reasoning and content chunk's arrival
    host38:BUILD           llama-server's host memory and context checkpoints under real chats
    host49:BUILD           the same, each server in a cgroup at its unit's MemoryMax (issue 49's validation)
    tier41:BUILD           the latency tier (2 slots, MTP speculation) against the throughput tier
  a busy fleet's traffic (proof/traffic.py, bench/traffic)
    traffic51:BUILD        seeded multi-turn chats with thinking, Poisson arrivals at 80 % of the slots, 1-4x the
                           slots' conversations: per request TTFT and cached prompt tokens, the summary

BUILD: a build's label (default, cublas, volta, mmq: --bins, --cublas-bin, else --bin); a phase of a
plan entry that names its build runs nothing on another. The names are those of the records
(bench/records/proof*: their results.json keys and phase_seconds), so they stay as they are.

PACK: bench/gpu/gpu_proof.py's pack, which holds this module, bench/gpu/proof/, qwen35_bench and
voltafleet's smoke client and workload at their repository paths (gpu_proof.MACHINE_SOURCES).
"""
from __future__ import annotations

import argparse
import inspect
import time

from bench.gpu.proof import hostmem, kernel_speed, loads, probes, serving, thinking, tiers, traffic, tuning
from bench.gpu.proof.runner import ProofRun
from bench.gpu.qwen35_bench import say

# The phases `--phases` takes: name -> the function that measures, called (run) or (run, ARG) for
# `name:ARG`; a parameter with a default makes ARG optional, one without makes it required.
PHASES = {
    # GPU memory under load
    "vram": loads.vram,
    "vram_named": loads.vram_named,
    "peak": loads.peak,
    # the kernels' speed, no server
    "pp": kernel_speed.prompt_speed,
    "tg": kernel_speed.decode_speed,
    "bench27": kernel_speed.prompt_and_decode,
    "batched": kernel_speed.batched_decode,
    # a server's rounds
    "serve": serving.serve_configs,
    "serve27": serving.serve_shipped,
    "spec": serving.ngram_drafting,
    # what voltafleet's own clients see
    "probe27": probes.smoke_probes,
    "tune29": tuning.tune_settings,
    # thinking, host memory, tiers
    "think32": thinking.thinking_budget,
    "host38": hostmem.host_memory_chats,
    "host49": hostmem.host_memory_validation,
    "tier41": tiers.latency_tier,
    # a busy fleet's traffic
    "traffic51": traffic.traffic,
}


def usage(name: str) -> str:
    """A phase's form on the command line, from its function's parameters after the run:
    `tg`, `think32:BUILD`, `serve[:NAMES]`."""
    params = list(inspect.signature(PHASES[name]).parameters.values())[1:]
    if not params:
        return name
    arg = params[0].name.upper()
    return f"{name}[:{arg}]" if params[0].default is not inspect.Parameter.empty else f"{name}:{arg}"


def refused(phases: list[str]) -> str | None:
    """Why the phase list cannot run (a phase not in PHASES, an argument missing or not taken), or None."""
    for ph in phases:
        name, _, arg = ph.partition(":")
        if name not in PHASES:
            return f"unknown phase {name!r} (in {ph!r}); the phases: {', '.join(usage(n) for n in PHASES)}"
        try:
            inspect.signature(PHASES[name]).bind(None, *([arg] if arg else []))
        except TypeError:
            return f"phase {ph!r}: takes the form {usage(name)}"
    return None


def run_phase(run: ProofRun, ph: str) -> None:
    """One phase of the list: an exception is an entry of results["errors"], not the run's end; its
    wall time goes to results["phase_seconds"], saved."""
    name, _, arg = ph.partition(":")
    t = time.time()
    say("phase", ph)
    try:
        PHASES[name](run, *([arg] if arg else []))
    except Exception as e:  # noqa: BLE001
        run.results.setdefault("errors", []).append(f"{ph}: {e!r}")
        say("phase", ph, "error", repr(e))
    run.results.setdefault("phase_seconds", {})[ph] = round(time.time() - t, 1)
    run.save()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k in ("plan", "bin", "models", "res"):
        ap.add_argument(f"--{k}", required=True)
    ap.add_argument("--cublas-bin")
    ap.add_argument("--bins", help="label=BINDIR,... (issue 27: volta, mmq)")
    ap.add_argument("--phases", required=True, help="NAME[:ARG],... of PHASES, run in that order")
    a = ap.parse_args(argv)
    phases = a.phases.split(",")
    why = refused(phases)
    if why:
        ap.error(why)  # before the plan is read or any server starts
    run = ProofRun(a)
    for ph in phases:
        run_phase(run, ph)


if __name__ == "__main__":
    main()
