"""A bounded load of streamed completions through the gateway (loopback only), for tests
and for the numbers of a rollout: requests served, failed, p50/p95 time to first token.

    .venv/bin/python bench/load.py --url http://127.0.0.1:18800 --clients 4 --seconds 60 \
        [--during "python -m rollout inventory/lab.py --batch 1"]

Every loop is bounded: at most --max-requests in all and --seconds of wall time.
"""
from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse

ALLOWED_HOSTS = ("127.0.0.1", "localhost", "::1")


class Load:
    """Clients streaming /completion requests until stop() (or the bounds)."""

    def __init__(self, url: str, clients: int = 4, tokens: int = 32, seconds: float = 120,
                 max_requests: int = 5000, key: str | None = None):
        u = urlparse(url)
        if u.hostname not in ALLOWED_HOSTS:
            raise ValueError(f"load only goes to this machine's loopback, not {u.hostname}")
        self.host, self.port = u.hostname, u.port or 80
        self.clients, self.tokens, self.seconds, self.max_requests, self.key = clients, tokens, seconds, max_requests, key
        self.results: list[dict] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []

    def one(self) -> dict:
        t0 = time.monotonic()
        rec = {"start": time.time(), "ok": False, "ttft_ms": None, "tokens": 0, "error": None}
        try:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            headers = {"Content-Type": "application/json"}
            if self.key:
                headers["Authorization"] = f"Bearer {self.key}"
            body = {"prompt": "Tell me about load balancers.", "n_predict": self.tokens, "stream": True,
                    "ignore_eos": True, "temperature": 0, "cache_prompt": False}
            conn.request("POST", "/completion", json.dumps(body), headers)
            r = conn.getresponse()
            if r.status != 200:
                rec["error"] = f"HTTP {r.status}"
                return rec
            stopped = False
            for raw in r:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("content") and rec["ttft_ms"] is None:
                    rec["ttft_ms"] = (time.monotonic() - t0) * 1000
                if chunk.get("content"):
                    rec["tokens"] += 1
                if chunk.get("stop"):
                    stopped = True
                    break
            rec["ok"] = stopped
            if not stopped:
                rec["error"] = "stream ended early"
        except Exception as e:  # counted as a failed request
            rec["error"] = f"{type(e).__name__}: {e}"
        finally:
            rec["end"] = time.time()
        return rec

    def _client(self, deadline: float) -> None:
        while not self.stopping.is_set() and time.monotonic() < deadline:
            with self.lock:
                if len(self.results) >= self.max_requests:
                    return
            rec = self.one()
            with self.lock:
                self.results.append(rec)

    def start(self) -> "Load":
        deadline = time.monotonic() + self.seconds
        self.threads = [threading.Thread(target=self._client, args=(deadline,), daemon=True)
                        for _ in range(self.clients)]
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> dict:
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=90)
        return summary(self.results)


def summary(results: list[dict]) -> dict:
    ok = [r for r in results if r["ok"]]
    ttft = sorted(r["ttft_ms"] for r in ok if r["ttft_ms"] is not None)

    def pct(p):
        return round(ttft[min(len(ttft) - 1, int(p / 100 * len(ttft)))], 1) if ttft else None

    return {"requests": len(results), "served": len(ok), "failed": len(results) - len(ok),
            "ttft_p50_ms": pct(50), "ttft_p95_ms": pct(95),
            "ttft_mean_ms": round(statistics.mean(ttft), 1) if ttft else None,
            "errors": sorted({r["error"] for r in results if r["error"]})[:5]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:18800")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--max-requests", type=int, default=5000)
    p.add_argument("--during", help="a command to run while the load runs (e.g. a rolling rollout)")
    a = p.parse_args()
    load = Load(a.url, a.clients, a.tokens, a.seconds, a.max_requests).start()
    rc = 0
    t0 = time.monotonic()
    if a.during:
        rc = subprocess.run(a.during, shell=True).returncode
    else:
        time.sleep(a.seconds)
    s = load.stop()
    s["seconds"] = round(time.monotonic() - t0, 1)
    s["during_rc"] = rc
    print(json.dumps(s, indent=1))
    print(f"served {s['served']}, failed {s['failed']}, TTFT p50 {s['ttft_p50_ms']} ms, p95 {s['ttft_p95_ms']} ms "
          f"over {s['seconds']} s" + (f" (during: exit {rc})" if a.during else ""))
    return 0 if s["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
