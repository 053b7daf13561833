"""The GPU proof at HEAD in one command: pack, run on a GPU machine, report.

    .venv/bin/python -m bench.gpu.gpu_proof pack [DEST]            # sources + every argv into DEST (< 64 MiB)
    bash DEST/gpu_proof.sh                                       # on the GPU machine (no network needed)
    .venv/bin/python -m bench.gpu.gpu_proof report RESULTS.json    # the tables of bench/RESULTS.md
    .venv/bin/python -m bench.gpu.gpu_proof report32 RESULTS.json  # issue 32's table (the thinking budget)
    .venv/bin/python -m bench.gpu.gpu_proof pack49v [DEST]         # issue 49's validation run (plan49v, PHASES49V)
    .venv/bin/python -m bench.gpu.gpu_proof validate49 RUN_DIR     # its verdicts: planned against measured
    .venv/bin/python -m bench.gpu.gpu_proof all                    # a GPU host with this checkout: all three

The pack holds llama.cpp at the pinned commit (a one-commit bare git repository made from the
llama-cpp-python sdist's vendor/llama.cpp: `pip download`, sha256 pinned in lab/fleet.py),
its gguf-py and qwen35 vocabulary (for lab/qwen35gen.py, which writes the shape-exact
Qwen3.6-27B Q4_K_S file on the GPU machine in seconds), voltafleet's own build script
(roles/llama_cpp/files/vf-build-release.sh) with the argv voltafleet.planning.hostplan renders for it,
and every llama-server argv of the run rendered by voltafleet.planning.flags.server_args from
group_vars. On a lent machine where a command may run 10 minutes, `gpu_proof.sh` detaches
the run and each call waits for it again (the results stay in $RES).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from bench.gpu.groups import RECORDS_REF, group_cfg
from lab.fleet import SDIST_NAME, SDIST_SHA256, SDIST_VERSION
from voltafleet.inputs.settings import Settings
from voltafleet.planning import hostplan
from voltafleet.planning.flags import MALLOC_HEAP, server_args

REPO = Path(__file__).resolve().parents[2]
COMMIT = RECORDS_REF
TOOLKIT = "13.0"        # the H200 machine's nvcc; nvcc 13 cannot build sm_70 (the V100 groups use 12.x)
ARCH = 90
PORT = 18080
PACK_TOKEN = "@PACK@"   # replaced on the GPU machine by the pack's own path
TARGETS = ["llama-server", "llama-bench", "llama-batched-bench", "llama-quantize"]
SDIST_CACHE = REPO / ".voltafleet" / "sdist"
LIMIT = 64 << 20        # what one device call carries


def render(group: str, ctx=None, np_=None, kv=None, extra=()) -> list[str]:
    """The group's llama-server argv (MODEL for the model), -c/-np/KV types changed if given."""
    cfg = group_cfg(group)
    if ctx:
        cfg = cfg.replace(server_ctx=ctx, server_parallel=np_)
    if kv:
        cfg = cfg.replace(server_cache_type_k=kv, server_cache_type_v=kv)
    cfg = cfg.replace(server_extra_flags=list(cfg.server.extra_flags) + list(extra))
    return server_args(cfg, "MODEL", port=PORT, api_key_file=None)


def build_plan(pack_dir: str = PACK_TOKEN, targets=TARGETS, jobs: int = 16, commit: str = COMMIT,
               root: str = "/tmp/vf") -> dict:
    """vf-build-release's argv for the GPU machine, as voltafleet renders it for a host (the
    v100_16gb group's variables but its CMake extras: a build of the default kernel paths), of `commit`
    under `root` (issue 50's second pin: its own root, so the two trees stand side by side)."""
    cfg = group_cfg("v100_16gb").replace(**{"llama_cpp_cmake_extra": []})
    cfg = cfg.replace(cuda_toolkit_version=TOOLKIT, llama_cpp_targets=list(targets),
               llama_cpp_repo=f"file://{pack_dir}/llama.cpp.git")
    spec = hostplan.build_spec(cfg, [ARCH], commit)
    fp = spec.fingerprint("DEVICE_NVCC", "DEVICE_CXX")
    info = {"fingerprint": fp, "commit": commit, "flags": list(spec.flags), "toolkit": TOOLKIT,
            "built_on": "gpu-proof", "repo": spec.repo}
    argv = hostplan.build_argv(f"{pack_dir}/vf-build-release.sh", root, fp, spec, jobs, info)
    return {"fingerprint": fp, "argv": argv, "nvcc": f"{spec.cuda_bin}/nvcc", "commit": commit, "root": root}


def run_plan() -> dict:
    """Every measurement of the run, with the exact argv (issue 19)."""
    seed = "-m MODEL -ngl 99 -c 8192 -ctk q8_0 -ctv q8_0 -np 4 -t 8 --host 127.0.0.1".split() + ["--port", str(PORT)]
    g16, g32 = group_cfg("v100_16gb"), group_cfg("v100_32gb")
    bench_common = ["-ngl", "99", "-fa", "1", "-ctk", g16.server.cache_type_k, "-ctv",
                    g16.server.cache_type_v, "-t", str(g16.server.threads)]
    # VRAM: one long prompt per slot at once, after which the CUDA pool holds its peak
    vram = [{"name": f"v16-np{n}", "args": render("v100_16gb", 8192, n), "parallel": n, "prompt": 1536}
            for n in (2, 3, 4)]
    vram.append({"name": "v16-np2-ub256", "args": render("v100_16gb", 8192, 2, extra=("-ub 256",)), "parallel": 2,
                 "prompt": 1536})
    cr0 = "--cache-ram 0"
    # issue 19 §4: the 16-client wall figure with larger prompt ubatches (fewer, larger prompt matrix
    # products: cuBLAS on Volta), on both builds; VRAM of the same argv after 16 long prompts at once
    ub = {n: render("v100_32gb", extra=(f"-ub {n}",)) for n in (1024, 2048)}
    vram += [{"name": "v32-ship", "args": render("v100_32gb"), "parallel": 16, "prompt": 1536},
             *({"name": f"v32-ub{n}", "args": a, "parallel": 16, "prompt": 1536} for n, a in ub.items())]
    # what grows with 16 long prompts at once (+2.5 GB over after-load on the FORCE_CUBLAS build):
    # checkpoints off, backend sampling off, 4 slots of the same 8K
    nobs32 = group_cfg("v100_32gb")
    nobs32 = nobs32.replace(server_backend_sampling=False)
    vram += [{"name": "v32-cp0", "args": render("v100_32gb", extra=("--ctx-checkpoints 0",)), "parallel": 16,
              "prompt": 1536},
             {"name": "v32-nobs", "args": server_args(nobs32, "MODEL", port=PORT, api_key_file=None), "parallel": 16,
              "prompt": 1536},
             {"name": "v32-np4", "args": render("v100_32gb", 32768, 4), "parallel": 4, "prompt": 1536}]

    def serve(name, args, streams, multi):
        return {"name": name, "args": args, "streams": streams, "tokens": 128, "prompt": 128, "multi": multi}

    def v32(*extra):
        return render("v100_32gb", extra=extra)

    def v32_nobs(*extra):
        cfg = group_cfg("v100_32gb")
        cfg = cfg.replace(server_backend_sampling=False)
        cfg = cfg.replace(server_extra_flags=list(extra))
        return server_args(cfg, "MODEL", port=PORT, api_key_file=None)

    def v16(*extra, bs=True, np_=None):
        cfg = group_cfg("v100_16gb")
        cfg = cfg.replace(server_backend_sampling=bs)
        if np_:
            cfg = cfg.replace(server_parallel=np_)
        cfg = cfg.replace(server_extra_flags=list(extra))
        return server_args(cfg, "MODEL", port=PORT, api_key_file=None)

    def v32_spec(ngram):
        cfg = group_cfg("v100_32gb")
        cfg = cfg.replace(server_spec_ngram=ngram)
        return server_args(cfg, "MODEL", port=PORT, api_key_file=None)

    # issue 19 §6: n-gram drafting on the hybrid (a recurrent-state checkpoint per verified draft),
    # v100_32gb as shipped with and without `server_spec_ngram: ngram-mod`, both builds; two prompt
    # kinds: distinct tokens, and a 32-token run repeated 8 times (n-grams to draft from)
    spec = [{"name": f"v32-{n or 'nospec'}{'-cublas' if b == 'cublas' else ''}", "build": b, "args": v32_spec(n),
             "streams": [1, 16] if b == "default" else [16], "tokens": 128}
            for b in ("default", "cublas") for n in (None, "ngram-mod")]
    # the same, sampled from the top 2 or 3 tokens (temperature 1, a seed a request): the random-weight
    # model's greedy output loops, so every draft is accepted; sampling makes some drafts wrong
    spec += [{**x, "name": x["name"] + "-sampled", "kinds": ["plain", "plain-k2", "plain-k3"],
              "streams": [1, 2, 16] if x["build"] == "default" else [16]} for x in spec]

    m32 = {"conversations": 20, "turns": 3, "first": 512, "turn": 64, "reply": 32}
    m16 = {"conversations": 4, "turns": 3, "first": 512, "turn": 64, "reply": 32}
    return {
        "port": PORT, "commit": COMMIT, "runs": 3,
        "vram": vram,
        "llama_bench": {"args": bench_common + ["-p", "128,512", "-n", "0", "-ub", "512", "-r", "3"]},
        "batched": {"args": ["-ngl", "99", "-fa", "on"] + bench_common[4:] + [
            "-c", "262144", "-b", "2048", "-ub", "512", "-npp", "128", "-ntg", "128",
            "-npl", "1,2,4,8,16,32", "--output-format", "jsonl"], "kvu": ["-kvu"]},
        "tg": {"args": bench_common + ["-p", "0", "-n", "128", "-r", "3"]},
        "serve": [
            serve("v32-ship", v32(), [1, 4, 16], m32),
            serve("seed-stage3", seed, [1, 4, 16], None),
            serve("v32-nobs", v32_nobs(), [1, 4, 16], m32),
            serve("v32-cr0", v32(cr0), [1, 4, 16], m32),
            serve("v32-nobs-cr0", v32_nobs(cr0), [1, 4, 16], None),
            serve("v32-cr0-kvu", v32(cr0, "--kv-unified"), [1, 4, 16], None),
            serve("v16-ship", v16(), [1, 4], m16),
            serve("v16-nobs", v16(bs=False), [1, 4], m16),
            serve("v16-cr0", v16(cr0), [1, 4], m16),
            serve("v16-np4", v16(np_=4), [1, 4], None),
            serve("v32-ub1024", ub[1024], [16], None),
            serve("v32-ub2048", ub[2048], [16], None),
            serve("v32-cp0", v32("--ctx-checkpoints 0"), [16], None),
            {**serve("v32-ship-cublas", v32(), [16], None), "build": "cublas"},
            {**serve("seed-stage3-cublas", seed, [16], None), "build": "cublas"},
            {**serve("v32-ub1024-cublas", ub[1024], [16], None), "build": "cublas"},
            {**serve("v32-ub2048-cublas", ub[2048], [16], None), "build": "cublas"},
        ],
        "spec": spec,
        "g32": {"server_ctx": g32.server.ctx, "server_parallel": g32.server.parallel},
    }


