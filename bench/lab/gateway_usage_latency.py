"""The latency the gateway adds to streams, its usage filter included (issue 39): N concurrent
streamed chat answers straight to a llama-server and through the gateway, in turn, round after
round; time to first token (TTFT) and the gap between tokens, median and p95 of each.

    .venv/bin/python -m bench.lab.gateway_usage_latency --local            # this machine: llama-server + HAProxy
    .venv/bin/python -m bench.lab.gateway_usage_latency --direct http://127.0.0.1:18010 \
        --gateway http://127.0.0.1:18800 --key "$TEAM_KEY"                # any fleet reached on loopback

--local starts the pinned llama-server and three gateways in front of it from the project's
template (tests/gateway_local/harness.py): with teams and the usage filter, and the same
configuration without its `filter` line and the request rewrite it completes, so their own cost
is told apart from HAProxy's.
Loopback only; every loop is bounded (--rounds x --streams requests of --tokens tokens).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx

ALLOWED_HOSTS = ("127.0.0.1", "localhost", "::1")
MESSAGES = [{"role": "user", "content": "Tell me about load balancers."}]


def one_stream(url: str, key: str | None, tokens: int, out: list, barrier: threading.Barrier) -> None:
    """One streamed chat answer: its TTFT and every gap between two events, in ms (an error: its record)."""
    try:
        _one_stream(url, key, tokens, out, barrier)
    except Exception as e:  # noqa: BLE001 (said, never hidden)
        out.append({"error": f"{type(e).__name__}: {e}"[:200]})


def _one_stream(url: str, key: str | None, tokens: int, out: list, barrier: threading.Barrier) -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"messages": MESSAGES, "max_tokens": tokens, "stream": True, "ignore_eos": True, "temperature": 0}
    with httpx.Client(base_url=url, headers=headers, timeout=300) as c:
        barrier.wait()
        t0 = time.monotonic()
        stamps = []
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                out.append({"error": f"HTTP {r.status_code}: {r.read()[:200]!r}"})
                return
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    stamps.append(time.monotonic())
    out.append({"ttft": (stamps[0] - t0) * 1000, "gaps": [(b - a) * 1000 for a, b in zip(stamps, stamps[1:])]})


def round_of(url: str, key: str | None, streams: int, tokens: int) -> list[dict]:
    """`streams` answers at once (they start together)."""
    out: list[dict] = []
    barrier = threading.Barrier(streams)
    threads = [threading.Thread(target=one_stream, args=(url, key, tokens, out, barrier)) for _ in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [r["error"] for r in out if "error" in r]
    if len(out) != streams or errors:
        raise RuntimeError(f"{url}: {streams - len(out) + len(errors)} streams failed: {errors[:1]}")
    return out


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def summary(results: list[dict]) -> dict:
    ttft = [r["ttft"] for r in results]
    gaps = [g for r in results for g in r["gaps"]]
    return {"streams": len(results), "ttft_p50_ms": statistics.median(ttft), "ttft_p95_ms": pct(ttft, 95),
            "gap_p50_ms": statistics.median(gaps), "gap_p95_ms": pct(gaps, 95), "gaps": len(gaps)}


def measure(targets: dict[str, tuple[str, str | None]], rounds: int, streams: int, tokens: int) -> dict[str, dict]:
    """Each target's rounds, interleaved (a drift of the machine touches them all alike)."""
    got: dict[str, list] = {name: [] for name in targets}
    for name, (url, key) in targets.items():  # a warm-up round each, not counted
        round_of(url, key, streams, 4)
    for _ in range(rounds):
        for name, (url, key) in targets.items():
            got[name] += round_of(url, key, streams, tokens)
    return {name: summary(r) for name, r in got.items()}


def report(s: dict[str, dict], base: str) -> None:
    print(f"{'target':<22}{'streams':>8}{'TTFT p50':>10}{'p95':>8}{'gap p50':>10}{'p95':>8}   vs {base} (p50)")
    for name, v in s.items():
        d_ttft, d_gap = v["ttft_p50_ms"] - s[base]["ttft_p50_ms"], v["gap_p50_ms"] - s[base]["gap_p50_ms"]
        print(f"{name:<22}{v['streams']:>8}{v['ttft_p50_ms']:>10.1f}{v['ttft_p95_ms']:>8.1f}{v['gap_p50_ms']:>10.2f}"
              f"{v['gap_p95_ms']:>8.2f}   TTFT {d_ttft:+.1f} ms, gap {d_gap:+.2f} ms")


def local_targets(tmp: Path, streams: int):
    """The harness's llama-server and gateway, and a second gateway without the filter line."""
    import subprocess

    from tests.gateway_local import harness
    from voltafleet.front import teams

    why = harness.missing()
    if why:
        sys.exit(f"--local: {why}")
    g = harness.Local(tmp, {"bench": "key-bench"}, slots=streams).start()
    bare = tmp / "bare"
    bare.mkdir()
    port = harness.BASE_PORT + 3
    text = harness.config(bare, {"bench": "key-bench"}, g.server_port, port, port + 1)
    # the request rewrite goes too: it grows Content-Length and the filter writes the member in
    bare_text = text.replace(f"    filter lua.{teams.USAGE_FILTER}\n", "").replace("    http-request lua.vf_rewrite\n", "")
    assert bare_text.count("\n") == text.count("\n") - 2, "the filter and rewrite lines moved"
    (bare / "haproxy.cfg").write_text(bare_text)
    g.procs.append(subprocess.Popen(["haproxy", "-db", "-f", str(bare / "haproxy.cfg")],
                                    stdout=open(bare / "haproxy.log", "wb"), stderr=subprocess.STDOUT))
    harness.wait_http(f"http://127.0.0.1:{port + 1}/metrics", 30)
    targets = {"direct": (g.direct, None), "gateway (no filter)": (f"http://127.0.0.1:{port}", "key-bench"),
               "gateway (usage filter)": (g.gateway, "key-bench")}
    return g, targets


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--local", action="store_true", help="start llama-server and the gateways on this machine")
    ap.add_argument("--direct", help="a llama-server's URL")
    ap.add_argument("--gateway", help="the gateway's URL")
    ap.add_argument("--key", help="a team's key for the gateway")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    local = None
    if a.local:
        local, targets = local_targets(Path(tempfile.mkdtemp(prefix="vf-usage-bench-")), a.streams)
    else:
        if not (a.direct and a.gateway):
            ap.error("give --local, or --direct and --gateway")
        for u in (a.direct, a.gateway):
            if urlparse(u).hostname not in ALLOWED_HOSTS:
                ap.error(f"{u}: loopback only")
        targets = {"direct": (a.direct, None), "gateway": (a.gateway, a.key)}
    try:
        s = measure(targets, a.rounds, a.streams, a.tokens)
    finally:
        if local:
            local.stop()
    print(f"{a.streams} concurrent streams x {a.rounds} rounds, {a.tokens} tokens each (chat, streamed)")
    report(s, "direct")
    return 0


if __name__ == "__main__":
    sys.exit(main())
