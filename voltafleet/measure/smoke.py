"""The smoke test's verdict, on the controller: what the client (voltafleet/hostside/smoke_client.py,
run on the host) measured, judged against the group's thresholds (`verdict`), printed
(`table`) and written for node_exporter (`textfile`). Single-stream decode is judged on the
lowest of its three measurements; a disagreement above 15 % is reported.
"""
from __future__ import annotations

from voltafleet.inputs.settings import Settings
from voltafleet.gpu.gpuhealth import SLOWDOWNS, reason_words
from voltafleet.state.metrics import gauge  # the textfile format

DISAGREEMENT = 0.15  # report single-stream figures that differ by more than this


def expected_splits(cuda: bool) -> int:
    """Graph splits of a model served whole. CUDA: 2 (the token embedding stays on the CPU
    by design: one split for its get_rows, one for the GPU); a CPU-only build: 1 backend, 1."""
    return 2 if cuda else 1


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100): a value that was measured; None for no values."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    rank = max(1, -(-len(v) * p // 100))
    return v[int(rank) - 1]


def single_stream(m: dict) -> tuple[float, dict, str | None]:
    """(the figure judged: the lowest of the three measurements, all three, a disagreement
    note when they differ by more than 15 %)."""
    figures = {"client": m.get("single_tps"), "server": m.get("single_server_tps"),
               "metrics": m.get("single_metrics_tps")}
    known = {k: v for k, v in figures.items() if v}
    if not known:
        return 0.0, figures, None
    low, high = min(known.values()), max(known.values())
    note = None
    if high > low * (1 + DISAGREEMENT):
        note = ("single-stream figures disagree by " f"{100 * (high / low - 1):.0f} %: "
                + ", ".join(f"{k} {v:.1f}" for k, v in known.items()) + f" tok/s; judged on {low:.1f}")
    return low, figures, note


def slowdown(m: dict) -> str:
    """Why an instance's GPU ran slow, from the throttle reasons sampled while it was
    measured: ": GPU 3 thermal slowdown (88 C, SM 1020 MHz)"; "" when none was seen."""
    g = m.get("gpu") or {}
    words = reason_words(g.get("reasons", []))
    if not words:
        return ""
    facts = [f"{g['temperature_max_c']:.0f} C" if g.get("temperature_max_c") is not None else "",
             f"SM {g['sm_clock_mhz']:.0f} MHz" if g.get("sm_clock_mhz") is not None else "",
             f"{g['power_max_w']:.0f} W" if g.get("power_max_w") is not None else ""]
    return f": GPU {g['index']} {words}" + (f" ({', '.join(f for f in facts if f)})" if any(facts) else "")


def splits_problem(splits: list[int] | None, cuda: bool, partial_allowed: bool = False) -> str | None:
    """Why the logged graph splits show a CPU fallback, or None. A model served whole splits its
    graph expected_splits() times; more means an op (or layers) went to the CPU. No line in the
    log (an older build, a journal that cannot be read) is not judged here: the offload line is."""
    if not splits or partial_allowed:
        return None
    want, worst = expected_splits(cuda), max(splits)
    if worst > want:
        return (f"the scheduler split the graph {worst} times (sched_reserve: splits = {worst}), "
                f"{want} expected for a model served whole on {'the GPU' if cuda else 'the CPU'}: "
                "an op or layer fell back to the CPU")
    return None


def ttft_summary(m: dict) -> dict:
    """TTFT p50/p99 (ms) of an instance: the single stream's, and the N concurrent streams'."""
    par = m.get("parallel_ttft_ms") or []
    return {"single": m.get("ttft_ms"), "p50": percentile(par, 50), "p99": percentile(par, 99)}


