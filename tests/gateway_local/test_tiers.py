"""Tiers routed per team (issue 41 item 2), through the project's own gateway (template, maps and
Lua of this machine's HAProxy) in front of two real llama-servers of the pinned build: the
throughput tier (16 slots, backend `llama`) and a latency tier (1 slot, backend `llama_latency`).

- web: the throughput tier only; ide: the latency tier, overflowing to throughput when it is full
  (gateway_tier_overflow's default); chat: throughput, may ask for latency by header, refuses to
  overflow (it waits in the latency tier's queue, then gets that tier's 503 with Retry-After).

Where a request went is read from HAProxy's own counters (`show stat`: each server's stot) and
the servers' own (/metrics: tokens predicted), never from the answer alone. Skipped where haproxy
or the pinned llama-server is not on this machine."""
from __future__ import annotations

import concurrent.futures
import re
import threading
import time

import httpx
import openai
import pytest

from tests.gateway_local import harness
from voltafleet.front import gateway

KEYS = {"web": "key-web", "ide": "key-ide", "chat": "key-chat"}
FIELDS = {"ide": {"tier": "latency"}, "chat": {"tiers": ["throughput", "latency"], "overflow": "refuse"}}
QUEUE_S, RETRY_S = 3, 7
THROUGHPUT, LATENCY = "local-0", "latency-0"  # the servers (<host>-<index>; the harness's hosts)


@pytest.fixture(scope="module")
def tg(tmp_path_factory):
    harness.require()
    # one thread a server: two servers share this machine's cores (spinning threads of both would stall each other)
    # 32K tokens a slot: a stream that holds the latency tier's slot outlasts a test (Hold)
    g = harness.Local(tmp_path_factory.mktemp("tiers"), KEYS, slots=4, ctx_per_slot=32768, budgets=FIELDS,
                      tiers={"latency": 1}, threads=1,
                      over={"gateway_queue_timeout_s": QUEUE_S, "gateway_retry_after_s": RETRY_S,
                            "gateway_check_interval_ms": 500})
    try:
        yield g.start()
    finally:
        g.stop()


def client(g, team: str, **headers) -> httpx.Client:
    return httpx.Client(base_url=g.gateway, headers={"Authorization": f"Bearer {KEYS[team]}", **headers}, timeout=120)


def body(n: int = 8, prompt: str = "Once upon a time", stream: bool = False) -> dict:
    return {"prompt": prompt, "n_predict": n, "ignore_eos": True, "stream": stream}


def served(g) -> dict[str, tuple[str, int, int]]:
    """{server: (its backend, requests it got (stot), in flight (scur))} from HAProxy's runtime API."""
    rows = gateway.server_rows(g.admin("show stat"))
    return {name: (row["pxname"], int(row["stot"] or 0), int(row["scur"] or 0)) for name, row in rows.items()}


def got(g, before) -> dict[str, int]:
    """Requests each server got since `before` (a served() reading)."""
    return {name: stot - before[name][1] for name, (_, stot, _) in served(g).items()}


def predicted(url: str) -> float:
    """llama-server's own count of the tokens it generated (--metrics)."""
    return float(re.search(r"^llamacpp:tokens_predicted_total (\S+)$", httpx.get(url + "/metrics", timeout=10).text,
                           re.M).group(1))


def test_each_tier_is_its_own_backend_and_every_team_reaches_only_its_tiers_servers(tg):
    s = served(tg)
    assert (s[THROUGHPUT][0], s[LATENCY][0]) == ("llama", "llama_latency")  # one backend a tier
    before, lat, thr = served(tg), predicted(tg.tier_direct("latency")), predicted(tg.direct)
    u0 = tg.team_counters("ide")
    with client(tg, "ide") as c:
        for i in range(3):
            r = c.post("/completion", json=body(8, f"Tell me about {i}"))
            assert r.status_code == 200 and r.headers["x-voltafleet-tier"] == "latency", r.text
    time.sleep(0.3)
    assert got(tg, before) == {THROUGHPUT: 0, LATENCY: 3}
    assert (predicted(tg.tier_direct("latency")) - lat, predicted(tg.direct) - thr) == (24, 0)
    u1 = tg.team_counters("ide")  # usage counted on the latency tier as on throughput
    assert (u1["requests_total"] - u0.get("requests_total", 0), u1["completion_tokens_total"]
            - u0.get("completion_tokens_total", 0)) == (3, 24)
    before = served(tg)
    for team in ("web", "chat"):  # their tier: throughput
        with client(tg, team) as c:
            r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
            assert r.status_code == 200 and r.headers["x-voltafleet-tier"] == "throughput", r.text
    assert got(tg, before) == {THROUGHPUT: 2, LATENCY: 0}


