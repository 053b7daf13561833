"""Smoke test of llama-server instances: the measuring client and the verdict.

The client (standard library only) runs on the served host, against 127.0.0.1, so no
server port has to be open to the controller:

    python3 voltafleet-smoke --port 8080 --port 8081 --tokens 128 --parallel 4 \
        [--api-key-file /etc/voltafleet/api-key] [--unit-prefix llama-server@]

It prints one JSON document. The controller judges it with `verdict()` and prints
`table()`. Three numbers are never mixed: time to first token, single-stream decode
tok/s, and aggregate tok/s over N concurrent streams.

Single-stream decode is measured three ways and judged on the lowest: the client's wall
clock between the first and last streamed token (a burst after a slow first token
inflates it), the server's own timing of the request (`timings.predicted_per_second`),
and its /metrics counters over the request (tokens_predicted_total over
tokens_predicted_seconds_total). A disagreement above 15 % is reported.

With --probe, a fixed greedy completion's tokens and top log-probabilities are recorded
(the quality probe): `probe_compare()` judges a host against the canary's.
"""
from __future__ import annotations

import argparse
import http.client
import json
import re
import subprocess
import sys
import threading
import time

DISAGREEMENT = 0.15  # report single-stream figures that differ by more than this
PROMPT = ("You are a helpful assistant running on a fleet of GPU servers. "
          "Describe in a few sentences how a load balancer spreads requests over many servers.")
OFFLOAD_RE = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
# sched_reserve at -lv 4: "graph: nodes = N, splits = S" or, when the prompt and decode graphs
# differ, "graph (pp bs=512, tg bs=4): nodes = N / M, splits = S / T"
SPLITS_RE = re.compile(r"sched_reserve: graph[^:]*: nodes = [\d /]+, splits = (\d+)(?: / (\d+))?")


def graph_splits(log: str) -> list[int]:
    """Every split count the scheduler logged (both of a "S / T" pair), in log order."""
    return [int(n) for m in SPLITS_RE.finditer(log) for n in m.groups() if n is not None]


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


# ---------------------------------------------------------------- client (runs on the host)


def _request(port: int, method: str, path: str, body: dict | None, key: str | None,
             timeout: float = 600) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    return conn.getresponse()


def wait_health(port: int, timeout: float) -> float:
    """Seconds until /health answered 200 (503 while the model loads)."""
    t0 = time.monotonic()
    while True:
        try:
            r = _request(port, "GET", "/health", None, None, timeout=5)
            r.read()
            if r.status == 200:
                return time.monotonic() - t0
        except OSError:
            pass
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"/health on port {port} not ready after {timeout:.0f}s")
        time.sleep(0.5)


def stream_once(port: int, tokens: int, key: str | None) -> dict:
    """One streamed completion: time to first token, decode rate, token count."""
    body = {"prompt": PROMPT, "n_predict": tokens, "stream": True, "ignore_eos": True,
            "cache_prompt": False, "temperature": 0}
    t0 = time.monotonic()
    r = _request(port, "POST", "/completion", body, key)
    if r.status != 200:
        raise RuntimeError(f"/completion on port {port}: HTTP {r.status} {r.read()[:200]!r}")
    first = last = None
    n = 0
    final: dict = {}
    for raw in r:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        chunk = json.loads(line[5:])
        now = time.monotonic()
        if chunk.get("content"):
            n += 1
            first = first if first is not None else now
            last = now
        if chunk.get("stop"):
            final = chunk
            break
    if first is None:
        raise RuntimeError(f"/completion on port {port} streamed no token")
    predicted = int(final.get("tokens_predicted") or final.get("timings", {}).get("predicted_n") or n)
    decode_s = (last - first) if last > first else None
    return {
        "ttft_ms": (first - t0) * 1000,
        "tokens": predicted,
        "chunks": n,
        "start": t0, "end": last,
        "decode_tps": (n - 1) / decode_s if decode_s else None,
        "server_tps": final.get("timings", {}).get("predicted_per_second"),
        "server_prompt_ms": final.get("timings", {}).get("prompt_ms"),
    }


def metrics(port: int, key: str | None) -> dict[str, float]:
    """llama-server's Prometheus counters (--metrics), {} when unavailable."""
    try:
        r = _request(port, "GET", "/metrics", None, key, timeout=10)
        text = r.read().decode()
    except OSError:
        return {}
    if r.status != 200:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:") and " " in line:
            name, value = line.split(" ", 1)
            try:
                out[name.split(":", 1)[1]] = float(value)
            except ValueError:
                pass
    return out


