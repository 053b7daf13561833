"""Tiers on the lab fleet (issue 41): vf-lab-3 is the latency tier (its own group values: 2 slots
and its own smoke threshold), two teams on two tiers under pooled keep-alive load. Each team's
requests reach only its tier, a full latency tier overflows to throughput (as configured), and a
rollout of the latency tier loses no request. The tier speculates with the tiny model's own MTP
head, and its servers' greedy output still matches the golden probe (its smoke test); the speed of
MTP is measured on the H200 (bench/records/tier41)."""
import hashlib
import json
import secrets

import httpx

from bench.lab.load import Load
from tests.lab.helpers import GATEWAY_URL, SERVER_HOST, deploy, env_file, gateway_stat, lab, main_pid, rollout


URL = GATEWAY_URL
KEY = {name: "vf-" + secrets.token_urlsafe(24) for name in ("ide", "web")}
LATENCY = {"server_tier": "latency", "server_parallel": 2, "server_ctx": 2048, "smoke_min_single_tps": 6,
           "server_spec_mtp": True, "server_spec_draft_max": 2}


def teams(overflow: str) -> dict:
    sha = lambda k: hashlib.sha256(k.encode()).hexdigest()  # noqa: E731
    return {"gateway_teams": [
        {"name": "ide", "key_sha256": sha(KEY["ide"]), "tier": "latency", "overflow": overflow,
         "requests_per_minute": 100000},
        {"name": "web", "key_sha256": sha(KEY["web"]), "requests_per_minute": 100000}]}


def served(gw) -> dict[str, int]:
    """Requests each tier's backend has answered (HAProxy's per-server totals, summed a backend)."""
    out = {}
    for row in gateway_stat(gw).values():
        out[row["pxname"]] = out.get(row["pxname"], 0) + int(row["stot"])
    return out


def delta(before: dict, after: dict) -> dict:
    return {b: after.get(b, 0) - before.get(b, 0) for b in after}


def load(team: str, clients: int, requests: int, tokens: int = 16) -> dict:
    ld = Load(URL, clients=clients, tokens=tokens, seconds=120, max_requests=requests, key=KEY[team]).start()
    ld.wait(timeout=150)
    return ld.stop()


def test_two_teams_on_two_tiers_overflow_and_a_rollout_of_the_latency_tier(gw, tmp_path):
    hosts = lab()["hosts"]
    fast = hosts[2]["name"]
    try:
        run = deploy(teams("throughput"), tmp_path, host_vars={fast: LATENCY})
        assert run.rc == 0, run
        rows = gateway_stat(gw)
        assert {rows[f"{fast}-{i}"]["pxname"] for i in (0, 1)} == {"llama_latency"}
        assert {r["pxname"] for n, r in rows.items() if not n.startswith(fast)} == {"llama"}
        # the tier's servers draft with the model's MTP head (and passed the golden probe to get here)
        port = hosts[2]["server_port_base"]
        answer = httpx.post(f"http://{SERVER_HOST}:{port}/completion", json={"prompt": "hi", "n_predict": 16}, timeout=60).json()
        assert answer["timings"]["draft_n"] > 0, answer["timings"]
        assert "draft-mtp" in env_file(hosts[2]) and "draft-mtp" not in env_file(hosts[0])
        # each team alone: its requests reach its tier only (2 ide clients fit the tier's 4 slots)
        for team, clients, only in (("ide", 2, "llama_latency"), ("web", 4, "llama")):
            before = served(gw)
            s = load(team, clients, 40)
            moved = delta(before, served(gw))
            print(f"\n{team}: {json.dumps(s)} by backend {moved}")
            assert s["served"] == 40 and s["failed"] == 0, s
            assert moved[only] == 40 and sum(moved.values()) == 40, moved
        # 12 ide clients on 4 latency slots (long enough answers that the slots stay full): the rest overflow
        # to throughput at once, nothing refused
        before = served(gw)
        s = load("ide", 12, 120, tokens=96)
        moved = delta(before, served(gw))
        print(f"\nide overflowing: {json.dumps(s)} by backend {moved}")
        assert s["served"] == 120 and s["failed"] == 0 and s["busy"] == 0, s
        assert moved["llama_latency"] > 0 and moved["llama"] > 0 and sum(moved.values()) == 120, moved
        # a rollout of the latency tier (a flag changed on its host only) under the ide team's load
        pids = {i: main_pid(hosts[2], i) for i in (0, 1)}
        ld = Load(URL, clients=2, tokens=8, seconds=600, max_requests=20000, key=KEY["ide"], pause_s=0.1).start()
        try:
            run, report = rollout(["--canary", fast, "--batch", "1"], vars=teams("throughput"),
                                  host_vars={fast: {**LATENCY, "server_ctx_checkpoints": 16}}, tmp=tmp_path)
        finally:
            s = ld.stop()
        print(f"\nide during the latency tier's rollout: {json.dumps(s)}")
        assert run.rc == 0 and report["ok"], run
        assert all(main_pid(hosts[2], i) != pids[i] for i in (0, 1))  # the tier's instances restarted
        assert s["served"] > 20 and s["failed"] == 0 and s["cut"] == 0 and s["busy"] == 0, s
        status = {h["host"]: h for h in report["hosts"]}
        assert status[fast]["status"] == "passed" and status[fast]["single_tps"] >= LATENCY["smoke_min_single_tps"]
        assert {r["status"] for r in gateway_stat(gw).values()} == {"UP"}
    finally:
        assert deploy().rc == 0