def test_a_team_asks_for_another_tier_by_header_only_if_it_is_allowed(tg):
    before = served(tg)
    with client(tg, "chat", **{"X-Voltafleet-Tier": "latency"}) as c:
        r = c.post("/completion", json=body())
    assert r.status_code == 200 and r.headers["x-voltafleet-tier"] == "latency"
    assert got(tg, before) == {THROUGHPUT: 0, LATENCY: 1}
    before, lat = served(tg), predicted(tg.tier_direct("latency"))
    with client(tg, "web", **{"X-Voltafleet-Tier": "latency"}) as c:
        r = c.post("/completion", json=body())
    assert r.status_code == 403 and r.json() == {"error": {
        "message": "Your team web may not use the tier named in X-Voltafleet-Tier: its tiers are throughput",
        "type": "invalid_request_error", "param": None, "code": "tier_not_allowed"}}
    sdk = openai.OpenAI(base_url=tg.gateway + "/v1", api_key=KEYS["web"], max_retries=0,
                        default_headers={"X-Voltafleet-Tier": "latency"})
    with pytest.raises(openai.PermissionDeniedError) as e:  # what an SDK client sees
        sdk.completions.create(model=harness.ALIAS, prompt="hi", max_tokens=2)
    assert e.value.code == "tier_not_allowed"
    for team in ("web", "chat"):  # a tier the fleet does not serve: 400, whoever asks
        with client(tg, team, **{"X-Voltafleet-Tier": "gpu"}) as c:
            r = c.post("/completion", json=body())
        assert r.status_code == 400 and r.json()["error"]["code"] == "tier_not_found"
        assert "it serves throughput, latency" in r.json()["error"]["message"]
    time.sleep(0.3)
    assert got(tg, before) == {THROUGHPUT: 0, LATENCY: 0}  # no refused request reached a server
    assert predicted(tg.tier_direct("latency")) == lat


class Hold:
    """A long stream of team ide holding the latency tier's one slot until release()."""

    def __init__(self, g):
        self.g, self.started, self.stop = g, threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.cut = False

    def run(self):
        with client(self.g, "ide") as c:
            with c.stream("POST", "/completion", json=body(100000, stream=True)) as r:
                assert r.headers["x-voltafleet-tier"] == "latency"
                for _ in r.iter_lines():
                    self.started.set()
                    if self.stop.is_set():
                        self.cut = True
                        return  # the client goes away: the gateway closes the server side, the slot frees

    def __enter__(self):
        self.thread.start()
        assert self.started.wait(60)
        assert served(self.g)[LATENCY][2] == 1  # the tier's one slot is in use: maxconn 1
        return self

    def release(self):
        self.stop.set()
        self.thread.join(30)
        assert self.cut, "the stream ended by itself: the slot was not held throughout"
        deadline = time.monotonic() + 30
        while served(self.g)[LATENCY][2] and time.monotonic() < deadline:
            time.sleep(0.1)

    def __exit__(self, *exc):
        self.release()


def test_a_full_tier_overflows_to_throughput_or_refuses_with_retry_after_as_configured(tg):
    with Hold(tg):
        before, u0 = served(tg), tg.team_counters("ide")
        with client(tg, "ide") as c:  # overflow: throughput, at once
            t0 = time.monotonic()
            r = c.post("/completion", json=body(6))
            assert r.status_code == 200 and r.headers["x-voltafleet-tier"] == "throughput"
            assert time.monotonic() - t0 < QUEUE_S
        with client(tg, "chat", **{"X-Voltafleet-Tier": "latency"}) as c:  # overflow: refuse, after the queue
            t0 = time.monotonic()
            r = c.post("/completion", json=body(6))
            waited = time.monotonic() - t0
        assert r.status_code == 503 and r.headers["retry-after"] == str(RETRY_S)
        assert r.json()["error"]["code"] == "tier_busy" and "latency tier" in r.json()["error"]["message"]
        assert QUEUE_S - 0.5 <= waited < QUEUE_S + 3, waited
        time.sleep(0.3)
        assert got(tg, before) == {THROUGHPUT: 1, LATENCY: 0}
        u1 = tg.team_counters("ide")  # the overflowed request is counted for its team
        assert u1["completion_tokens_total"] - u0.get("completion_tokens_total", 0) == 6
    with client(tg, "ide") as c:  # the slot is free again: the latency tier
        assert c.post("/completion", json=body(4)).headers["x-voltafleet-tier"] == "latency"