def verdict(report: dict, cfg: Settings) -> list[str]:
    """Every threshold an instance missed, as a sentence with the numbers. [] = pass.
    Single-stream tok/s is judged on the conservative figure (see single_stream); a figure
    under its floor names the throttle reason its GPU showed (see slowdown). The quality
    probe is judged against the golden one by voltafleet.models.probe.compare."""
    fails = []
    cuda = cfg.preflight.backend == "cuda"
    for m in report["instances"]:
        who = f"instance {m['instance']} (port {m['port']})"
        if "error" in m:
            fails.append(f"{who}: {m['error']}")
            continue
        if cuda:
            off = m.get("offload")
            if not off:
                fails.append(f"{who}: no 'offloaded N/M layers to GPU' line in the journal")
            elif off["offloaded"] < off["total"] and not cfg.server.allow_partial_offload:
                fails.append(f"{who}: only {off['offloaded']}/{off['total']} layers on the GPU")
        why = splits_problem(m.get("splits"), cuda, cfg.server.allow_partial_offload)
        if why:
            fails.append(f"{who}: {why}")
        if m["ttft_ms"] > cfg.smoke.max_ttft_ms:
            fails.append(f"{who}: time to first token {m['ttft_ms']:.0f} ms > {cfg.smoke.max_ttft_ms} ms")
        single, _, _ = single_stream(m)
        if single < cfg.smoke.min_single_tps:
            fails.append(f"{who}: single-stream {single:.1f} tok/s < {cfg.smoke.min_single_tps}{slowdown(m)}")
        if m["errors"]:
            fails.append(f"{who}: {len(m['errors'])} of {m['parallel']} parallel streams failed: {m['errors'][0]}")
        if (m["aggregate_tps"] or 0) < cfg.smoke.min_aggregate_tps:
            fails.append(f"{who}: {m['parallel']}-way aggregate {m['aggregate_tps'] or 0:.1f} tok/s "
                         f"< {cfg.smoke.min_aggregate_tps}{slowdown(m)}")
    return fails


def table(host: str, report: dict) -> str:
    rows = [f"{'host':<14} {'inst':>4} {'port':>6} {'health s':>8} {'offload':>8} "
            f"{'TTFT ms':>8} {'1-stream tok/s':>14} {'N':>3} {'N-way tok/s':>11} {'N TTFT p50/p99 ms':>17}"]
    for m in report["instances"]:
        if "error" in m:
            rows.append(f"{host:<14} {m['instance']:>4} {m['port']:>6}  ERROR {m['error']}")
            continue
        off = m.get("offload")
        offs = f"{off['offloaded']}/{off['total']}" if off else "n/a"
        single, figures, note = single_stream(m)
        t = ttft_summary(m)
        nttft = f"{t['p50']:.0f}/{t['p99']:.0f}" if t["p50"] is not None else "n/a"
        rows.append(f"{host:<14} {m['instance']:>4} {m['port']:>6} {m['health_s']:>8.1f} {offs:>8} "
                    f"{m['ttft_ms']:>8.0f} {single:>14.1f} {m['parallel']:>3} "
                    f"{m['aggregate_tps'] or 0:>11.1f} {nttft:>17}")
        if note:
            rows.append(f"{'':<14} {'':>4} {'':>6} note: {note}")
    return "\n".join(rows)


