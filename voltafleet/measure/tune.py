"""Autotune on the canary (issue 29): which server settings to try, how a trial's figures are
summarised, which one wins, and the reviewable file that carries the winner to the next
rollout. Pure: the driver (`python -m rollout INVENTORY --tune`) runs the trials.

A trial is one setting: overrides of the group's server variables, rolled onto the drained
canary (the VRAM plan and preflight judge it there: a setting that does not fit is refused,
never measured), then the group's workload, `tune_repetitions` times. The winner is the
highest median throughput among the trials that ran without an error, matched the golden
probe, kept TTFT p99 within `tune_max_ttft_p99_ms` and left `tune_headroom_mib` of the GPU
free at every repetition's peak.

    >>> [s.name for s in candidates({"voltafleet_backend": "cpu", "server_parallel": 4, "server_ctx": 4096,
    ...                                "server_spec_ngram": None, "server_cache_ram": None,
    ...                                "server_backend_sampling": False, "server_ctx_checkpoints": None,
    ...                                "llama_cpp_cmake_extra": []})][:3]
    ['shipped', 'slots 2', 'slots 8']
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field

import yaml

from voltafleet.inputs.settings import Settings
from voltafleet.inputs.config import SCHEMA
from voltafleet.state.records import Preflight, Tune
from voltafleet.planning.vram import N_UBATCH  # llama.cpp's -ub when server_ubatch is null

SUFFIX = ".tuned.yml"  # group_vars/<group>.tuned.yml, read after group_vars/<group>.yml
FORCE_MMQ = "-DGGML_CUDA_FORCE_MMQ=ON"
UBATCH_RANGE = (SCHEMA["server_ubatch"].min, SCHEMA["server_ubatch"].max)  # -b stays llama.cpp's 2048
HOST_CACHE_MIB = 8192       # the host-RAM prompt cache tried when a group ships it off (llama.cpp's default)
FIGURES = ("throughput_tps", "ttft_p50_ms", "ttft_p99_ms", "decode_tps", "peak_mib")
# kept per repetition in the tuned file beside FIGURES: the follow-ups' TTFT and the share of their prompt the
# server found cached (real chats: resumed from a context checkpoint, or 0; the median and the most one found), the
# server's host-memory peak
REP_EXTRA = ("followup_ttft_p50_ms", "followup_cached_p50", "followup_cached_max", "host_peak_mib")


@dataclass(frozen=True)
class Setting:
    name: str
    values: dict  # overrides of the group's variables; {}: the shipped setting


@dataclass(frozen=True)
class Workload:
    prompt_tokens: int
    answer_tokens: int
    clients: int
    requests: int
    followup_share: float
    repetitions: int

    @classmethod
    def of(cls, cfg: Settings) -> "Workload":
        return cls(cfg.tune.prompt_tokens, cfg.tune.answer_tokens, cfg.tune.clients, cfg.tune.requests,
                   cfg.tune.followup_share, cfg.tune.repetitions)

    def argv(self) -> list[str]:
        return ["--clients", str(self.clients), "--requests", str(self.requests), "--reps", str(self.repetitions),
                "--prompt-tokens", str(self.prompt_tokens), "--answer-tokens", str(self.answer_tokens),
                "--followup-share", str(self.followup_share)]


def gpu_used_command(index: int) -> str:
    """The GPU's memory.used, as the workload reads its peaks (nvidia-smi, MiB)."""
    return f"nvidia-smi -i {int(index)} --query-gpu=memory.used --format=csv,noheader,nounits"


def gpu_used_mib(stdout: str) -> float | None:
    """gpu_used_command's answer; None when it is not a number (no GPU, a driver error)."""
    try:
        return float(stdout.strip().splitlines()[0])
    except (IndexError, ValueError):
        return None