PEAK_SLOTS = (2, 4, 8, 12, 16)       # issue 27: the planner against the Volta-rule build's peaks
SHORT, LONG32, LONG16 = 128, 7000, 3900  # prompt tokens: short (>= 64: the cuBLAS path), ~85 % of a slot's 8K / 4K
LONG_PROBE = REPO / "voltafleet" / "data" / "probe-long.txt"


def v32_cfg(n: int, **over) -> Settings:
    """v100_32gb's variables with n slots of 8K each (the group's per-slot context), changes in `over`; glibc's
    malloc as it was (server_malloc_heap off: the runs of issues 27-49 ran without HEAP51, planned as they ran)."""
    return group_cfg("v100_32gb").replace(server_ctx=8192 * n, server_parallel=n, **{"server_malloc_heap": False, **over})


def v32_at(n: int, **over) -> list[str]:
    """v100_32gb's argv with n slots of 8K each (the group's per-slot context), changes in `over`."""
    return server_args(v32_cfg(n, **over), "MODEL", port=PORT, api_key_file=None)


def plan27() -> dict:
    """Issue 27's measurements, on the Volta-rule build (`volta`: Volta's exact kernel choice) and
    the same tree with GGML_CUDA_FORCE_MMQ (`mmq`): every argv rendered from group_vars.

    peaks    one prompt per slot at once (short and long), the process's peak GPU memory; the
             v100_16gb argv; n-gram drafting at 16 slots (a repeated prompt, so drafts happen)
    bench    llama-bench pp128/512/2048 and tg128, 3 repetitions, each build
    serve    the shipped v100_32gb argv: 3 rounds at 1/4/16 clients,
             512-token prompts (the 64+ path), 128 tokens, TTFT and tok/s
    probe    the smoke client's long and short quality probes (greedy), through both builds, on a
             random-weight qwen35 (Q8_0, quantized there) and on the 27B shape"""
    peaks = []
    for build in ("volta", "mmq"):
        slots = PEAK_SLOTS if build == "volta" else (16,)
        for n in slots:
            for kind, plen in (("short", SHORT), ("long", LONG32)):
                if build == "mmq" and kind == "short":
                    continue
                peaks.append({"build": build, "name": f"v32-np{n}-{kind}", "group": "v100_32gb", "args": v32_at(n),
                              "ctx": 8192 * n, "parallel": n, "prompt": plen, "tokens": 8, "kind": "plain"})
        for kind, plen in (("short", SHORT), ("long", LONG16)) if build == "volta" else (("long", LONG16),):
            peaks.append({"build": build, "name": f"v16-np2-{kind}", "group": "v100_16gb", "args": render("v100_16gb"),
                          "ctx": 8192, "parallel": 2, "prompt": plen, "tokens": 8, "kind": "plain"})
        peaks.append({"build": build, "name": "v32-np16-ngram", "group": "v100_32gb",
                      "args": v32_at(16, server_spec_ngram="ngram-mod"), "ctx": 131072, "parallel": 16,
                      "prompt": 256, "tokens": 128, "kind": "repeat", "spec": "ngram-mod"})
    g16 = group_cfg("v100_16gb")
    common = ["-ngl", "99", "-fa", "1", "-ctk", g16.server.cache_type_k, "-ctv", g16.server.cache_type_v,
              "-t", str(g16.server.threads), "-ub", "512", "-b", "2048", "-r", "3"]
    serve = [{"build": b, "name": f"{g}-ship", "group": g, "args": render(g), "streams": s, "prompt": 512,
              "tokens": 128} for b in ("volta", "mmq") for g, s in (("v100_32gb", [1, 4, 16]),)]
    return {"peaks": peaks, "bench": {"pp": common + ["-p", "128,512,2048", "-n", "0"],
                                      "tg": common + ["-p", "0", "-n", "128"]},
            "serve27": serve, "runs27": 3,
            "probe": {"long": LONG_PROBE.read_text(), "short": group_cfg("v100_32gb").smoke.probe_prompt,
                      "tokens": 16, "min_tokens": 512,
                      "args": render("v100_16gb"), "tiny_args": ["-m", "MODEL", "-ngl", "99", "-c", "4096", "-np", "1",
                                                                 "-fa", "on", "--host", "127.0.0.1", "--port", str(PORT)]}}


def plan_tune29(**kw) -> dict:
    """Issue 29: the v100_32gb group's tune settings (bench/gpu/tune29.py), planned for a V100-32GB
    from the 27B's header (tests/fixtures/gguf: the shape-exact file's); kw: plan29's workload, names."""
    from bench.gpu.tune29 import plan29

    return plan29(group_cfg, lambda c: server_args(c.replace(server_host="127.0.0.1"), "MODEL", port=PORT,
                                                   api_key_file=None), qwen_header(), **kw)


def plan_tune29b() -> dict:
    """Issue 29, second run: the shipped setting against the first run's winner, with the
    workload's follow-ups reaching the server (bench/gpu/tune29.py FOLLOWUP_WORKLOAD)."""
    from bench.gpu.tune29 import FOLLOWUP_SETTINGS, FOLLOWUP_WORKLOAD

    return plan_tune29(workload=FOLLOWUP_WORKLOAD, names=FOLLOWUP_SETTINGS)


THINK_MODES = (("off", {"chat_template_kwargs": {"enable_thinking": False}}),
               ("b0", {"thinking_budget_tokens": 0}),
               ("b256", {"thinking_budget_tokens": 256}),
               ("b1024", {"thinking_budget_tokens": 1024}),
               ("unbounded", {"thinking_budget_tokens": -1}))
THINK_MAX_TOKENS = 1088  # budget 1024 + a 64-token answer; the unbounded thought runs to it


def plan32() -> dict:
    """Issue 32: the thinking budget on the Volta-rule build, v100_32gb's argv as shipped (--jinja is
    the server's default: the model's Qwen3.6 chat template). Per request: thinking off
    (enable_thinking false), a budget of 0, 256 or 1024 tokens (thinking_budget_tokens, which the
    server takes like its --reasoning-budget), or unbounded (-1: until max_tokens); 1 and 16
    clients (the group's 16 slots), 3 repetitions, streamed, greedy."""
    g = group_cfg("v100_32gb")
    return {"think32": {"build": "volta", "name": "v100_32gb-ship", "group": "v100_32gb", "args": render("v100_32gb"),
                        "model": g.server.model_alias,
                        "question": "how many prime numbers are there below 100? Think it through, then answer.",
                        "modes": [{"mode": m, "extra": e} for m, e in THINK_MODES],
                        "streams": [1, g.server.parallel], "max_tokens": THINK_MAX_TOKENS, "runs": 3}}


# issue 38: a real chat (the chat template, thinking, the history sent back without it) and a fill
# (short turns, so 16 turns of 2 checkpoints each fit a slot's 8K: every slot's 32 checkpoints held)
CHAT38 = {"kind": "chat", "turns": 4, "prompt_tokens": 800, "answer_tokens": 64, "thinking_budget": 40}
FILL38 = {"kind": "fill", "turns": 17, "prompt_tokens": 64, "answer_tokens": 8, "thinking_budget": 4}


def plan38() -> dict:
    """Issue 38 on the shipped build (FORCE_MMQ, as Volta takes it): llama-server's host memory and
    what context checkpoints cost and save, on v100_32gb's argv at its slots and checkpoint counts.
    The fill runs hold every slot's checkpoints (the worst case the host-memory plan must cover), at
    16 and 4 slots; the chat runs are real follow-ups (the template drops the earlier thinking, so a
    follow-up leaves the cached sequence where the last answer began) at 0, 4, 8 and 32 checkpoints
    and at 4 with no minimum spacing (--checkpoint-min-step 0): follow-up TTFT, throughput, memory."""
    def item(name, slots, ckpt, kind, cms=None):
        extra = ["--checkpoint-min-step", str(cms)] if cms is not None else []
        return {"name": name, "slots": slots, "ckpt": ckpt, "cms": cms, "group": "v100_32gb",
                "args": v32_at(slots, server_ctx_checkpoints=ckpt, server_extra_flags=extra), **kind}
    # what the first run (bench/records/proof38/run1: fill-np16-ck32 alone) left unmeasured comes first: a
    # repetition of 16 slots takes about 5.7 s a turn where they checkpoint, the device 30 minutes in all
    configs = [item(f"chat-np16-ck{n}", 16, n, CHAT38) for n in (0, 8, 32, 4)]
    configs += [item("fill-np4-ck32", 4, 32, FILL38), item("fill-np16-ck32", 16, 32, FILL38),
                item("chat-np16-ck4-cms0", 16, 4, CHAT38, cms=0)]
    return {"host38": {"build": "mmq", "runs": 3, "configs": configs}}


def cms_flags(cms: int | None) -> list[str]:
    """server_extra_flags for a minimum checkpoint spacing (--checkpoint-min-step), none for llama-server's default."""
    return ["--checkpoint-min-step", str(cms)] if cms is not None else []