def test_a_refusing_request_waits_in_its_tiers_queue_and_is_served_when_a_slot_frees(tg):
    with Hold(tg) as hold:
        before = served(tg)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            def ask():
                with client(tg, "chat", **{"X-Voltafleet-Tier": "latency"}) as c:
                    return c.post("/completion", json=body(5))
            waiting = pool.submit(ask)
            time.sleep(1.0)
            assert not waiting.done()  # queued for the latency tier's slot, not sent to throughput
            hold.release()
            r = waiting.result(timeout=30)
    assert r.status_code == 200 and r.headers["x-voltafleet-tier"] == "latency"
    assert got(tg, before) == {THROUGHPUT: 0, LATENCY: 1}


def test_a_drained_latency_server_sends_its_tiers_requests_to_throughput_or_to_the_tiers_503(tg):
    """A rollout drains an instance in its tier's backend (found in `show stat`, as roles/gateway_api
    does): a team that overflows is served by throughput meanwhile; one that refuses gets the
    tier's 503 at once (no usable server), never a stream cut."""
    backend = gateway.server_backend(tg.admin("show stat"), LATENCY)
    assert backend == "llama_latency"
    assert tg.admin(f"set server {backend}/{LATENCY} state drain").strip() == ""
    try:
        assert gateway.server_states(tg.admin("show stat"))[LATENCY] == "DRAIN"
        before = served(tg)
        with client(tg, "ide") as c:
            assert c.post("/completion", json=body(4)).headers["x-voltafleet-tier"] == "throughput"
        with client(tg, "chat", **{"X-Voltafleet-Tier": "latency"}) as c:
            t0 = time.monotonic()
            r = c.post("/completion", json=body(4))
        assert r.status_code == 503 and r.json()["error"]["code"] == "tier_busy" and time.monotonic() - t0 < QUEUE_S
        assert got(tg, before) == {THROUGHPUT: 1, LATENCY: 0}
    finally:
        tg.admin(f"set server {backend}/{LATENCY} state ready")
    with client(tg, "ide") as c:
        assert c.post("/completion", json=body(4)).headers["x-voltafleet-tier"] == "latency"


def test_a_teams_tier_changes_in_the_running_gateway_without_a_reload(tg):
    """A gateway-only run brings the team tiers map to its new file through the runtime API (no
    reload: the same worker) and reads it back; the team's next request goes to its new tier."""
    import shutil
    import subprocess
    from pathlib import Path

    from voltafleet.front import teams, tiers

    assert shutil.which("socat"), "no socat (the runtime API's client): make setup installs it"
    path, sock = tg.tmp / Path(teams.TIERS_MAP).name, str(tg.tmp / "admin.sock")
    before_text, pid = path.read_text(), tg.worker_pid()

    def apply(team_fields: dict) -> None:
        entries = [{"name": t, "key_sha256": harness.sha(k), **team_fields.get(t, {})} for t, k in KEYS.items()]
        path.write_text(tiers.tiers_map(teams.parse(entries), "throughput"))
        subprocess.run(["sh", "-c", teams.runtime_replace(str(path), sock)], check=True)
        out = subprocess.run(["sh", "-c", teams.readback(str(path), sock)], capture_output=True, text=True)
        assert teams.check_running(str(path), out.stdout) is None, out.stdout

    try:
        apply({**FIELDS, "web": {"tier": "latency", "tiers": ["latency", "throughput"]}})
        before = served(tg)
        with client(tg, "web") as c:
            assert c.post("/completion", json=body(4)).headers["x-voltafleet-tier"] == "latency"
        with client(tg, "web", **{"X-Voltafleet-Tier": "throughput"}) as c:  # now allowed by header
            assert c.post("/completion", json=body(4)).headers["x-voltafleet-tier"] == "throughput"
        assert got(tg, before) == {THROUGHPUT: 1, LATENCY: 1} and tg.worker_pid() == pid
    finally:
        apply(FIELDS)
    assert path.read_text() == before_text
    with client(tg, "web", **{"X-Voltafleet-Tier": "latency"}) as c:
        assert c.post("/completion", json=body(4)).status_code == 403