def gpu_rows(host: str, report: dict) -> list[str]:
    """Per-GPU gauges, labelled host, gpu (index) and serial: what the smoke client sampled
    under load (report instances' "gpu") and the boards' health read at smoke time
    (report["gpu_health"], voltafleet.gpu.gpuhealth)."""
    sampled = [m["gpu"] for m in report.get("instances", []) if m.get("gpu")]
    health = (report.get("gpu_health") or {}).get("gpus", [])

    def lab(g, **extra):
        return {"host": host, "gpu": g["index"], "serial": g.get("serial") or "", **extra}

    def get(g, *path):
        for k in path:
            g = g.get(k) if isinstance(g, dict) else None
        return g

    def b(v):
        return None if v is None else int(bool(v))

    lines = []
    for name, text, src, rows in (
        ("voltafleet_gpu_sm_clock_mhz", "SM clock under load during the smoke test, MHz (mean)", sampled,
         lambda g: [(lab(g), g.get("sm_clock_mhz"))]),
        ("voltafleet_gpu_temperature_max_celsius", "highest GPU temperature during the smoke test", sampled,
         lambda g: [(lab(g), g.get("temperature_max_c"))]),
        ("voltafleet_gpu_power_max_watts", "highest power draw during the smoke test, W", sampled,
         lambda g: [(lab(g), g.get("power_max_w"))]),
        ("voltafleet_gpu_throttled", "1 if a slowdown reason (thermal, power) was seen during the smoke test", sampled,
         lambda g: [(lab(g), int(bool(set(g.get("reasons", [])) & SLOWDOWNS)))]),
        ("voltafleet_gpu_throttle_reason", "1 for each slowdown reason seen during the smoke test", sampled,
         lambda g: [(lab(g, reason=r), 1) for r in g.get("reasons", []) if r in SLOWDOWNS]),
        ("voltafleet_gpu_healthy", "1 if the board passed the health rules (ECC, pages, Xid, PCIe) at smoke time", health,
         lambda g: [(lab(g), b(g.get("healthy")))]),
        ("voltafleet_gpu_ecc_errors_volatile", "ECC errors since the driver loaded", health,
         lambda g: [(lab(g, type="uncorrectable"), get(g, "ecc", "volatile_dbe")),
                    (lab(g, type="corrected"), get(g, "ecc", "volatile_sbe"))]),
        ("voltafleet_gpu_retired_pages", "pages the board retired, by cause (a V100 retires at most 64)", health,
         lambda g: [(lab(g, cause="single_bit"), get(g, "retired", "sbe")),
                    (lab(g, cause="double_bit"), get(g, "retired", "dbe"))]),
        ("voltafleet_gpu_retired_pages_pending", "1 if a retired page waits for a GPU reset", health,
         lambda g: [(lab(g), b(get(g, "retired", "pending")))]),
        ("voltafleet_gpu_pcie_link_width", "current PCIe link width (lanes)", health,
         lambda g: [(lab(g), get(g, "pcie", "width"))]),
        ("voltafleet_gpu_pcie_link_width_max", "maximum PCIe link width of the board and slot (lanes)", health,
         lambda g: [(lab(g), get(g, "pcie", "width_max"))]),
        ("voltafleet_gpu_pcie_link_gen", "current PCIe generation", health,
         lambda g: [(lab(g), get(g, "pcie", "gen"))]),
        ("voltafleet_gpu_pcie_link_gen_max", "maximum PCIe generation of the board and slot", health,
         lambda g: [(lab(g), get(g, "pcie", "gen_max"))]),
        ("voltafleet_gpu_xid_errors", "Xid errors in the kernel log since boot, by Xid", health,
         lambda g: [(lab(g, xid=x), n) for x, n in sorted((g.get("xids") or {}).items())]),
        ("voltafleet_gpu_nvlink_errors", "NVLink error counters (nvidia-smi nvlink -e), by kind", health,
         lambda g: [(lab(g, kind=k), n) for k, n in sorted((g.get("nvlink") or {}).items())]),
    ):
        lines += gauge(name, text, [row for g in src for row in rows(g)])
    return lines


def textfile(host: str, report: dict, release: str | None) -> str:
    """The smoke figures in node_exporter's textfile-collector format, with per-GPU gauges
    (gpu_rows) on CUDA hosts.

        >>> print(textfile("gpu-01", report, "3f2a"))
        voltafleet_smoke_passed{host="gpu-01",release="3f2a"} 1
        voltafleet_gpu_sm_clock_mhz{host="gpu-01",gpu="3",serial="0323817105647"} 1312
    """
    lines = gauge("voltafleet_smoke_passed", "1 if the last smoke test passed",
                   [({"host": host, "release": release or ""}, int(bool(report.get("passed"))))])
    lines += gauge("voltafleet_smoke_time_seconds", "when the last smoke test ran",
                    [({"host": host}, round(report.get("epoch", 0)))])
    floors = report.get("thresholds") or {}
    lines += gauge("voltafleet_smoke_min_single_tps", "the single-stream tok/s floor the smoke test judged on",
                    [({"host": host}, floors.get("smoke_min_single_tps"))])
    lines += gauge("voltafleet_smoke_min_aggregate_tps", "the N-way aggregate tok/s floor the smoke test judged on",
                    [({"host": host}, floors.get("smoke_min_aggregate_tps"))])
    metrics_ = (("ttft_ms", "voltafleet_smoke_ttft_ms", "time to first token, ms"),
                ("p50", "voltafleet_smoke_parallel_ttft_p50_seconds", "N concurrent streams: median time to first token, s"),
                ("p99", "voltafleet_smoke_parallel_ttft_p99_seconds", "N concurrent streams: p99 time to first token, s"),
                ("single", "voltafleet_smoke_single_stream_tps", "single-stream decode tok/s (conservative)"),
                ("aggregate_tps", "voltafleet_smoke_aggregate_tps", "N-way aggregate tok/s"))
    ok = [m for m in report.get("instances", []) if "error" not in m]
    for key, name, text in metrics_:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge"]
        for m in ok:
            if key == "single":
                value = single_stream(m)[0]
            elif key in ("p50", "p99"):
                value = (ttft_summary(m)[key] or 0) / 1000
            else:
                value = m.get(key) or 0
            lines.append(f'{name}{{host="{host}",instance="{m["instance"]}",port="{m["port"]}"}} {value:.3f}')
    return "\n".join(lines + gpu_rows(host, report)) + "\n"