def host49_cfg(slots: int, ckpt: int, cms: int | None = None) -> Settings:
    """v100_32gb's variables at `slots` slots of 8K and `ckpt` checkpoints, --checkpoint-min-step `cms` added to the
    group's server_extra_flags: what a host of the group with these values gets (argv, plan and unit alike)."""
    extra = list(group_cfg("v100_32gb").server.extra_flags) + cms_flags(cms)
    return v32_cfg(slots, server_ctx_checkpoints=ckpt, server_extra_flags=extra)


def host_plan(slots: int, ckpt: int, cms: int | None = None):
    """voltafleet.planning.hostmem's plan of one v100_32gb instance at `slots` slots of 8K and `ckpt` checkpoints
    (the shape-exact Qwen3.6-27B Q4_K_S's header); `cms` as host49_cfg (the plan does not read it)."""
    from voltafleet.planning import hostmem

    cfg = host49_cfg(slots, ckpt, cms).replace(voltafleet_backend="cuda")
    return hostmem.plan(cfg, qwen_shape(), 1)


def host49_item(name: str, slots: int, ckpt: int, kind: dict, cms: int | None = None, runs: int | None = None) -> dict:
    """One host49 config: the argv of host49_cfg, its plan (planned_mib: the instance's total) and the ceiling its
    unit gets (memory_max_mib: MemoryMax, the plan x 1.10, in MiB rounded up); `runs`: its own repetitions."""
    p = host_plan(slots, ckpt, cms)
    return {"name": name, "slots": slots, "ckpt": ckpt, "cms": cms, "group": "v100_32gb",
            "args": server_args(host49_cfg(slots, ckpt, cms), "MODEL", port=PORT, api_key_file=None),
            "planned_mib": round(p.instance.total / 2**20, 1), "memory_max_mib": -(-p.memory_max // 2**20),
            **({"runs": runs} if runs else {}), **kind}


def plan49() -> dict:
    """Issue 49's host-memory runs: plan38's workloads on the shipped build (FORCE_MMQ), each server in a
    cgroup of its own whose memory.max is its unit's MemoryMax (the plan x 1.10) on the H200 machine's
    kernel. Run 3 (bench/records/proof49/run3) fitted the process terms (fit49: the no-checkpoint chats at
    4, 8, 16 and 24 slots); this plan is the run that validates them, in the order the device's half hour
    can afford: 0, 4, 8 and 32 checkpoints at the shipped 16 slots, every slot's checkpoints (the worst
    case), then the process term at 4 and 24 slots. Each config's plan goes with it."""
    configs = [host49_item(f"chat-np16-ck{n}", 16, n, CHAT38) for n in (0, 4, 8, 32)]
    configs += [host49_item("fill-np16-ck32", 16, 32, FILL38)]
    configs += [host49_item(f"chat-np{n}-ck0", n, 0, CHAT38) for n in (4, 24)]
    return {"host49": {"build": "mmq", "runs": 3, "configs": configs}}


FIT49_MARGIN_MIB = 5   # above the fit runs' largest residual: a later run's noise, not measured before it
FIT49_RUNS = ("bench/records/proof49/run3", "bench/records/proof49/run4")


def fit49(runs: list[dict], margin_mib: int = FIT49_MARGIN_MIB) -> dict:
    """The host-memory plan's process terms, fitted on every repetition of host49 runs (results.json each):
        process, slot   the anonymous and shared memory (VmRSS's RssAnon + RssShmem) less the plan's host
                        buffers and the checkpoints held, a base and a part a slot: the least-squares slope
                        over the slot counts' largest values (rounded up to 0.1 MiB), the base `margin_mib`
                        above the largest residual, so no fit run is under
        kernel          the cgroup's charge less its page cache, its anonymous memory and the page tables
                        (1/512 of it): the largest, rounded up
        program         the largest file-backed VmRSS (the binary, its libraries, the few token_embd pages
                        the words touched)"""
    import math

    from voltafleet.planning.hostmem import PAGE_TABLE_SHARE
    points, files, kernel = {}, [], []
    for results in runs:
        for r in results.get("host49", []):
            buffers = host_plan(r["slots"], 0).instance.host_buffers / 2**20
            for rep in r["reps"]:
                peak = rep["peak"]
                anon = peak["RssAnon"] + peak["RssShmem"]
                size = max(rep["ckpt"]["size_mib"] or [0])
                rest = anon - buffers - rep["ckpt"]["held"] * size
                points[r["slots"]] = max(points.get(r["slots"], rest), rest)
                files.append(peak["RssFile"])
                kernel.append(peak["cgroup"]["cg_unreclaimable"] - anon - anon / PAGE_TABLE_SHARE)
    n = sorted(points)
    mean_n, mean_y = sum(n) / len(n), sum(points.values()) / len(n)
    slope = sum((x - mean_n) * (points[x] - mean_y) for x in n) / sum((x - mean_n) ** 2 for x in n)
    slot = math.ceil(slope * 10) / 10
    base = math.ceil(max(points[x] - slot * x for x in n)) + margin_mib
    return {"hostmem_process_mib": base, "hostmem_slot_mib": slot, "hostmem_kernel_mib": math.ceil(max(kernel)),
            "hostmem_program_mib": math.ceil(max(files)), "slots": n,
            "residual_mib": {x: round(base + slot * x - points[x], 1) for x in n}}


# issue 41: the latency tier, v100_32gb's argv with 2 slots of 32K and the model's own MTP head
LATENCY41 = {"server_parallel": 2, "server_ctx": 65536}
DEPTHS41 = (1, 2, 3)


def latency41(depth: int | None) -> Settings:
    """The latency tier's variables at an MTP draft depth (None: no speculation)."""
    cfg = group_cfg("v100_32gb").replace(**LATENCY41)
    if depth:
        cfg = cfg.replace(server_spec_mtp=True, server_spec_draft_max=depth)
    return cfg


def plan41() -> dict:
    """Issue 41 on the shipped build (FORCE_MMQ, as Volta takes it): the throughput tier as shipped
    (v100_32gb, the plain file) against the latency tier (2 slots, the MTP-carrying file) without
    speculation and at draft depths 1-3. Two MTP files bracket the acceptance: `acc`, where the
    trunk and the MTP head agree (every draft accepted, the best case), and `rej`, all weights zero
    (every draft rejected, the worst); a depth pays above the acceptance where the two meet the
    no-speculation rate. Each config: load, a warm-up, `runs` rounds at each stream count
    (distinct 512-token prompts, 128 tokens, greedy), GPU and host memory sampled."""
    def item(name, cfg, model, streams):
        return {"name": name, "model": model, "streams": streams,
                "args": server_args(cfg, "MODEL", port=PORT, api_key_file=None)}
    configs = [item("thr-ship", group_cfg("v100_32gb"), "q4ks.gguf", [1, 2, 4]),
               item("lat-d0", latency41(None), "q4ks-mtp-acc.gguf", [1, 2, 4])]
    configs += [item(f"lat-d{d}", latency41(d), "q4ks-mtp-acc.gguf", [1, 2, 4]) for d in DEPTHS41]
    configs += [item("lat-d0-rej", latency41(None), "q4ks-mtp-rej.gguf", [1])]
    configs += [item(f"lat-d{d}-rej", latency41(d), "q4ks-mtp-rej.gguf", [1]) for d in DEPTHS41]
    return {"tier41": {"build": "mmq", "runs": 3, "prompt": 512, "tokens": 128, "configs": configs}}



def latency_cfg(**over) -> Settings:
    """The latency tier's variables as a host of it gets them: v100_32gb's, then group_vars/latency.yml's (the
    group listed after its GPU group, so its values win; docs/gateway.md), changes in `over`."""
    import yaml

    tier = yaml.safe_load((REPO / "group_vars/latency.yml").read_text())
    return group_cfg("v100_32gb").replace(**{**tier, **over})


def plan41v() -> dict:
    """The latency tier's validation config: the tier as shipped (group_vars/latency.yml: 2 slots of 32K, MTP at
    its depth), on the file whose drafts are all accepted (tier41's lat-d<depth>, the peak its
    vram_cuda_overhead_mib 640 was fitted on): GPU and host memory after load and at their peaks over tier41's
    rounds. It takes tier41's key: the phase is tier41's."""
    cfg = latency_cfg()
    depth = cfg.server.spec_draft_max
    return {"tier41": {"build": "mmq", "runs": 3, "prompt": 512, "tokens": 128, "configs": [
        {"name": f"lat-d{depth}", "model": "q4ks-mtp-acc.gguf", "streams": [1, 2, 4],
         "args": server_args(cfg, "MODEL", port=PORT, api_key_file=None)}]}}


# Issue 49's validation run (run 5), prepared 2026-12-05, not yet run: the device session's phases, in this order.
PHASES49V = "tier41:mmq,host49:mmq"
CMS0 = "fill-np16-ck32-cms0"


def plan49v() -> dict:
    """Issue 49's validation run ("run 5", bench/records/proof49/run5 once made): the constants fitted on run3
    and run4 (fit49, FIT49_RUNS) and the latency tier's vram_cuda_overhead_mib (fitted on tier41) on a run
    they were not fitted on. Phases PHASES49V: the tier first (one config, ~25 s after ~23 s writing its MTP
    files: cheap, and its only second run), then host49 in the order of what the issue needs, each config
    saved as it ends so a run cut short keeps the first ones:
      fill-np16-ck32-cms0   the worst case, every checkpoint held: 16 x 32 = 512 (--checkpoint-min-step 0:
                            llama-server then evicts only exact duplicates and the oldest at 32; at its
                            default 8192 a slot stays at 31, the 496 of runs 3 and 4). Planned as 16 x 32.
      chat-np16-ck{0,4,8,32}  within 5 % and never under at 0, 4, 8 and 32 checkpoints, the shipped 16 slots
      chat-np{4,24,8}-ck0   the process term across slots (8: fitted on run3, not run in run4), one
                            repetition each: a validation point per slot count (runs 3-4 hold three each)
    plan49's fill at the default spacing (496 held) is left out: runs 3 and 4 hold six repetitions of it, and the
    512 fill above is its worst case. Device time (estimate49v on runs 3 and 4, which gives run4's own 1,007 s of
    phase as 1,008): about 960 s of phase (16 minutes) after the build (255-366 s), so that the machine's start,
    the build and the phases fit a session's 30 device minutes with room; the tier and the four 16-slot chats
    with the 512 fill done by 857 s. validate49 reads its results."""
    configs = [host49_item(CMS0, 16, 32, FILL38, cms=0)]
    configs += [host49_item(f"chat-np16-ck{n}", 16, n, CHAT38) for n in (0, 4, 8, 32)]
    configs += [host49_item(f"chat-np{n}-ck0", n, 0, CHAT38, runs=1) for n in (4, 24, 8)]
    return {"host49": {"build": "mmq", "runs": 3, "configs": configs}, **plan41v()}


# issue 51 items 2 and 3: the shipped flags on a busy fleet's traffic (bench/traffic), v100_32gb's argv
SEED_STAGE3 = ("-m MODEL -ngl 99 -c 8192 -ctk q8_0 -ctv q8_0 -np 4 -t 8 --host 127.0.0.1".split()
               + ["--port", str(PORT)])                       # the seed's stage-3 flags (run_plan's `seed`)
TURN51_S = 6.0            # the schedules' turn_s: one rate for every config (bench/traffic/estimate.py)
SESSION51_S = 22 * 60     # a part's phase time: 30 device minutes less ~90 s start, 366 s build, margin
PER_SLOT51 = (1, 2, 4)    # conversations open at once: 16, 32, 64 on v100_32gb's 16 slots
THROUGHPUT51 = ((128, 128), (160, 256))                       # item 3: prompt / answer tokens, 16 clients
# item 3's rates for the estimate: 16 clients, wall tok/s (bench/records/proof19b: 270 shipped, 114 the seed)
ROUNDS51_TPS = {"thr-ship": 270.0, "thr-seed": 114.0, "thr-ship-ck0": 366.0, "thr-ship-ub1024": 273.0,
                "thr-ship-again": 320.0, "thr-seed-again": 130.0, "thr-ship-heap": 360.0, "thr-seed-51c": 130.0,
                "thr-ship-51c": 360.0}  # (session 2: 294-402, 123-140)


def traffic51_params(per_slot: float) -> dict:
    """The schedule of one config (bench.traffic.model.Params as a dict): the model's defaults but for
    what the device's half hour cannot afford. Its openings (median 800 words) and follow-ups (120),
    arrivals (Poisson at 80 % of the slots) and population (per_slot x 16) are the model's; a turn's
    thought and answer are cut to medians of 16 and 32 tokens (16-64 and 8-128 clipped) and a
    conversation to 2 + Poisson(1) turns (at most 6; mean 2.99), and a run holds 1 x the population
    (16, 32, 64): at the model's ~500 tokens a turn and ~20 tok/s a stream (a thinking budget turns
    backend sampling off, bench/records/proof32) one 4x replay alone would take ~15 minutes."""
    from dataclasses import asdict

    from bench.traffic.model import Lognormal, Params
    p = Params(seed=51, slots=16, per_slot=per_slot, busy=0.8, turn_s=TURN51_S, conversations=round(16 * per_slot),
               turns_extra=1.0, max_turns=6, thinking=Lognormal(16, 0.5, 4, 64), answer=Lognormal(32, 0.5, 8, 128),
               ctx_per_slot=131072 // 16)
    return asdict(p)


def v32_traffic(ckpt: int, cache_mib: int, ref: str = RECORDS_REF, **over) -> Settings:
    """v100_32gb as a host of it gets it at llama.cpp `ref`, with its checkpoints and host prompt cache set
    (and `over`)."""
    return group_cfg("v100_32gb", ref).replace(server_ctx_checkpoints=ckpt, server_cache_ram=cache_mib, **over)


def qwen_header():
    """The shape-exact Qwen3.6-27B Q4_K_S's GGUF header (tests/fixtures/gguf), read anew: a Header is mutable."""
    from voltafleet.models.gguf_header import from_json

    return from_json(json.loads((REPO / "tests/fixtures/gguf/qwen35-27b-q4ks.json").read_text()))


@functools.cache
def qwen_shape():
    """qwen_header's ModelShape (frozen), read once: this module plans many configs' hosts."""
    from voltafleet.planning import vram

    return vram.ModelShape.from_header(qwen_header())


def host_plan_of(cfg: Settings):
    """voltafleet.planning.hostmem's plan of one instance of cfg (the shape-exact Qwen3.6-27B Q4_K_S)."""
    from voltafleet.planning import hostmem

    return hostmem.plan(cfg.replace(voltafleet_backend="cuda"), qwen_shape(), 1)


def plan_figures(hp) -> dict:
    """A host plan's figures as issue 51's configs record them, MiB: the instance's total, what the kernel cannot
    reclaim (held), and its unit's MemoryMax (rounded up)."""
    return {"planned_mib": round(hp.instance.total / 2**20, 1), "planned_held_mib": round(hp.instance.held / 2**20, 1),
            "memory_max_mib": -(-hp.memory_max // 2**20)}


def traffic51_config(part: str, per_slot: int, ckpt: int, cache_gib: int, runs: int = 3,
                     ref: str = RECORDS_REF, idle_slots: bool = True, env: dict | None = None, suffix: str = "") -> dict:
    """One traffic config: its exact argv (group_vars rendered), its schedule, its host-memory plan at llama.cpp
    `ref` (the server runs in a cgroup whose memory.max is the unit's MemoryMax) and its estimated device
    seconds. idle_slots False adds --no-cache-idle-slots (name suffix -noidle): with a host cache, llama-server
    otherwise saves every idle slot to it each time a request starts (tools/server/server-context.cpp). `env`: the
    server's environment beside the phase's (HEAP51), `suffix` added to the name (a config run again: -again)."""
    from bench.traffic.estimate import Server, config_seconds
    from bench.traffic.model import params_from

    cfg = v32_traffic(ckpt, cache_gib * 1024, ref, server_malloc_heap=env == HEAP51,  # planned as it runs
                      **({} if idle_slots else {"server_extra_flags": [NO_IDLE_SAVES]}))
    hp = host_plan_of(cfg)
    traffic = traffic51_params(per_slot)
    est = config_seconds(params_from(traffic), Server(cfg.server.parallel, ckpt, cache_gib * 1024), runs)
    return {"name": f"{per_slot}x-ck{ckpt}-cr{cache_gib}" + ("" if idle_slots else "-noidle") + suffix, "part": part,
            **({"env": env} if env else {}),
            "kind": "traffic", "model": "q4ks-vary.gguf", "per_slot": per_slot, "ckpt": ckpt,
            "cache_ram_mib": cache_gib * 1024, "idle_slots": idle_slots, "slots": cfg.server.parallel,
            "args": server_args(cfg, "MODEL", port=PORT, api_key_file=None), "traffic": traffic, "calibrate": False,
            **plan_figures(hp), "estimate_s": round(est)}


def throughput51_config(part: str, name: str, args: list, cfg: Settings | None, runs: int = 3,
                        env: dict | None = None) -> dict:
    """Item 3: one server, `runs` rounds of 16 clients at once at each prompt/answer shape (distinct token
    prompts, greedy, as proof19b measured the 2.38x); the zero-weight file every earlier ratio used."""
    tokens = sum(16 * n for _, n in THROUGHPUT51)
    est = 10 + 5 + runs * tokens / ROUNDS51_TPS[name]
    item = {"name": name, "part": part, "kind": "rounds", "model": "q4ks.gguf", "args": args, "streams": 16,
            "shapes": [list(x) for x in THROUGHPUT51], "estimate_s": round(est), **({"env": env} if env else {})}
    if cfg is not None:
        hp = host_plan_of(cfg.replace(server_malloc_heap=env == HEAP51))  # planned as it runs
        item.update(plan_figures(hp))
    return item


# Items 2 and 3 in the order the sessions run them; the phase skips what a session's results already hold.
# 51a, session 1 (bench/records/proof51/session1, an H100): the shipped argv at 2x (32 conversations) against an
# 8 GiB host cache, both whole (395 and 650 s of device time, estimated 335 and 364), and 2x without checkpoints
# once of 3 when the device's half hour ran out.
# 51b, session 2: item 3 in one run, 2x without checkpoints again (a partial record runs from its start), then
# what session 1 showed matters at 2x (bench/traffic/README.md): the 8 GiB cache without its save of every idle
# slot at each request, 8 checkpoints; then 1x shipped.
# 51c, later: 4x (its conversations live 5 x their busy time; ~900-1,000 s a config, so both sides of a 4x pair
# need sessions of their own), item 3's -ub 1024 beside the seed, then the cells of 0/4/8 checkpoints x
# 0/4/8/16 GiB x 1x/2x/4x that the records do not prune (PRUNED51).
NO_IDLE_SAVES = "--no-cache-idle-slots"
HEAP51 = dict(MALLOC_HEAP)  # ckpt_copy's "heap"; server_malloc_heap ships it (the env file)
PLAN51A = ((2, 4, 0), (2, 4, 8))
PLAN51B_TRAFFIC = ((2, 0, 0),)
PLAN51B_AFTER = ((2, 4, 8, False),)
PLAN51D = ((2, 4, 8, False), (2, 8, 0, True), (1, 4, 0, True))  # with HEAP51, after the shipped config again
PLAN51C_HEAD = ((4, 4, 0),)  # session 6 ran it whole
PLAN51C_NEXT = ((4, 4, 8),)  # session 6 cut the cache short: session 7 ran it again from its start
# What is left of 0/4/8 checkpoints x 0/4/8/16 GiB x 1x/2x/4x once the cells below are pruned (PRUNED51), after item 3:
# session 8 ran 2x-ck0-cr8 (the no-checkpoint prune's reason, on the GPU), the 16 and 4 GiB caches at 2x and 2 of 1x
# without checkpoints' 3 schedules; then the second run of the heap's two shares (fitted on sessions 5-8): 1x with 8
# checkpoints and 4x with the 16 GiB cache (the cache's), and 1x without checkpoints again (session 9). At 1x 8
# checkpoints were not all live (no more prompt cached than 4): the checkpoints' share has its second run in 1x with 4
# again (-again, the config it was fitted on); then 4x with the 4 GiB cache, without checkpoints and with 8 (about
# 950 s each: a session's phase apiece). The shipped config and the 16 GiB cache at 2x paired in one run
# (PLAN51C_PAIR, -pair: sessions 4 and 8 compared them across runs; about 695 s, a session with about 1,115 s of
# device time) come before them, the cheapest left first (session 11 ran them). PLAN51C_LAST: -again (session 10's
# device came after ten failed starts, with room for it alone: TRAFFIC51_ONLY) and 4x's three cells (session 12 on:
# session 12 ran the 4 GiB cache, which kept 17.3 % of itself beyond it, over hostmem_cache_heap_share's 0.16; the
# cache's floor, hostmem_cache_heap_floor_mib, fitted on that run, has its second run in 4x with the 4 GiB cache again,
# -again). A fourth element is a suffix after -heap.
PLAN51C_REST = ((2, 0, 8), (2, 4, 16), (2, 4, 4), (1, 8, 0), (4, 4, 16), (1, 0, 0))
PLAN51C_PAIR = ((2, 4, 0, "-pair"), (2, 4, 16, "-pair"))
PLAN51C_LAST = ((1, 4, 0, "-again"), (4, 4, 4), (4, 0, 0), (4, 8, 0), (4, 4, 4, "-again"))
# Cells not run, each with the records' reason (tests/unit/test_records51f.py checks each against them)
PRUNED51 = {
    **{(1, c, gib): "1x: no follow-up lost its slot (1x-ck4-cr0-heap, 0 of 105), so a host cache of slots that "
       "lost their conversation holds nothing a follow-up uses" for c in (0, 4, 8) for gib in (4, 8, 16)},
    **{(n, 8, gib): "8 checkpoints with a cache: at 2x 8 made as many follow-ups reprocess their whole prompt as 4 "
       "(2x-ck8-cr0-heap: 36, 34, 25 a schedule), and each follow-up that found a cached prefix under both found the "
       "same one: 8 held nothing a follow-up used that 4 did not (assumed to hold at 4x, where slots are lost sooner)"
       for n in (2, 4) for gib in (4, 8, 16)},
    **{(n, 0, gib): "no checkpoints with a cache (provisional until 2x-ck0-cr8 runs): without them every follow-up "
       "reprocessed its whole prompt (2x-ck0-cr0, 190 of 190), as a slot's state past the dropped reasoning cannot "
       "be rolled back, and a cached state is assumed to be no different" for n, gib in ((2, 4), (2, 16), (4, 4), (4, 8), (4, 16))},
}


def plan51a(ref: str = RECORDS_REF) -> list[dict]:
    """Session 1 (51a), as it ran: the shipped argv at 2x against the 8 GiB host cache, estimated device
    seconds each (the run took 395 and 650):

        2x-ck4-cr0 (shipped)  335 s    2x-ck4-cr8  364 s    in all 699 s

    The estimate (bench/traffic/estimate.py) plays each of the config's 3 schedules on a simulated server with
    the H200 records' rates: prefill 2,250 tok/s (16 chat prompts at once, proof38 run2), 12.4-51.3 ms a
    decode step at 1-16 streams with a thinking budget (proof32 run1), 0.1 s a checkpoint (proof38 run2's
    openings), 0.2 s a slot saved to the host cache (issue 19); 10 s start and stop, 5 s warm-up a config. Its
    wall is the schedule's (arrivals over 1 x the population at TURN51_S, Little's law's think times) and the
    queue when the server falls behind (a follow-up that lost its slot reprocesses its history). It missed
    the host cache's save of every idle slot at each request (bench/traffic/README.md)."""
    return [traffic51_config("51a", *c, ref=ref) for c in PLAN51A]


def plan51b(ref: str = RECORDS_REF) -> list[dict]:
    """Session 2 (51b): item 3 first (it has no record yet, and session 2's device started late: v100_32gb as
    shipped against the seed's stage-3 flags in one run, 16 clients, 128/128 and 160/256, median of 3, ~83 and
    ~177 s, and without checkpoints, proof19b: 366 vs 114 tok/s, ~65 s), 2x without checkpoints (~324 s;
    session 1 ran one of its 3 schedules in 109 s), then the 8 GiB cache
    without the idle slots' saves, 8 checkpoints, and 1x shipped: more than a session's phase, so the last
    ones may fall to the next session."""
    g = group_cfg("v100_32gb", ref)
    ck0 = g.replace(server_ctx_checkpoints=0)
    items = [throughput51_config("51b", "thr-ship", render("v100_32gb"), g),
             throughput51_config("51b", "thr-seed", SEED_STAGE3, None),
             throughput51_config("51b", "thr-ship-ck0", server_args(ck0, "MODEL", port=PORT, api_key_file=None), ck0)]
    items += [traffic51_config("51b", *c, ref=ref) for c in PLAN51B_TRAFFIC]
    items += heap51(ref) + heap51b(ref)
    return items + [traffic51_config("51b", n, c, gib, ref=ref, idle_slots=idle) for n, c, gib, idle in PLAN51B_AFTER]


def heap51d(ref: str = RECORDS_REF) -> list[dict]:
    """Session 5's first configs (51d). Session 4 (bench/records/proof51/session4, an H200) confirmed HEAP51 at 2x
    beside the shipped argv in one run, and both V100 groups ship it (server_malloc_heap). So what is left of item 2
    runs with it, beside the shipped config again in the same run (2x-ck4-cr0-ship, HEAP51): first the 8 GiB cache
    without its idle-slot saves (session 4 without HEAP51: the most follow-up prompt cached, 0.66, and 21-38K
    prompt tokens spared a replay, but its cache updates, 23-32 s a replay, held every slot), then 8 checkpoints and 1x.
    About 370 s each at 2x."""
    head = [traffic51_config("51d", 2, 4, 0, ref=ref, env=HEAP51, suffix="-ship")]
    return head + [traffic51_config("51d", n, c, gib, ref=ref, idle_slots=idle, env=HEAP51, suffix="-heap")
                   for n, c, gib, idle in PLAN51D]


def heap51(ref: str = RECORDS_REF) -> list[dict]:
    """Session 3's first configs (~966 s): glibc's malloc with no mmap'd chunks and no trimming (HEAP51), so
    a checkpoint's new 149.6 MiB vector reuses resident heap pages instead of faulting in fresh ones (this
    machine's CPU backend: 22.2 ms a copy against 129.25, bench/records/ckpt-copy/run2.json). Each side of
    each ratio in the same run: item 3's shipped argv and the seed again beside it with HEAP51, then the
    shipped argv at 2x again beside it with HEAP51 (paired by schedule)."""
    g = group_cfg("v100_32gb", ref)
    return [throughput51_config("51b", "thr-ship-again", render("v100_32gb"), g),
            throughput51_config("51b", "thr-seed-again", SEED_STAGE3, None),
            throughput51_config("51b", "thr-ship-heap", render("v100_32gb"), g, env=HEAP51),
            traffic51_config("51b", 2, 4, 0, ref=ref, suffix="-again"),
            traffic51_config("51b", 2, 4, 0, ref=ref, env=HEAP51, suffix="-heap")]


def heap51b(ref: str = RECORDS_REF) -> list[dict]:
    """Session 4's first config: session 3 (bench/records/proof51/session3, an H100) ran heap51 whole but for
    2x-ck4-cr0-heap's schedules 2 and 3, and a partial record runs again from its start. So that its pair's two
    sides share one run again, the shipped argv at 2x runs a third time beside it (~670 s the pair)."""
    return [traffic51_config("51b", 2, 4, 0, ref=ref, suffix="-base4")]


def plan51c(ref: str = RECORDS_REF) -> list[dict]:
    """Later sessions (51c), with HEAP51 as both V100 groups now ship it (name suffix -heap): 4x shipped (session 6),
    the 8 GiB cache without its idle-slot saves at 4x again from its start (session 6 ran one of its schedules),
    item 3's -ub 1024 beside the seed and the shipped argv again (one run holds each ratio's two sides) (session 7),
    2x without checkpoints with the cache (the check of a prune's reason), the cache's 16 and 4 GiB at 2x (the heap
    share's second run), then the other cells of 0/4/8 checkpoints x 0/4/8/16 GiB x 1x/2x/4x the records do not
    prune (PRUNED51): 1x without checkpoints, 8 checkpoints at 1x, the cache's 16 GiB at 4x; the shipped config and
    the 16 GiB cache at 2x in one run (-pair), 1x shipped again (-again: the checkpoints' heap share's second run),
    last 4x with the 4 GiB cache, without checkpoints and with 8. Every cache runs without its idle-slot saves
    (-noidle): with them the 8 GiB cache ran at 21.4 tok/s against the shipped 36.0 at 2x (session 1), and the cache
    without them is the one contender left (sessions 5-6: bench/RESULTS.md). About 950 s a 4x config, 350 s a 2x
    one, 130 s a 1x one."""
    g = group_cfg("v100_32gb", ref)
    ub = g.replace(server_ubatch=1024)

    def cell(n, c, gib, extra=""):
        return traffic51_config("51c", n, c, gib, ref=ref, idle_slots=gib == 0, env=HEAP51, suffix="-heap" + extra)
    return ([cell(*c) for c in PLAN51C_HEAD + PLAN51C_NEXT]
            + [throughput51_config("51c", "thr-seed-51c", SEED_STAGE3, None),
               throughput51_config("51c", "thr-ship-ub1024", server_args(ub, "MODEL", port=PORT, api_key_file=None),
                                   ub, env=HEAP51),
               throughput51_config("51c", "thr-ship-51c", render("v100_32gb"), g, env=HEAP51)]
            + [cell(*c) for c in PLAN51C_REST + PLAN51C_PAIR + PLAN51C_LAST])


def plan51(ref: str = RECORDS_REF) -> dict:
    """Issue 51 items 2 and 3 as the `traffic51:mmq` phase runs them (bench/gpu/proof/traffic.py): the
    shipped build (FORCE_MMQ, Volta's kernel choice), every config in the order of plan51a, plan51b, heap51d
    and plan51c, 3 repetitions each. The phase saves each config's record as it ends and skips a config whose
    complete record RES/results.json already holds (same name and argv): a later call, or a later session
    given the earlier results.json in RES, goes on where the last one stopped (bench/traffic/README.md).
    `ref`: the llama.cpp commit the run builds (the host plans follow its compute graph): pin_proof.pack51
    packs b11434, the shipped pin."""
    return {"traffic51": {"build": "mmq", "runs": 3,
                          "configs": plan51a(ref) + plan51b(ref) + heap51d(ref) + plan51c(ref)}}


THINK_FIGURES = ("ttfr_ms", "answer_ms", "n_reasoning", "n_content", "think_tps", "answer_tps", "decode_tps")


def _median(values):
    import statistics
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


def think_round(recs: list) -> dict:
    """One round (1 or 16 requests at once): the median request's figures (bench.gpu.proof.thinking.think_figures,
    and the server's decode tok/s), and the round's aggregate tok/s: every streamed token over the
    time from the first request sent to the last token."""
    out = {f: _median([q.get(f) for q in recs]) for f in THINK_FIGURES}
    ends = [q["t_start"] + max(q["reasoning_ms"][-1:] + q["content_ms"][-1:]) / 1000 for q in recs]
    tokens = sum(len(q["reasoning_ms"]) + len(q["content_ms"]) for q in recs)
    out["agg_tps"] = tokens / (max(ends) - min(q["t_start"] for q in recs))
    return out


def think_table(results: dict) -> dict:
    """{(mode, clients): {figure: (median, min, max) over the repetitions}} of issue 32's record."""
    (t,) = results["think32"]
    rows: dict = {}
    for rnd in t["rounds"]:
        rows.setdefault((rnd["mode"], rnd["streams"]), []).append(think_round(rnd["recs"]))

    def mmm(values):
        v = [x for x in values if x is not None]
        return (_median(v), min(v), max(v)) if v else (None, None, None)
    return {key: {f: mmm([x[f] for x in reps]) for f in reps[0]} for key, reps in rows.items()}


def think_report(results: dict) -> str:
    """The markdown table of bench/RESULTS.md's issue 32 section (medians of the 3 repetitions)."""
    label = {"off": "thinking off (`enable_thinking: false`)", "b0": "budget 0", "b256": "budget 256",
             "b1024": "budget 1024", "unbounded": "unbounded (-1)"}

    def f(v, d=0):
        return "-" if v is None else f"{v:,.{d}f}"
    lines = ["| request | clients | first thought token ms | answer starts ms | thought / answer tokens | "
             "tok/s thinking | tok/s answering | server decode tok/s | aggregate tok/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    tab = think_table(results)
    for k in sorted({k for _, k in tab}):
        for mode in label:
            x = {n: v[0] for n, v in tab[(mode, k)].items()}
            lines.append(f"| {label[mode]} | {k} | {f(x['ttfr_ms'])} | {f(x['answer_ms'])} | "
                         f"{f(x['n_reasoning'])} / {f(x['n_content'])} | {f(x['think_tps'], 1)} | "
                         f"{f(x['answer_tps'], 1)} | {f(x['decode_tps'], 1)} | {f(x['agg_tps'])} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- pack


def host38_rep(rep: dict) -> dict:
    """One repetition's figures: completion tokens over its wall time, TTFT p50 of the first turn and
    of the follow-ups, the follow-ups' cached share (p50), the host-memory peak and the checkpoints held."""
    recs = [q for t in rep["turns"] for q in t["recs"]]
    good = [q for q in recs if "error" not in q]
    follow = [q for q in good if q["followup"]]
    first = [q for q in good if not q["followup"]]
    return {"tps": round(sum(q["tokens"] for q in good) / rep["seconds"], 1),
            "ttft_first_ms": _median([q["ttft_ms"] for q in first]),
            "ttft_followup_ms": _median([q["ttft_ms"] for q in follow]),
            "cached_share": _median([q["cached_share"] for q in follow if q.get("cached_share") is not None]),
            "peak_rss_mib": rep["peak"].get("VmRSS"), "peak_anon_mib": rep["peak"].get("RssAnon"),
            "held": rep["ckpt"]["held"], "errors": len(recs) - len(good)}


def host38_table(results: dict) -> list[dict]:
    """Every host38 config: the medians of its repetitions' figures (and the largest peak)."""
    rows = []
    for r in results.get("host38", []):
        reps = [host38_rep(rep) for rep in r["reps"]]
        row = {k: r[k] for k in ("name", "kind", "slots", "ckpt", "cms")}
        row.update({k: _median([x[k] for x in reps]) for k in ("tps", "ttft_first_ms", "ttft_followup_ms",
                                                               "cached_share", "peak_rss_mib", "held")})
        row.update(reps=len(reps), errors=sum(x["errors"] for x in reps),
                   peak_rss_max_mib=max((x["peak_rss_mib"] or 0) for x in reps) if reps else None,
                   load_rss_mib=(r.get("mem_load") or {}).get("VmRSS"),
                   ckpt_mib=sorted({m for rep in r["reps"] for m in rep["ckpt"]["size_mib"]}))
        rows.append(row)
    return rows


def f(v, d=0) -> str:
    """A figure of a report's table: thousands separated, d decimals; "-" when there is none."""
    return "-" if v is None else f"{v:,.{d}f}"


def host38_report(results: dict) -> str:
    lines = ["| config | held checkpoints | after load MiB | peak RSS MiB (median / max) | follow-up TTFT p50 ms | "
             "first-turn TTFT p50 ms | cached share | tok/s | errors |", "|---|---|---|---|---|---|---|---|---|"]
    for r in host38_table(results):
        lines.append(f"| {r['name']} | {f(r['held'])} | {f(r['load_rss_mib'])} | {f(r['peak_rss_mib'])} / "
                     f"{f(r['peak_rss_max_mib'])} | {f(r['ttft_followup_ms'])} | {f(r['ttft_first_ms'])} | "
                     f"{f(r['cached_share'], 2)} | {f(r['tps'], 1)} | {r['errors']} |")
    return "\n".join(lines)


def host49_reps(r: dict) -> list[dict]:
    """One host49 config's repetitions against the plan (today's group_vars) at the checkpoints each one held, each
    of the size the server logged: planned and measured anonymous memory, cgroup charge less page cache, VmRSS."""
    inst = host_plan(r["slots"], r["ckpt"], r.get("cms")).instance
    reps = []
    for rep in r["reps"]:
        size = max(rep["ckpt"]["size_mib"] or [inst.checkpoint_bytes / 2**20])
        # the plan's instance at the checkpoints this repetition held, each of the logged size
        at = replace(inst, slots=1, checkpoints_per_slot=rep["ckpt"]["held"], checkpoint_bytes=round(size * 2**20))
        peak, cg = rep["peak"], rep["peak"].get("cgroup") or {}
        reps.append({"held": rep["ckpt"]["held"], "plan_anon": at.anonymous / 2**20, "plan_held": at.held / 2**20,
                     "plan_total": at.total / 2**20,
                     "anon": peak["RssAnon"] + peak["RssShmem"], "unreclaimable": cg.get("cg_unreclaimable"),
                     "rss": peak.get("VmRSS"), "charged": cg.get("cg_current"),
                     "errors": sum("error" in q for t in rep["turns"] for q in t["recs"])})
    return reps


def host49_table(results: dict) -> list[dict]:
    """Issue 49: each config's repetitions against the plan at the checkpoints each one held
    (voltafleet.planning.hostmem: the process and its slots, the host buffers, held x the logged size),
    in the three quantities the plan gives:
        anonymous   the process's anonymous and shared memory (VmRSS's RssAnon + RssShmem) against the
                    plan's anonymous terms
        held        the cgroup's charge less its page cache (what the kernel cannot reclaim at
                    memory.max) against the plan's held (anonymous and its page tables)
        total       VmRSS against the plan's total (held, the program's and the mapped model's file
                    pages): the model's token_embd rows are read one a token, so VmRSS holds the few
                    that the words touched
    the medians of 3, the largest ratio, the cgroup's events and whether the kernel ever killed it."""
    rows = []
    for r in results.get("host49", []):
        reps = host49_reps(r)

        def med(k):
            return _median([x[k] for x in reps if x[k] is not None])

        def worst(k, plan):
            got = [x[k] / x[plan] for x in reps if x[k] is not None]
            return round(max(got), 4) if got else None
        rows.append({"name": r["name"], "slots": r["slots"], "ckpt": r["ckpt"], "reps": len(reps),
                     "memory_max_mib": r.get("memory_max_mib"), "held": med("held"),
                     "plan_anon_mib": med("plan_anon"), "plan_held_mib": med("plan_held"),
                     "plan_total_mib": med("plan_total"), "anon_mib": med("anon"),
                     "unreclaimable_mib": med("unreclaimable"), "rss_mib": med("rss"), "charged_mib": med("charged"),
                     "anon_over_plan_max": worst("anon", "plan_anon"),
                     "unreclaimable_over_plan_max": worst("unreclaimable", "plan_held"),
                     "rss_over_total_max": worst("rss", "plan_total"),
                     "load_rss_mib": (r.get("mem_load") or {}).get("VmRSS"), "errors": sum(x["errors"] for x in reps),
                     "killed": not r.get("alive_at_end", True),
                     "events": (r.get("cgroup_end") or {}).get("cg_events"), "cgroup_error": r.get("cgroup_error")})
    return rows


def host49_report(results: dict) -> str:
    lines = ["| config | held checkpoints | anonymous MiB: planned / measured | held MiB: planned / cgroup | "
             "worst / planned (anonymous, held) | VmRSS MiB / total planned | MemoryMax MiB | killed | "
             "events max / oom_kill |", "|---|---|---|---|---|---|---|---|---|"]
    for r in host49_table(results):
        ev = r["events"] or {}
        lines.append(f"| {r['name']} | {f(r['held'])} | {f(r['plan_anon_mib'])} / {f(r['anon_mib'])} | "
                     f"{f(r['plan_held_mib'])} / {f(r['unreclaimable_mib'])} | {f(r['anon_over_plan_max'], 3)}, "
                     f"{f(r['unreclaimable_over_plan_max'], 3)} | {f(r['rss_mib'])} / {f(r['plan_total_mib'])} | "
                     f"{f(r['memory_max_mib'])} | {'yes' if r['killed'] else 'no'} | "
                     f"{ev.get('max', '-')} / {ev.get('oom_kill', '-')} |")
    return "\n".join(lines)



CONFIG_OVERHEAD49_S = 4   # a host49 config beyond its load and repetitions (2 s settle, warm-up, stop): run4's 1,007.3 s
#                           of phase less its loads and repetitions (980.0 s), over its 7 configs
TIER41V_S = 25            # tier41's lat-d2: load, warm-up, 3 x (1, 2, 4 streams) (bench/records/tier41/progress.txt: 98-123 s)
MTP_FILES_S = 23          # gpu_proof.sh writing both MTP files before the phases (tier41 progress: 09:24:44-09:25:07)


def estimate49v(runs: list[dict], plan: dict | None = None) -> dict:
    """Seconds of phase plan (plan49v()) takes, from earlier host49 runs' results: each config's load and the mean of
    its repetitions at the same kind, slots and checkpoints (the slowest run's; the spacing does not change a
    fill's turns), times its repetitions, CONFIG_OVERHEAD49_S each; its tier41 configs TIER41V_S each, and
    MTP_FILES_S before them."""
    plan = plan or plan49v()
    seen: dict = {}
    for results in runs:
        for r in results.get("host49", []):
            if r["reps"]:
                key = (r["kind"], r["slots"], r["ckpt"])
                rep = sum(x["seconds"] for x in r["reps"]) / len(r["reps"])
                old = seen.get(key, (0, 0))
                seen[key] = (max(old[0], rep), max(old[1], r["load_s"]))
    h = plan["host49"]
    configs = {}
    for c in h["configs"]:
        rep, load = seen[(c["kind"], c["slots"], c["ckpt"])]
        configs[c["name"]] = round(load + rep * c.get("runs", h["runs"]) + CONFIG_OVERHEAD49_S, 1)
    tier = len(plan.get("tier41", {}).get("configs", [])) * TIER41V_S + (MTP_FILES_S if "tier41" in plan else 0)
    host = round(sum(configs.values()), 1)
    return {"configs": configs, "host49_s": host, "tier41_s": tier, "phase_s": round(host + tier, 1)}

WITHIN49 = 0.05   # issue 49: measured within 5 % of the plan (measured / planned >= 0.95) and never over it
SHIPPED_SLOTS49 = 16


def _span(reps: list[dict], got: str, plan: str) -> dict:
    """Planned and measured (medians of the repetitions) and measured / planned at its lowest and highest."""
    ratios = [x[got] / x[plan] for x in reps if x.get(got) is not None and x.get(plan)]
    return {"planned_mib": _median([x[plan] for x in reps]), "measured_mib": _median([x[got] for x in reps]),
            "low": round(min(ratios), 4) if ratios else None, "high": round(max(ratios), 4) if ratios else None}


def _verdict(span: dict, within: bool) -> tuple[bool, str]:
    """(passed, words): never under in every repetition (measured / planned <= 1) and, where `within` is asked,
    within WITHIN49 in every repetition (>= 0.95)."""
    if span["high"] is None:
        return False, "not measured"
    if span["high"] > 1:
        return False, f"UNDER by {100 * (span['high'] - 1):.1f} %"
    if span["low"] >= 1 - WITHIN49:
        return True, "within 5 %, never under"
    return not within, f"never under, {100 * (1 / span['low'] - 1):.1f} % over"


def _tier_depth(args: list[str]) -> int:
    return int(args[args.index("--spec-draft-n-max") + 1]) if "--spec-draft-n-max" in args else 0


def tier41_cfg(depth: int) -> Settings:
    """The latency tier as tier41 ran it at MTP draft depth `depth` (0: no MTP), planned as it ran: a CUDA host,
    glibc's malloc as it was (server_malloc_heap off: tier41 ran without HEAP51)."""
    return latency_cfg(voltafleet_backend="cuda", model_url="MODEL", server_spec_mtp=bool(depth),
                       server_malloc_heap=False, **({"server_spec_draft_max": depth} if depth else {}))


def validate49_tier(r: dict) -> dict:
    """A tier41 record of the latency tier (lat-d*) against the plan of group_vars/latency.yml at the depth its argv
    ran: VRAM (voltafleet.planning.vram.decide at V100-32GB's 32,768 MiB, Volta's arch, the MTP-carrying header:
    as vram_cuda_overhead_mib 640 was fitted, tests/unit/test_tier41.py) against the GPU peak over its rounds,
    within 5 % and never under; host memory (hostmem's plan) never under the peak's anonymous memory and VmRSS."""
    from voltafleet.models.gguf_header import from_json
    from voltafleet.planning import hostmem, vram

    header = from_json(json.loads((REPO / "tests/fixtures/gguf/qwen35-27b-q4ks-mtp.json").read_text()))
    depth = _tier_depth(r["args"])
    cfg = tier41_cfg(depth)
    planned = vram.decide(cfg, 32768, header, archs=[70]).plan.needed / 2**20
    inst = hostmem.plan(cfg, vram.ModelShape.from_header(header), 1).instance
    peak, gpu = r.get("host_peak") or {}, r.get("gpu_peak_mib")
    vspan = {"planned_mib": round(planned, 1), "measured_mib": gpu, "low": gpu and round(gpu / planned, 4),
             "high": gpu and round(gpu / planned, 4)}
    ok, words = _verdict(vspan, within=True)
    anon = peak.get("RssAnon", 0) + peak.get("RssShmem", 0) if peak else None
    host_ok = bool(peak) and anon <= inst.anonymous / 2**20 and peak["VmRSS"] <= inst.total / 2**20
    return {"name": r["name"], "depth": depth, "model": r.get("model"), "overhead_mib": cfg.server.vram_cuda_overhead_mib,
            "vram": vspan, "vram_verdict": words, "host_anon_mib": anon, "host_plan_anon_mib": round(inst.anonymous / 2**20, 1),
            "host_rss_mib": peak.get("VmRSS"), "host_plan_total_mib": round(inst.total / 2**20, 1),
            "host_never_under": host_ok, "ok": ok and host_ok and r.get("healthy", False)}


def validate49(run) -> dict:
    """Issue 49's verdicts on a validation run (a run directory, its results.json, or the results): every host49
    config against today's plan (group_vars) at the checkpoints each repetition held (host49_reps), in the two
    quantities the kernel cannot reclaim: the process's anonymous and shared memory (VmRSS's RssAnon + RssShmem)
    and the cgroup's charge less its page cache. Never under in any repetition, every config; within 5 % in every
    repetition at the shipped 16 slots (0, 4, 8, 32 checkpoints and the fills: elsewhere the slot term is linear and
    the heap not quite, 4-9 % over in runs 3-4); nothing killed or throttled (memory.events high 0, oom_kill 0); the
    worst case holding every checkpoint (held = slots x ckpt at 32). The latency tier's configs, if the run has
    them: validate49_tier. `ok`: all of it, with `why` naming what failed."""
    if not isinstance(run, dict):
        path = Path(run)
        run = json.loads((path / "results.json" if path.is_dir() else path).read_text())
    rows, why = [], []
    for r in run.get("host49", []):
        reps = host49_reps(r)
        within = r["slots"] == SHIPPED_SLOTS49
        anon, held = _span(reps, "anon", "plan_anon"), _span(reps, "unreclaimable", "plan_held")
        (a_ok, a_words), (h_ok, h_words) = _verdict(anon, within), _verdict(held, within)
        events = (r.get("cgroup_end") or {}).get("cg_events") or {}
        killed = not r.get("alive_at_end", True) or events.get("oom_kill", 0) > 0
        counts = sorted({x["held"] for x in reps})
        full = r["ckpt"] == 32 and counts == [r["slots"] * 32]
        row = {"name": r["name"], "slots": r["slots"], "ckpt": r["ckpt"], "cms": r.get("cms"), "reps": len(reps),
               "held": counts, "full": full, "planned_mib": r.get("planned_mib"),
               "memory_max_mib": r.get("memory_max_mib"), "anon": anon, "anon_verdict": a_words,
               "unreclaimable": held, "unreclaimable_verdict": h_words, "killed": killed,
               "events_high": events.get("high"), "errors": sum(x["errors"] for x in reps)}
        row["ok"] = (a_ok and h_ok and not killed and not events.get("high") and not row["errors"] and bool(reps)
                     and r.get("cgroup_error") is None)
        rows.append(row)
        if not row["ok"]:
            why.append(f"{r['name']}: anonymous {a_words}; cgroup {h_words}" + ("; killed" if killed else "") +
                       (f"; {row['errors']} errors" if row["errors"] else "") + ("; no repetition" if not reps else ""))
    if not rows:
        why.append("no host49 config")
    elif not any(x["full"] for x in rows):
        why.append("no config held every checkpoint (slots x 32)")
    host_ok = not why
    tier = [validate49_tier(r) for r in run.get("tier41", []) if r["name"].startswith("lat-")]
    why += [f"{t['name']}: VRAM {t['vram_verdict']}" + ("" if t["host_never_under"] else "; host memory under")
            for t in tier if not t["ok"]]
    if not tier:
        why.append("no latency tier config (vram_cuda_overhead_mib not validated)")
    tier_ok = bool(tier) and all(t["ok"] for t in tier)
    return {"host49": rows, "tier41": tier, "host49_ok": host_ok, "tier41_ok": tier_ok, "ok": host_ok and tier_ok,
            "why": why}


def validate49_report(v: dict) -> str:
    """validate49's verdicts as bench/RESULTS.md's validation table."""
    lines = ["| config | held checkpoints | anonymous MiB: planned / measured (lowest-highest ratio) | held MiB: planned / "
             "cgroup (lowest-highest ratio) | verdict | MemoryMax MiB | killed / events high |",
             "|---|---|---|---|---|---|---|"]
    for r in v["host49"]:
        a, h = r["anon"], r["unreclaimable"]
        lines.append(f"| {r['name']} | {', '.join(f(x) for x in r['held'])}{' (all)' if r['full'] else ''} | "
                     f"{f(a['planned_mib'])} / {f(a['measured_mib'])} ({f(a['low'], 3)}-{f(a['high'], 3)}) | "
                     f"{f(h['planned_mib'])} / {f(h['measured_mib'])} ({f(h['low'], 3)}-{f(h['high'], 3)}) | "
                     f"{'ok' if r['ok'] else 'FAIL'}: {r['anon_verdict']}; {r['unreclaimable_verdict']} | "
                     f"{f(r['memory_max_mib'])} | {'yes' if r['killed'] else 'no'} / {r['events_high']} |")
    if v["tier41"]:
        lines += ["", "| tier config | VRAM MiB: planned / peak | verdict | host MiB: anonymous planned / measured, "
                  "total planned / VmRSS |", "|---|---|---|---|"]
        for t in v["tier41"]:
            lines.append(f"| {t['name']} (overhead {t['overhead_mib']}) | {f(t['vram']['planned_mib'])} / "
                         f"{f(t['vram']['measured_mib'])} | {'ok' if t['ok'] else 'FAIL'}: {t['vram_verdict']} | "
                         f"{f(t['host_plan_anon_mib'])} / {f(t['host_anon_mib'])}, {f(t['host_plan_total_mib'])} / "
                         f"{f(t['host_rss_mib'])} |")
    lines += ["", "validated" if v["ok"] else "NOT validated: " + "; ".join(v["why"])]
    return "\n".join(lines)


def sdist_checkout(cache: Path = SDIST_CACHE, sha256: str = SDIST_SHA256) -> Path:
    """vendor/llama.cpp of the pinned llama-cpp-python sdist (pip download, sha256 checked)."""
    tarball = cache / f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
    if not tarball.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        "-d", str(cache), f"{SDIST_NAME}=={SDIST_VERSION}"], check=True)
    got = hashlib.sha256(tarball.read_bytes()).hexdigest()
    if got != sha256:
        raise SystemExit(f"{tarball}: sha256 {got} != pinned {sha256}")
    src = cache / f"llama_cpp_python-{SDIST_VERSION}"
    if not (src / "vendor/llama.cpp/CMakeLists.txt").exists():
        subprocess.run(["tar", "xzf", str(tarball), "-C", str(cache)], check=True)
    return src / "vendor/llama.cpp"


def build_script_line(pack_dir: str, targets) -> tuple[str, str]:
    """(a shell line that runs vf-build-release.sh from pack_dir, the fingerprint): for the
    older pipelines (bench/gpu/gpu_run.sh, bench/gpu/qwen35_gpu.sh), which run it as build.sh."""
    b = build_plan(pack_dir, targets)
    return "bash " + " ".join(shlex.quote(a) for a in b["argv"]), b["fingerprint"]


def pack_sources(dest: Path, checkout: Path | None = None, commit: str = COMMIT, vocabs=("qwen35",),
                 vocab_blobs: bool = False) -> None:
    """llama.cpp at the pin (a one-commit bare repository), gguf-py, the qwen35 vocabulary and
    voltafleet's build script, into a fresh dest. `vocab_blobs`: a vocabulary the pin's tree holds travels
    inside llama.cpp.git only (its name and blob in dest/vocab-blobs.txt; gpu_proof.sh writes it out), not
    twice: 5.7 MiB of a device call's 64."""
    checkout = checkout or sdist_checkout()
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    if head != commit:
        raise SystemExit(f"{checkout} is at {head}, the pin is {commit}")
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    bare = dest / "llama.cpp.git"
    subprocess.run(["git", "clone", "-q", "--bare", "--depth", "1", f"file://{checkout}", str(bare)], check=True)
    for key in ("uploadpack.allowAnySHA1InWant", "uploadpack.allowReachableSHA1InWant"):
        subprocess.run(["git", "-C", str(bare), "config", key, "true"], check=True)
    shutil.rmtree(bare / "hooks", ignore_errors=True)
    shutil.copytree(checkout / "gguf-py", dest / "gguf-py", ignore=shutil.ignore_patterns("tests", "examples"))
    blobs = []
    for vocab in vocabs:
        name = f"ggml-vocab-{vocab}.gguf"
        blob = vocab_blobs and subprocess.run(["git", "-C", str(bare), "rev-parse", "-q", "--verify",
                                               f"{commit}:models/{name}"], capture_output=True, text=True).stdout.strip()
        if blob:
            blobs.append(f"{name} {blob}\n")
        else:
            shutil.copy(checkout / f"models/{name}", dest)
    if blobs:
        (dest / "vocab-blobs.txt").write_text("".join(blobs))
    shutil.copy(checkout / "models/templates/Qwen3.5-4B.jinja", dest)  # qwen35gen's chat template
    shutil.copy(REPO / "roles/llama_cpp/files/vf-build-release.sh", dest)


# What the GPU machine runs with python3 (stdlib only), each at its repository path so that it imports
# there as here: `PYTHONPATH=DEST python3 -m bench.gpu.proof_bench`. The phases' package goes whole, so a
# module added to it is shipped with the rest.
PROOF_PHASES = tuple(sorted(str(p.relative_to(REPO)) for p in (REPO / "bench/gpu/proof").glob("*.py")))
MACHINE_SOURCES = ("bench/__init__.py", "bench/gpu/__init__.py", "bench/gpu/proof_bench.py", *PROOF_PHASES,
                   "bench/gpu/qwen35_bench.py", "bench/gpu/voltarule.py", "voltafleet/__init__.py",
                   "voltafleet/hostside/__init__.py", "voltafleet/hostside/smoke_client.py",
                   "voltafleet/hostside/workload.py", "bench/traffic/__init__.py", "bench/traffic/model.py",
                   "bench/traffic/driver.py")


def pack(dest: Path, checkout: Path | None = None, commit: str = COMMIT, overlay: dict | None = None) -> dict:
    """Everything the GPU machine needs, in dest; returns the manifest (also dest/plan.json). `overlay`: plan
    entries that replace those of the same key (plan49v: host49's and tier41's for issue 49's validation run)."""
    pack_sources(dest, checkout, commit, vocab_blobs=True)
    for f in ("lab/qwen35gen.py", "bench/gpu/gpu_proof.sh"):
        shutil.copy(REPO / f, dest)
    for f in MACHINE_SOURCES:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / f, dest / f)
    plan = {"build": build_plan(), **run_plan(), **plan27(), "tune29": plan_tune29(), **plan32(),
            "tune29b": plan_tune29b(), **plan38(), **plan41(), **plan49(), **plan51(), **(overlay or {})}
    (dest / "plan.json").write_text(json.dumps(plan, indent=1))
    return {"dest": str(dest), **listed(dest), "fingerprint": plan["build"]["fingerprint"]}


def listed(dest: Path) -> dict:
    """A pack's files (relative to dest, sorted) and what they weigh (`carried`: SystemExit when they and the
    checkout are more than one device call carries): {"files", "bytes"}."""
    files = sorted(str(p.relative_to(dest)) for p in Path(dest).rglob("*") if p.is_file())
    return {"files": files, "bytes": carried(Path(dest), files)}


def tracked_bytes(repo: Path = REPO) -> int:
    """What the checkout's tracked files weigh: a device call carries them beside the pack."""
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, check=True).stdout
    return sum((repo / f).stat().st_size for f in out.decode().split("\0") if f and (repo / f).is_file())


def carried(dest: Path, files: list[str]) -> int:
    """The pack's bytes (its files, relative to dest); SystemExit when they and the checkout's tracked files
    are more than one device call carries."""
    size = sum((Path(dest) / f).stat().st_size for f in files)
    tree = tracked_bytes()
    if size + tree > LIMIT:
        raise SystemExit(f"{dest}: {size / 2**20:.1f} MiB, and the checkout's tracked files {tree / 2**20:.1f} MiB: "
                         f"more than the {LIMIT >> 20} MiB a device call carries (leave the extra files out of the pack)")
    return size


def _results(path: str) -> dict:
    """A run's results.json, or its gzip'd copy (an older record, kept small so the checkout and the GPU pack fit one
    device call)."""
    from bench.traffic import analyze
    return analyze.load(path)


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "pack"
    if cmd in ("pack", "pack49v"):
        m = pack(Path(argv[1]) if len(argv) > 1 else REPO / ".gpuproof", overlay=plan49v() if cmd == "pack49v" else None)
        print(f"packed {m['dest']}: {m['bytes'] / 2**20:.1f} MiB, release {m['fingerprint']}")
        phases = f"PHASES={PHASES49V} " if cmd == "pack49v" else ""
        print(f"on the GPU machine: {phases}bash {m['dest']}/gpu_proof.sh  (RES=dir for the results)")
        return 0
    if cmd == "validate49":
        print(validate49_report(validate49(Path(argv[1]))))
        return 0
    if cmd == "report":
        from bench.gpu import proof_report
        print(proof_report.report(_results(argv[1])))
        return 0
    if cmd == "report49":
        print(host49_report(_results(argv[1])))
        return 0
    if cmd == "report38":
        print(host38_report(_results(argv[1])))
        return 0
    if cmd == "report32":
        print(think_report(_results(argv[1])))
        return 0
    if cmd == "all":
        dest = REPO / ".gpuproof"
        pack(dest)
        res = REPO / ".gpuproof-results"
        subprocess.run(["bash", str(dest / "gpu_proof.sh")], env={**os.environ, "RES": str(res), "WAIT": "0"},
                       check=True)
        return main(["report", str(res / "results.json")])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