def probe(port: int, key: str | None, prompt: str, tokens: int, top: int = 5) -> dict:
    """A fixed greedy completion: token ids and the top log-probabilities at each step."""
    body = {"prompt": prompt, "n_predict": tokens, "temperature": 0, "top_k": 1, "seed": 0,
            "n_probs": top, "cache_prompt": False, "stream": False}
    r = _request(port, "POST", "/completion", body, key)
    data = json.loads(r.read())
    if r.status != 200:
        raise RuntimeError(f"probe on port {port}: HTTP {r.status}")
    steps = data.get("completion_probabilities") or []
    return {"prompt": prompt, "text": data.get("content", ""),
            "tokens": [s.get("id") for s in steps],
            "logprobs": [s.get("logprob") for s in steps],
            "top": [[(t.get("id"), t.get("logprob")) for t in s.get("top_logprobs", [])] for s in steps]}


def journal(unit: str) -> str | None:
    """The unit's journal since its current run started (None when it cannot be read)."""
    try:
        since = subprocess.run(["systemctl", "show", "-P", "ActiveEnterTimestamp", unit],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        cmd = ["journalctl", "-u", unit, "-o", "cat", "--no-pager"]
        if since:
            cmd += ["--since", since]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def offload_from_journal(unit: str) -> dict | None:
    """The last `offloaded N/M layers to GPU` line of the unit's current run."""
    return offload_from_log(journal(unit))


def offload_from_log(log: str | None) -> dict | None:
    """The last `offloaded N/M layers to GPU` line of a server log."""
    found = OFFLOAD_RE.findall(log or "")
    if not found:
        return None
    done, total = found[-1]
    return {"offloaded": int(done), "total": int(total)}


def measure(port: int, tokens: int, parallel: int, key: str | None, health_timeout: float,
            unit: str | None, probe_prompt: str | None = None, probe_tokens: int = 16) -> dict:
    out: dict = {"port": port}
    out["health_s"] = wait_health(port, health_timeout)
    log = journal(unit) if unit else None
    out["offload"] = offload_from_log(log)
    out["splits"] = graph_splits(log or "") or None
    stream_once(port, 8, key)  # warm-up: first-request allocations are not the steady state
    before = metrics(port, key)
    single = stream_once(port, tokens, key)
    after = metrics(port, key)
    out["ttft_ms"] = single["ttft_ms"]
    out["single_tps"] = single["decode_tps"]
    out["single_server_tps"] = single["server_tps"]
    dt = after.get("tokens_predicted_seconds_total", 0) - before.get("tokens_predicted_seconds_total", 0)
    dn = after.get("tokens_predicted_total", 0) - before.get("tokens_predicted_total", 0)
    out["single_metrics_tps"] = dn / dt if dt > 0 and dn > 0 else None
    if probe_prompt:
        out["probe"] = probe(port, key, probe_prompt, probe_tokens)
    results: list[dict] = []
    errors: list[str] = []

    def worker() -> None:
        try:
            results.append(stream_once(port, tokens, key))
        except Exception as e:  # reported, not raised: the verdict fails on it
            errors.append(str(e))

    threads = [threading.Thread(target=worker) for _ in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["parallel"] = parallel
    out["errors"] = errors
    if results:
        wall = max(r["end"] for r in results) - min(r["start"] for r in results)
        out["aggregate_tps"] = sum(r["tokens"] for r in results) / wall
        out["parallel_ttft_ms"] = sorted(r["ttft_ms"] for r in results)
        out["parallel_ttft_ms_max"] = max(r["ttft_ms"] for r in results)
    else:
        out["aggregate_tps"] = None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="voltafleet smoke client")
    p.add_argument("--port", type=int, action="append", required=True)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--health-timeout", type=float, default=600)
    p.add_argument("--api-key-file")
    p.add_argument("--unit-prefix", help="systemd unit prefix, e.g. llama-server@ (instance = index)")
    p.add_argument("--probe-prompt-file", help="record the quality probe for this prompt (greedy)")
    p.add_argument("--probe-tokens", type=int, default=16)
    a = p.parse_args(argv)
    prompt = open(a.probe_prompt_file).read() if a.probe_prompt_file else None
    key = open(a.api_key_file).read().strip() if a.api_key_file else None
    report = {"instances": []}
    for i, port in enumerate(a.port):
        unit = f"{a.unit_prefix}{i}.service" if a.unit_prefix else None
        try:
            m = measure(port, a.tokens, a.parallel, key, a.health_timeout, unit, prompt, a.probe_tokens)
        except Exception as e:
            m = {"port": port, "error": f"{type(e).__name__}: {e}"}
        m["instance"] = i
        report["instances"].append(m)
    json.dump(report, sys.stdout)
    print()
    return 0


# ---------------------------------------------------------------- verdict (controller)


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


def probe_compare(reference: dict, probe: dict, tolerance: float) -> str | None:
    """None when the probe matches the reference: the same greedy tokens, and each chosen
    token's log-probability within `tolerance` (nats). Else why it diverged."""
    ref_tokens, tokens = reference.get("tokens") or [], probe.get("tokens") or []
    if not ref_tokens:
        return None
    for i, (a, b) in enumerate(zip(ref_tokens, tokens)):
        if a != b:
            return f"token {i} is {b}, the canary's is {a}"
    if len(tokens) < len(ref_tokens):
        return f"{len(tokens)} probe tokens, the canary's {len(ref_tokens)}"
    diffs = [abs(a - b) for a, b in zip(reference.get("logprobs") or [], probe.get("logprobs") or [])
             if a is not None and b is not None]
    worst = max(diffs, default=0.0)
    if worst > tolerance:
        return f"log-probability differs by {worst:.3f} (> {tolerance}) from the canary's"
    return None


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


def verdict(report: dict, cfg: dict, reference: dict | None = None) -> list[str]:
    """Every threshold an instance missed, as a sentence with the numbers. [] = pass.
    Single-stream tok/s is judged on the conservative figure (see single_stream)."""
    fails = []
    cuda = cfg["voltafleet_backend"] == "cuda"
    for m in report["instances"]:
        who = f"instance {m['instance']} (port {m['port']})"
        if "error" in m:
            fails.append(f"{who}: {m['error']}")
            continue
        if cuda:
            off = m.get("offload")
            if not off:
                fails.append(f"{who}: no 'offloaded N/M layers to GPU' line in the journal")
            elif off["offloaded"] < off["total"] and not cfg["server_allow_partial_offload"]:
                fails.append(f"{who}: only {off['offloaded']}/{off['total']} layers on the GPU")
        why = splits_problem(m.get("splits"), cuda, cfg["server_allow_partial_offload"])
        if why:
            fails.append(f"{who}: {why}")
        if m["ttft_ms"] > cfg["smoke_max_ttft_ms"]:
            fails.append(f"{who}: time to first token {m['ttft_ms']:.0f} ms > {cfg['smoke_max_ttft_ms']} ms")
        single, _, _ = single_stream(m)
        if single < cfg["smoke_min_single_tps"]:
            fails.append(f"{who}: single-stream {single:.1f} tok/s < {cfg['smoke_min_single_tps']}")
        if reference is not None and m.get("probe") is not None:
            why = probe_compare(reference, m["probe"], cfg["smoke_probe_tolerance"])
            if why:
                fails.append(f"{who}: quality probe diverged: {why}")
        if m["errors"]:
            fails.append(f"{who}: {len(m['errors'])} of {m['parallel']} parallel streams failed: {m['errors'][0]}")
        if (m["aggregate_tps"] or 0) < cfg["smoke_min_aggregate_tps"]:
            fails.append(f"{who}: {m['parallel']}-way aggregate {m['aggregate_tps'] or 0:.1f} tok/s "
                         f"< {cfg['smoke_min_aggregate_tps']}")
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


def textfile(host: str, report: dict, release: str | None) -> str:
    """The smoke figures in node_exporter's textfile-collector format."""
    lines = ["# HELP voltafleet_smoke_passed 1 if the last smoke test passed",
             "# TYPE voltafleet_smoke_passed gauge",
             f'voltafleet_smoke_passed{{host="{host}",release="{release or ""}"}} {int(bool(report.get("passed")))}',
             "# HELP voltafleet_smoke_time_seconds when the last smoke test ran",
             "# TYPE voltafleet_smoke_time_seconds gauge",
             f'voltafleet_smoke_time_seconds{{host="{host}"}} {report.get("epoch", 0):.0f}']
    metrics_ = (("ttft_ms", "voltafleet_smoke_ttft_ms", "time to first token, ms"),
                ("p50", "voltafleet_smoke_parallel_ttft_p50_ms", "N concurrent streams: median time to first token, ms"),
                ("p99", "voltafleet_smoke_parallel_ttft_p99_ms", "N concurrent streams: p99 time to first token, ms"),
                ("single", "voltafleet_smoke_single_stream_tps", "single-stream decode tok/s (conservative)"),
                ("aggregate_tps", "voltafleet_smoke_aggregate_tps", "N-way aggregate tok/s"))
    for key, name, text in metrics_:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge"]
        for m in report.get("instances", []):
            if "error" in m:
                continue
            if key == "single":
                value = single_stream(m)[0]
            elif key in ("p50", "p99"):
                value = ttft_summary(m)[key] or 0
            else:
                value = m.get(key) or 0
            lines.append(f'{name}{{host="{host}",instance="{m["instance"]}",port="{m["port"]}"}} {value:.3f}')
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
