"""The smoke test's measuring client, shipped to every server host as voltafleet-smoke
(standard library only); it runs there, against the address the servers bind (--host; 127.0.0.1 for
a wildcard bind), so no server port has to be open
to the controller:

    python3 voltafleet-smoke --port 8080 --port 8081 --tokens 128 --parallel 4 \
        [--api-key-file /etc/voltafleet/api-key] [--unit-prefix llama-server@]

It prints one JSON document, which the controller judges (voltafleet/measure/smoke.py). Three numbers
are never mixed: time to first token, single-stream decode tok/s, and aggregate tok/s over N
concurrent streams.

Single-stream decode is measured three ways (judged on the lowest, by the controller): the
client's wall clock between the first and last streamed token (a burst after a slow first
token inflates it), the server's own timing of the request (`timings.predicted_per_second`),
and its /metrics counters over the request (tokens_predicted_total over
tokens_predicted_seconds_total).

With --probe-prompt-file, a fixed greedy completion's tokens and top log-probabilities are
recorded (the quality probe; --probe-only: nothing else, for a converged host):
voltafleet.models.probe.compare judges each instance against the golden probe.
"""
from __future__ import annotations

import argparse
import http.client
import json
import re
import shutil
import subprocess
import sys
import threading
import time

PROMPT = ("You are a helpful assistant running on a fleet of GPU servers. "
          "Describe in a few sentences how a load balancer spreads requests over many servers.")
