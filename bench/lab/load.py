"""A bounded load of completions through the gateway (loopback only) from pooled keep-alive
clients, as users send it: each client an httpx.Client (a connection pool, its keep-alive
connection reused) or the OpenAI Python SDK (`max_retries=0`), streamed and non-streamed
requests in turn. For tests
and for the numbers of a rollout: requests served, failed, cut, refused busy, and TTFT
percentiles.

    .venv/bin/python -m bench.lab.load --url http://10.231.0.10:18800 --clients 8 --seconds 60 \
        [--client httpx|openai] [--during "python -m rollout inventory/lab.py --batch 1"]

Outcomes are told apart: `cut` is a stream that started and broke (an instance that crashed
mid-stream); `busy` a deliberate 503 from the gateway (no free slot within its queue
timeout, with Retry-After); `failed` anything else (a connection closed without a response,
an HTTP error). Every loop is bounded: at most --max-requests in all and --seconds of wall time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse

import httpx

ALLOWED_HOSTS = ("127.0.0.1", "localhost", "::1")
LAB_NETWORK = "10.231.0."  # the lab's private bridge (lab/fleet.py LAB_NET): only this machine reaches it
PROMPT = "Tell me about load balancers."


# answers that refuse a request on purpose, with Retry-After: the fleet busy (the gateway's queue
# timed out), the team over its limit (gateway_teams)
REFUSED = {503: "busy", 429: "limited"}


def refused(rec: dict, status: int, headers) -> None:
    """Mark a request the gateway refused on purpose, and when it may be tried again."""
    if status in REFUSED:
        rec["outcome"], rec["retry_after"] = REFUSED[status], headers.get("retry-after")


class Load:
    """`clients` threads sending completions until stop() (or the bounds), over one pool."""

    def __init__(self, url: str, clients: int = 4, tokens: int = 32, seconds: float = 120,
                 max_requests: int = 5000, key: str | None = None, client: str = "httpx",
                 body: dict | None = None, headers: dict | None = None, streams_only: bool = False,
                 model: str = "qwen3.6-27b", honor_retry_after: bool = False, pause_s: float = 0.0):
        u = urlparse(url)
        if u.hostname not in ALLOWED_HOSTS and not (u.hostname or "").startswith(LAB_NETWORK):
            raise ValueError(f"load only goes to this machine's loopback or the lab's bridge, not {u.hostname}")
        if client not in ("httpx", "openai"):
            raise ValueError(f"client {client!r}: httpx or openai")
        self.url, self.kind = url.rstrip("/"), client
        self.clients, self.tokens, self.seconds, self.max_requests, self.key = clients, tokens, seconds, max_requests, key
        self.body, self.headers = body or {}, headers or {}
        self.streams_only = streams_only  # every request streamed (else streamed and not in turn)
        self.model = model  # the fleet's server_model_alias: the gateway refuses another name (model_not_found)
        self.honor_retry_after = honor_retry_after  # a client sleeps Retry-After after a 429 or 503, then goes on
        self.pause_s = pause_s  # a client's think time between two requests (its connection stays pooled, idle)
        self.results: list[dict] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.aborting = threading.Event()  # abort(): each stream is closed by its own thread at its next chunk
        self.threads: list[threading.Thread] = []
        self.n = 0
        self.local = threading.local()
        self.pools: list[httpx.Client] = []
        self.running: dict[int, float] = {}  # the requests in flight: id -> when each began (time.time())

    # a pool a client thread, as each worker of an application holds its client: its keep-alive
    # connection is reused request after request. Not one pool shared by the threads: httpcore
    # 1.0.9's shared pool can close a connection another thread was just handed (encode/httpcore
    # #1110, open): that request then fails with EBADF (seen once in 10,017 requests), a client bug
    # that would be counted against the gateway.
    @property
    def http(self) -> httpx.Client:
        if not hasattr(self.local, "http"):
            auth = {"Authorization": f"Bearer {self.key}"} if self.key else {}
            self.local.http = httpx.Client(base_url=self.url, headers=auth, timeout=httpx.Timeout(120, connect=10),
                                           limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))
            with self.lock:
                self.pools.append(self.local.http)
        return self.local.http

    @property
    def sdk(self):
        if self.kind != "openai":
            return None
        if not hasattr(self.local, "sdk"):
            from openai import OpenAI

            self.local.sdk = OpenAI(base_url=self.url + "/v1", api_key=self.key or "none", max_retries=0, timeout=120,
                                    http_client=self.http)
        return self.local.sdk

    # ---------------------------------------------------------------- one request

    def one(self, stream: bool) -> dict:
        t0 = time.monotonic()
        rec = {"start": time.time(), "ok": False, "ttft_ms": None, "tokens": 0, "error": None, "outcome": "failed",
               "stream": stream}
        with self.lock:
            self.running[id(rec)] = rec["start"]
        try:
            (self._sdk if self.sdk else self._httpx)(rec, t0, stream)
        except Exception as e:  # counted: failed, cut or busy
            rec["error"] = f"{type(e).__name__}: {e}"[:200]
            if rec["outcome"] not in REFUSED.values():  # a stream the server had begun to answer, then broke: cut
                rec["outcome"] = "cut" if rec.get("started") else "failed"
        finally:
            rec["end"] = time.time()
            with self.lock:
                self.running.pop(id(rec), None)
        return rec

    def in_flight(self, began_within_s: float) -> int:
        """How many requests are in flight that began at most `began_within_s` ago."""
        now = time.time()
        with self.lock:
            return sum(now - t <= began_within_s for t in self.running.values())

    def wait_in_flight(self, began_within_s: float, seconds: float = 10) -> None:
        """Until a request that began at most `began_within_s` ago is in flight (a moment to break something under
        load: identical requests batched together end together, and the clients can all be between two at once)."""
        deadline = time.monotonic() + seconds
        while self.in_flight(began_within_s) == 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no request began in flight within {began_within_s:g} s for {seconds:g} s")
            time.sleep(0.002)

    def _httpx(self, rec: dict, t0: float, stream: bool) -> None:
        body = {"prompt": PROMPT, "n_predict": self.tokens, "stream": stream, "ignore_eos": True,
                "temperature": 0, **self.body}
        if not stream:
            r = self.http.post("/completion", json=body, headers=self.headers)
            self._status(rec, r)
            rec["ttft_ms"] = (time.monotonic() - t0) * 1000
            rec["tokens"] = r.json().get("tokens_predicted", 0)
            rec["ok"], rec["outcome"] = True, "ok"
            return
        with self.http.stream("POST", "/completion", json=body, headers=self.headers) as r:
            if r.status_code != 200:
                r.read()
            self._status(rec, r)
            rec["started"], done = True, False
            for line in r.iter_lines():
                self._aborted()
                if not line.startswith("data:"):
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("content"):
                    rec["ttft_ms"] = rec["ttft_ms"] or (time.monotonic() - t0) * 1000
                    rec["tokens"] += 1
                done = done or bool(chunk.get("stop"))
            # read to the response's end, as a client does: a response left unread closes its
            # connection, and the next request would open a new one (no keep-alive for streams)
        if not done:
            raise RuntimeError("stream ended before its last chunk")
        rec["ok"], rec["outcome"] = True, "ok"

    def _sdk(self, rec: dict, t0: float, stream: bool) -> None:
        from openai import APIStatusError

        try:
            out = self.sdk.completions.create(model=self.model, prompt=PROMPT, max_tokens=self.tokens, temperature=0,
                                              stream=stream, extra_body={"ignore_eos": True, **self.body},
                                              extra_headers=self.headers)
            if not stream:
                rec["ttft_ms"] = (time.monotonic() - t0) * 1000
                rec["tokens"] = out.usage.completion_tokens if out.usage else 0
            else:
                rec["started"], finished = True, False
                with out:  # closed here, by this thread, however the loop ends
                    for chunk in out:
                        self._aborted()
                        if chunk.choices and chunk.choices[0].text:
                            rec["ttft_ms"] = rec["ttft_ms"] or (time.monotonic() - t0) * 1000
                            rec["tokens"] += 1
                        finished = finished or bool(chunk.choices and chunk.choices[0].finish_reason)
                if not finished:
                    raise RuntimeError("stream ended before its last chunk")
        except APIStatusError as e:
            refused(rec, e.status_code, e.response.headers)
            raise
        rec["ok"], rec["outcome"] = True, "ok"

    def _aborted(self) -> None:
        if self.aborting.is_set():
            raise RuntimeError("stream closed by the client (Load.abort)")

    def _status(self, rec: dict, r) -> None:
        refused(rec, r.status_code, r.headers)
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}")

    # ---------------------------------------------------------------- the load

    def _client(self, deadline: float) -> None:
        while not self.stopping.is_set() and time.monotonic() < deadline:
            with self.lock:
                if self.n >= self.max_requests:
                    return
                self.n += 1
                stream = self.streams_only or self.n % 2 == 1  # streamed and non-streamed in turn
            rec = self.one(stream)
            with self.lock:
                self.results.append(rec)
            if self.honor_retry_after and rec.get("retry_after"):
                self.stopping.wait(min(float(rec["retry_after"]), max(0.0, deadline - time.monotonic())))
            if self.pause_s:
                self.stopping.wait(min(self.pause_s, max(0.0, deadline - time.monotonic())))

    def start(self) -> "Load":
        deadline = time.monotonic() + self.seconds
        self.threads = [threading.Thread(target=self._client, args=(deadline,), daemon=True)
                        for _ in range(self.clients)]
        for t in self.threads:
            t.start()
        return self

    def wait(self, timeout: float | None = None) -> None:
        for t in self.threads:
            t.join(timeout=timeout)

    def stop(self) -> dict:
        """Stop sending: every request in flight is finished (the figures count it), then the pools close."""
        self.stopping.set()
        self.wait(timeout=150)
        for pool in self.pools:
            pool.close()
        return summary(self.results)

    def abort(self, seconds: float = 30) -> int:
        """Stop now, for a load that only kept the fleet busy: each client thread closes its stream at its next
        chunk (the gateway and the servers see their clients go, and stop generating); a whole answer in flight
        ends as it would. Nothing is counted. Not for a load whose figures a test judges: that is stop().
        Returns the client threads still in a request after `seconds` (their pools are left open).

        Each thread closes its own stream. This used to close the pools under the threads' reads, a race on the
        socket's descriptor; the one run where test_api's abort took 62 s (two 30 s joins) happened that way."""
        self.aborting.set()
        self.stopping.set()
        deadline = time.monotonic() + seconds
        for t in self.threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        alive = sum(t.is_alive() for t in self.threads)
        if not alive:  # never under a request still in flight
            for pool in self.pools:
                pool.close()
        return alive


def summary(results: list[dict]) -> dict:
    ok = [r for r in results if r["ok"]]
    ttft = sorted(r["ttft_ms"] for r in ok if r["ttft_ms"] is not None and r.get("stream", True))

    def pct(p):
        return round(ttft[min(len(ttft) - 1, int(p / 100 * len(ttft)))], 1) if ttft else None

    count = {k: sum(r.get("outcome") == k for r in results) for k in ("failed", "cut", *REFUSED.values())}
    return {"requests": len(results), "served": len(ok), **count,
            "ttft_p50_ms": pct(50), "ttft_p95_ms": pct(95), "ttft_p99_ms": pct(99),
            "ttft_mean_ms": round(statistics.mean(ttft), 1) if ttft else None,
            "errors": sorted({r["error"] for r in results if r["error"]})[:5]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://10.231.0.10:18800")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--client", default="httpx", choices=["httpx", "openai"])
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--model", default="qwen3.6-27b", help="the fleet's server_model_alias")
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--max-requests", type=int, default=5000)
    p.add_argument("--during", help="a command to run while the load runs (e.g. a rolling rollout)")
    a = p.parse_args()
    load = Load(a.url, a.clients, a.tokens, a.seconds, a.max_requests, client=a.client, model=a.model).start()
    rc = 0
    t0 = time.monotonic()
    if a.during:
        rc = subprocess.run(a.during, shell=True).returncode
    else:
        load.wait(timeout=a.seconds + 150)
    s = load.stop()
    s["seconds"] = round(time.monotonic() - t0, 1)
    s["during_rc"] = rc
    print(json.dumps(s, indent=1))
    print(f"{a.client}, {a.clients} clients: served {s['served']}, failed {s['failed']}, cut {s['cut']}, "
          f"busy {s['busy']}, TTFT p50 {s['ttft_p50_ms']} ms, p95 {s['ttft_p95_ms']} ms, p99 {s['ttft_p99_ms']} ms "
          f"over {s['seconds']} s" + (f" (during: exit {rc})" if a.during else ""))
    return 0 if s["failed"] == 0 and s["cut"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
