"""Smoke test of llama-server instances: the measuring client and the verdict.

The client (standard library only) runs on the served host, against 127.0.0.1, so no
server port has to be open to the controller:

    python3 voltafleet-smoke --port 8080 --port 8081 --tokens 128 --parallel 4 \
        [--api-key-file /etc/voltafleet/api-key] [--unit-prefix llama-server@]

It prints one JSON document. The controller judges it with `verdict()` and prints
`table()`. Three numbers are never mixed: time to first token, single-stream decode
tok/s, and aggregate tok/s over N concurrent streams.
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

PROMPT = ("You are a helpful assistant running on a fleet of GPU servers. "
          "Describe in a few sentences how a load balancer spreads requests over many servers.")
OFFLOAD_RE = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")


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
    }


def offload_from_journal(unit: str) -> dict | None:
    """The last `offloaded N/M layers to GPU` line of the unit's current run."""
    try:
        since = subprocess.run(["systemctl", "show", "-P", "ActiveEnterTimestamp", unit],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        cmd = ["journalctl", "-u", unit, "-o", "cat", "--no-pager"]
        if since:
            cmd += ["--since", since]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = OFFLOAD_RE.findall(out)
    if not found:
        return None
    done, total = found[-1]
    return {"offloaded": int(done), "total": int(total)}


def measure(port: int, tokens: int, parallel: int, key: str | None, health_timeout: float,
            unit: str | None) -> dict:
    out: dict = {"port": port}
    out["health_s"] = wait_health(port, health_timeout)
    out["offload"] = offload_from_journal(unit) if unit else None
    stream_once(port, 8, key)  # warm-up: first-request allocations are not the steady state
    single = stream_once(port, tokens, key)
    out["ttft_ms"] = single["ttft_ms"]
    out["single_tps"] = single["decode_tps"]
    out["single_server_tps"] = single["server_tps"]
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
    a = p.parse_args(argv)
    key = open(a.api_key_file).read().strip() if a.api_key_file else None
    report = {"instances": []}
    for i, port in enumerate(a.port):
        unit = f"{a.unit_prefix}{i}.service" if a.unit_prefix else None
        try:
            m = measure(port, a.tokens, a.parallel, key, a.health_timeout, unit)
        except Exception as e:
            m = {"port": port, "error": f"{type(e).__name__}: {e}"}
        m["instance"] = i
        report["instances"].append(m)
    json.dump(report, sys.stdout)
    print()
    return 0


# ---------------------------------------------------------------- verdict (controller)


def verdict(report: dict, cfg: dict) -> list[str]:
    """Every threshold an instance missed, as a sentence with the numbers. [] = pass."""
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
        if m["ttft_ms"] > cfg["smoke_max_ttft_ms"]:
            fails.append(f"{who}: time to first token {m['ttft_ms']:.0f} ms > {cfg['smoke_max_ttft_ms']} ms")
        if (m["single_tps"] or 0) < cfg["smoke_min_single_tps"]:
            fails.append(f"{who}: single-stream {m['single_tps'] or 0:.1f} tok/s < {cfg['smoke_min_single_tps']}")
        if m["errors"]:
            fails.append(f"{who}: {len(m['errors'])} of {m['parallel']} parallel streams failed: {m['errors'][0]}")
        if (m["aggregate_tps"] or 0) < cfg["smoke_min_aggregate_tps"]:
            fails.append(f"{who}: {m['parallel']}-way aggregate {m['aggregate_tps'] or 0:.1f} tok/s "
                         f"< {cfg['smoke_min_aggregate_tps']}")
    return fails


def table(host: str, report: dict) -> str:
    rows = [f"{'host':<14} {'inst':>4} {'port':>6} {'health s':>8} {'offload':>8} "
            f"{'TTFT ms':>8} {'1-stream tok/s':>14} {'N':>3} {'N-way tok/s':>11}"]
    for m in report["instances"]:
        if "error" in m:
            rows.append(f"{host:<14} {m['instance']:>4} {m['port']:>6}  ERROR {m['error']}")
            continue
        off = m.get("offload")
        offs = f"{off['offloaded']}/{off['total']}" if off else "n/a"
        rows.append(f"{host:<14} {m['instance']:>4} {m['port']:>6} {m['health_s']:>8.1f} {offs:>8} "
                    f"{m['ttft_ms']:>8.0f} {m['single_tps'] or 0:>14.1f} {m['parallel']:>3} "
                    f"{m['aggregate_tps'] or 0:>11.1f}")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