OFFLOAD_RE = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
# Sampled on the host during the measurement; R535+ calls the last field clocks_event_reasons,
# older drivers clocks_throttle_reasons (R580 answers both): tried in this order.
GPU_QUERY = "index,serial,clocks.sm,clocks.mem,temperature.gpu,power.draw,"
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
# NVML's clock event (throttle) reason bits, named as `nvidia-smi -q` names them (lower case, _)
THROTTLE_BITS = {0x1: "idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                 0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}
# sched_reserve at -lv 4: "graph: nodes = N, splits = S" or, when the prompt and decode graphs
# differ, "graph (pp bs=512, tg bs=4): nodes = N / M, splits = S / T"
SPLITS_RE = re.compile(r"sched_reserve: graph[^:]*: nodes = [\d /]+, splits = (\d+)(?: / (\d+))?")


def graph_splits(log: str) -> list[int]:
    """Every split count the scheduler logged (both of a "S / T" pair), in log order."""
    return [int(n) for m in SPLITS_RE.finditer(log) for n in m.groups() if n is not None]


# ---------------------------------------------------------------- client (runs on the host)


HOST = ["127.0.0.1"]  # --host: the address the servers bind (the host's own)


def _request(port: int, method: str, path: str, body: dict | None, key: str | None,
             timeout: float = 600) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection(HOST[0], port, timeout=timeout)
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


def client_rate(t0: float, first: float, last: float, chunks: int, predicted: int,
                prompt_ms: float | None) -> float | None:
    """The client's decode tok/s: the tokens over the time from the request to the last token, less
    the server's own prompt time. Not (chunks - 1) / (last - first): a stream that reaches the client
    in a burst (a busy host's client scheduled late, a buffering proxy) has its first and last token
    a few microseconds apart, and that rate (100,000+ tok/s) is no decode rate at all. Without the
    server's prompt time, the whole request's span (a lower bound on the rate)."""
    span = (last - t0) - (prompt_ms or 0) / 1000
    if chunks < 2 or span <= 0:
        return None
    return predicted / span


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
    prompt_ms = final.get("timings", {}).get("prompt_ms")
    return {
        "ttft_ms": (first - t0) * 1000,
        "tokens": predicted,
        "chunks": n,
        "start": t0, "end": last,
        "decode_tps": client_rate(t0, first, last, n, predicted, prompt_ms),
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
    data = json.loads(r.read() or b"{}")
    if r.status != 200:
        why = (data.get("error") or {}).get("message") if isinstance(data.get("error"), dict) else data.get("error")
        raise RuntimeError(f"probe on port {port}: HTTP {r.status}" + (f": {why}" if why else ""))
    steps = data.get("completion_probabilities") or []
    return {"prompt": prompt, "text": data.get("content", ""),
            "prompt_n": data.get("tokens_evaluated") or (data.get("timings") or {}).get("prompt_n"),
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


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # [N/A], [Not Supported]
        return None


def parse_gpu_sample(line: str, at: float = 0.0) -> dict | None:
    """One line of the --query-gpu sample: {"index", "serial", "sm", "mem", "temp", "power", "reasons"}."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 7 or not parts[0].isdigit():
        return None
    mask = int(parts[6], 16) if parts[6].lower().startswith("0x") else 0
    return {"at": at, "index": int(parts[0]), "serial": parts[1], "sm": _float(parts[2]), "mem": _float(parts[3]),
            "temp": _float(parts[4]), "power": _float(parts[5]),
            "reasons": [name for bit, name in THROTTLE_BITS.items() if mask & bit]}


class GpuSampler(threading.Thread):
    """nvidia-smi's clocks, temperature, power and throttle reasons of every GPU, every
    `interval` seconds while the measurement runs (`.samples`)."""

    def __init__(self, interval: float):
        super().__init__(daemon=True)
        self.interval, self.samples, self.stopped = interval, [], threading.Event()
        self.fields = list(REASON_FIELDS)

    def sample(self) -> None:
        while self.fields:
            cmd = ["nvidia-smi", "--query-gpu=" + GPU_QUERY + self.fields[0], "--format=csv,noheader,nounits"]
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            except (OSError, subprocess.SubprocessError):
                return
            if out.returncode == 0:
                now = time.monotonic()
                self.samples += [s for s in (parse_gpu_sample(line, now) for line in out.stdout.splitlines()) if s]
                return
            self.fields.pop(0)  # a driver that does not know this field name: try the older one

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.sample()


def gpu_summary(samples: list[dict], index: int) -> dict | None:
    """GPU `index` over the samples: clocks under load (samples without the idle reason),
    the highest temperature and power, every throttle reason seen. None without samples."""
    mine = [s for s in samples if s["index"] == index]
    if not mine:
        return None
    busy = [s for s in mine if "idle" not in s["reasons"]] or mine

    def avg(key, rows):
        vals = [r[key] for r in rows if r[key] is not None]
        return round(sum(vals) / len(vals), 1) if vals else None

    return {"index": index, "serial": mine[-1]["serial"], "samples": len(mine),
            "sm_clock_mhz": avg("sm", busy), "sm_clock_min_mhz": min((s["sm"] for s in busy if s["sm"]), default=None),
            "mem_clock_mhz": avg("mem", busy), "power_w": avg("power", busy),
            "power_max_w": max((s["power"] for s in mine if s["power"] is not None), default=None),
            "temperature_max_c": max((s["temp"] for s in mine if s["temp"] is not None), default=None),
            "reasons": sorted({r for s in mine for r in s["reasons"]})}


def probes(port: int, key: str | None, prompts: dict, tokens: int) -> dict:
    """Each named probe prompt's probe ({"probe": short, "probe_long": long}), in that order."""
    return {name: probe(port, key, text, tokens) for name, text in prompts.items() if text}


def measure(port: int, tokens: int, parallel: int, key: str | None, health_timeout: float,
            unit: str | None, probe_prompts: dict | None = None, probe_tokens: int = 16) -> dict:
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
    out.update(probes(port, key, probe_prompts or {}, probe_tokens))
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
    p.add_argument("--host", default="127.0.0.1", help="the address the servers bind (default 127.0.0.1)")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--health-timeout", type=float, default=600)
    p.add_argument("--api-key-file")
    p.add_argument("--unit-prefix", help="systemd unit prefix, e.g. llama-server@ (instance = index)")
    p.add_argument("--probe-prompt-file", help="record the quality probe for this prompt (greedy)")
    p.add_argument("--probe-long-prompt-file", help="the long probe (a prompt of 512+ tokens: the 64+ token path)")
    p.add_argument("--probe-tokens", type=int, default=16)
    p.add_argument("--probe-only", action="store_true", help="only the quality probe (a converged host)")
    p.add_argument("--gpu-sample-interval", type=float, default=1.0,
                   help="sample every GPU with nvidia-smi this often (s) while measuring; 0: never")
    a = p.parse_args(argv)
    HOST[0] = a.host
    prompts = {name: open(f).read() for name, f in (("probe", a.probe_prompt_file),
                                                     ("probe_long", a.probe_long_prompt_file)) if f}
    key = open(a.api_key_file).read().strip() if a.api_key_file else None
    report = {"instances": []}
    sampler = GpuSampler(a.gpu_sample_interval) if a.gpu_sample_interval > 0 and shutil.which("nvidia-smi") else None
    if sampler:
        sampler.start()
    for i, port in enumerate(a.port):
        unit = f"{a.unit_prefix}{i}.service" if a.unit_prefix else None
        first = len(sampler.samples) if sampler else 0
        try:
            if a.probe_only:
                m = {"port": port, "health_s": wait_health(port, min(a.health_timeout, 30)),
                     **probes(port, key, prompts, a.probe_tokens)}
            else:
                m = measure(port, a.tokens, a.parallel, key, a.health_timeout, unit, prompts, a.probe_tokens)
        except Exception as e:
            m = {"port": port, "error": f"{type(e).__name__}: {e}"}
        m["instance"] = i
        if sampler:  # instance i serves GPU i (CUDA_VISIBLE_DEVICES)
            sampler.sample()
            m["gpu"] = gpu_summary(sampler.samples[first:], i)
        report["instances"].append(m)
    if sampler:
        sampler.stopped.set()
    json.dump(report, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