def candidates(cfg: Settings) -> list[Setting]:
    """The bounded set: the shipped setting, then one change at a time (slots at the same context
    a slot, twice the context a slot, the prompt step (ubatch) halved and doubled, n-gram
    drafting, backend sampling, the host-RAM prompt cache on or off, context checkpoints, and on
    CUDA the build variant without FORCE_MMQ, the other release the Volta issue keeps)."""
    out = [Setting("shipped", {})]
    par, ctx = cfg.server.parallel, cfg.server.ctx
    if par:
        per_slot = (ctx // par) if ctx else None
        for n in sorted({max(1, par // 2), par * 2} - {par}):
            out.append(Setting(f"slots {n}", {"server_parallel": n, **({"server_ctx": per_slot * n} if per_slot else {})}))
        if ctx and ctx * 2 <= SCHEMA["server_ctx"].max:
            out.append(Setting(f"context {ctx * 2 // par} a slot", {"server_ctx": ctx * 2}))
    ub = cfg.server.ubatch or N_UBATCH
    for n in (ub // 2, ub * 2):
        if UBATCH_RANGE[0] <= n <= UBATCH_RANGE[1]:
            out.append(Setting(f"ubatch {n}", {"server_ubatch": n}))
    if not cfg.server.spec_ngram:
        out.append(Setting("n-gram drafts", {"server_spec_ngram": "ngram-mod"}))
    out.append(Setting(f"backend sampling {'off' if cfg.server.backend_sampling else 'on'}",
                       {"server_backend_sampling": not cfg.server.backend_sampling}))
    if cfg.server.cache_ram != 0:
        out.append(Setting("no host-RAM cache", {"server_cache_ram": 0}))
    else:
        out.append(Setting(f"host-RAM cache {HOST_CACHE_MIB} MiB", {"server_cache_ram": HOST_CACHE_MIB}))
    checkpoints = cfg.server.ctx_checkpoints
    out.append(Setting("32 checkpoints" if checkpoints != 32 else "no checkpoints",
                       {"server_ctx_checkpoints": 32 if checkpoints != 32 else 0}))
    extra = list(cfg.build.cmake_extra or [])
    if cfg.preflight.backend == "cuda" and FORCE_MMQ in extra:
        out.append(Setting("Volta rule build (no FORCE_MMQ)",
                           {"llama_cpp_cmake_extra": [f for f in extra if f != FORCE_MMQ]}))
    tried = cfg.tune.try_
    return [s for s in out if not s.values or tried is None or kind(s) in tried]


# what each kind of change (tune_try) sets; a setting's kind is that of its first value
KINDS = {"server_parallel": "slots", "server_ctx": "context", "server_ubatch": "ubatch",
         "server_spec_ngram": "ngram", "server_backend_sampling": "backend_sampling",
         "server_cache_ram": "host_cache", "server_ctx_checkpoints": "checkpoints", "llama_cpp_cmake_extra": "build"}


def kind(setting: Setting) -> str:
    """The kind of change a setting makes (tune_try's words): "slots 8" sets server_parallel (and
    the context that keeps a slot's), so it is "slots"."""
    return KINDS[next(iter(setting.values))]


@dataclass
class Trial:
    setting: Setting
    status: str = "not run"            # measured | failed | refused | skipped
    reason: str = ""
    reps: list = field(default_factory=list)   # the workload's repetitions (workload.py)
    probe: str | None = None           # the golden probe's verdict in its smoke test
    loaded_mib: float | None = None    # the GPU's memory once loaded (/health answered), before any request
    after_load_mib: float | None = None  # the workload's own reading; older records: after the smoke test's requests
    planned_mib: float | None = None   # the VRAM plan of the setting (CUDA), from its preflight
    planned_static_mib: float | None = None  # the plan without the CUDA context and the pool
    seconds: float | None = None

    @classmethod
    def of(cls, setting: Setting, record, **over) -> "Trial":
        """The trial a measurement record describes (roles/tune's record, voltafleet.state.records.Tune,
        or the GPU proof's tune29 mapping; None: no record, a failed trial); `over` replaces what
        the caller knows better."""
        record = record.to_dict() if isinstance(record, Tune) else record or {}
        fields = {"status": record.get("status", "failed"), "reason": record.get("reason") or "",
                  "reps": record.get("reps") or [], "probe": record.get("probe"),
                  "loaded_mib": record.get("loaded_mib"), "after_load_mib": record.get("after_load_mib"),
                  "planned_mib": record.get("planned_mib"),
                  "planned_static_mib": record.get("planned_static_mib"), "seconds": record.get("seconds")}
        return cls(setting, **{**fields, **over})

    def median(self, key: str) -> float | None:
        vals = [r[key] for r in self.reps if r.get(key) is not None]
        return round(statistics.median(vals), 2) if vals else None

    def highest(self, key: str) -> float | None:
        vals = [r[key] for r in self.reps if r.get(key) is not None]
        return max(vals) if vals else None

    def figures(self) -> dict:
        return {k: self.median(k) for k in FIGURES}

    def errors(self) -> list[str]:
        return [e for r in self.reps for e in r.get("errors", [])]


def unmeasured(preflight: Preflight | None, rc: int, log) -> tuple[str, str]:
    """(status, reason) of a trial that left no tune record, from its run's preflight record:
    "refused" with preflight's first refusal (the setting does not fit: never measured), else
    "failed" (pyinfra's exit code and the trial's log)."""
    if preflight is not None and preflight.refusals:
        return "refused", preflight.refusals[0][:200]
    return "failed", f"no tune record (pyinfra exit {rc}; see {log})"


def judge(t: Trial, cfg: Settings, vram_mib: float | None) -> str | None:
    """Why a trial can never win (None: it can)."""
    if t.status != "measured":
        return t.reason or t.status
    if len(t.reps) < cfg.tune.repetitions:
        return f"{len(t.reps)} of {cfg.tune.repetitions} repetitions"
    if t.errors():
        return f"{len(t.errors())} request error(s): {t.errors()[0]}"
    if t.probe not in ("match", "recorded"):
        return f"golden probe: {t.probe or 'not compared'}"
    p99 = t.median("ttft_p99_ms")
    if p99 is None or p99 > cfg.tune.max_ttft_p99_ms:
        return f"TTFT p99 {p99} ms over the objective {cfg.tune.max_ttft_p99_ms} ms"
    peak = t.highest("peak_mib")  # every repetition's: one that filled the GPU is not outvoted
    if vram_mib is not None and (peak is None or peak > vram_mib - cfg.tune.headroom_mib):
        return f"VRAM peak {peak} MiB leaves less than {cfg.tune.headroom_mib} MiB of {vram_mib:.0f}"
    return None


def winner(trials: list[Trial], cfg: Settings, vram_mib: float | None = None) -> Trial | None:
    ok = [t for t in trials if judge(t, cfg, vram_mib) is None]
    return max(ok, key=lambda t: t.median("throughput_tps") or 0) if ok else None


def calibration(trials: list[Trial], overhead_mib: float | None = None) -> dict:
    """What the trials teach the planner (CUDA), for this GPU model: the CUDA context (the GPU's
    memory once loaded, before any request, minus what the plan puts on the GPU at load), the
    plan's error at each trial's highest peak, and the overhead to plan with (`cuda_overhead_mib`):
    the larger of the measured context and `overhead_mib` (the one planned with) plus the most
    any repetition's peak exceeded its plan, so that every repetition's peak is within the plan.
    The context is read before the first request because the plan counts the CUDA pool apart: a
    reading after requests (older records: after the smoke test's) holds the pool's growth too,
    so it is shown (`cuda_overhead_after_requests_mib`), never planned with."""
    rows = [t for t in trials if t.status == "measured" and t.planned_mib and t.highest("peak_mib") is not None]
    if not rows:
        return {"measured": False, "why": "no GPU figures (the cpu backend, or no trial measured)"}
    short = max(t.highest("peak_mib") - t.planned_mib for t in rows)
    err = {t.setting.name: round(100 * (t.highest("peak_mib") - t.planned_mib) / t.planned_mib, 2) for t in rows}
    static = [t for t in rows if t.planned_static_mib is not None]
    ctx = [t.loaded_mib - t.planned_static_mib for t in static if t.loaded_mib is not None]
    late = [t.after_load_mib - t.planned_static_mib for t in static
            if t.loaded_mib is None and t.after_load_mib is not None]
    need = [*ctx, *([overhead_mib + short] if overhead_mib is not None else [])]
    out = {"measured": True, "planner_error_pct": err, "planner_error_pct_max": max(err.values()),
           "plan_short_at_peak_mib": round(short, 1),
           "peaks_covered": sum(1 for t in rows for r in t.reps if r.get("peak_mib") is not None),
           "cuda_overhead_after_load_mib": round(max(ctx), 1) if ctx else None}
    if late:
        out["cuda_overhead_after_requests_mib"] = round(max(late), 1)
    out["cuda_overhead_mib"] = math.ceil(round(max(need), 1)) if need else None
    return out


def table(trials: list[Trial], cfg: Settings, vram_mib: float | None = None, best: Trial | None = None) -> str:
    head = f"{'setting':<32} {'status':<9} {'tok/s':>8} {'TTFT p50':>9} {'p99':>8} {'decode':>7} {'peak MiB':>9}  verdict"
    lines = [head, "-" * len(head)]
    for t in trials:
        f = t.figures()
        why = judge(t, cfg, vram_mib)
        cell = lambda v, w: f"{v:>{w}}" if v is not None else f"{'-':>{w}}"  # noqa: E731
        lines.append(f"{t.setting.name[:32]:<32} {t.status:<9} {cell(f['throughput_tps'], 8)} "
                     f"{cell(f['ttft_p50_ms'], 9)} {cell(f['ttft_p99_ms'], 8)} {cell(f['decode_tps'], 7)} "
                     f"{cell(f['peak_mib'], 9)}  " + ("WINNER" if t is best else why or "eligible"))
    return "\n".join(lines)


def document(group: str, best: Trial | None, trials: list[Trial], cfg: Settings, meta: dict,
             vram_mib: float | None = None) -> str:
    """group_vars/<group>.tuned.yml: `values` (applied after group_vars/<group>.yml) and what
    they were chosen on: every trial's medians, the machine, the commit, the model."""
    values = dict(best.setting.values) if best else {}
    cal = calibration(trials, cfg.server.vram_cuda_overhead_mib)
    if cal.get("cuda_overhead_mib") is not None:  # the planner's CUDA context, as measured on this GPU model
        values["vram_cuda_overhead_mib"] = cal["cuda_overhead_mib"]
    doc = {
        "values": values,
        "chosen": {"setting": best.setting.name if best else None,
                   "why": ("the highest median throughput within the TTFT p99 objective and the VRAM headroom, "
                           "golden probe matched" if best else "no setting passed: the shipped values stay"),
                   **({"figures": best.figures()} if best else {})},
        "tuned": {**meta, "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                  "workload": asdict(Workload.of(cfg)), "objective_ttft_p99_ms": cfg.tune.max_ttft_p99_ms,
                  "headroom_mib": cfg.tune.headroom_mib},
        "calibration": cal,
        "trials": [{"setting": t.setting.name, "values": t.setting.values, "status": t.status,
                    "verdict": judge(t, cfg, vram_mib) or "eligible", "probe": t.probe, "seconds": t.seconds,
                    "medians": t.figures(), "reps": [{**{k: r.get(k) for k in (*FIGURES, "requests", "followups", "errors")},
                                                      **{k: r[k] for k in REP_EXTRA if k in r}}
                                                     for r in t.reps]} for t in trials],
    }
    head = (f"# Written by `python -m rollout --tune` for the group {group}: review, then commit.\n"
            "# `values` apply after group_vars/" + group + ".yml on the next rollout (`--plan` shows what changes);\n"
            "# the rest says what they were chosen on. Delete this file to return to the shipped values.\n")
    return head + yaml.safe_dump(doc, sort_keys=False, width=120)
