"""Two gateways, one set of limits (issue 52), on this machine: two HAProxy processes from the
project's template and Lua file, each its part of a pair (voltafleet/front/pair.py), in front of one
pinned CPU llama-server. A team's token budget spent half through each refuses at the same total as
through one gateway; its requests per minute are one count across both (HAProxy peers); a gateway
that restarts while the other is down still counts what the other served (its last counts kept).

The lab (tests/lab/test_pair.py) shows the same behind the moving address; here each gateway is
reached on its own port, so a request can be sent through the one a test names."""
from __future__ import annotations

import re
import time

import httpx
import pytest

from tests.gateway_local import harness
from voltafleet.front import pair as pairmod

KEYS = {"spend": "key-spend", "rate": "key-rate", "free": "key-free"}
TEAMS = {"spend": {"tokens_per_day": 60}, "rate": {"requests_per_minute": 4}, "free": {}}
POLL_MS = 200  # how often each reads the other's counts (gateway_budget_peer_poll_ms)
PEERS_PORT = harness.BASE_PORT + 10
BUDGET_PORT = harness.BASE_PORT + 11


def pair_vars(name: str) -> dict:
    """Gateway `name`'s part of the pair: a and b on their own loopback addresses (peers, budget port)."""
    from tests.fixture_vars import all_yml_settings

    cfg = all_yml_settings(gateway_vip="127.0.0.10", gateway_vip_prefix=8, gateway_vip_interface="lo",
                           gateway_vrrp_router_id=52, gateway_vrrp_preempt_delay_s=0, gateway_peers_port=PEERS_PORT,
                           gateway_budget_peer_port=BUDGET_PORT, gateway_budget_peer_poll_ms=POLL_MS,
                           gateway_metrics_bind="127.0.0.1:8404")
    p = pairmod.decide([("a", cfg.replace(gateway_address="127.0.0.11"), None),
                        ("b", cfg.replace(gateway_address="127.0.0.12"), None)])
    v = p.haproxy_vars(name)
    v["other_addresses"] = "127.0.0.0/8"  # on loopback every connection comes from 127.0.0.1 (the lab checks the source)
    return v


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    harness.require()
    a = harness.Local(tmp_path_factory.mktemp("pair-a"), KEYS, budgets=TEAMS, pair=pair_vars("a"))
    b = harness.Local(tmp_path_factory.mktemp("pair-b"), KEYS, budgets=TEAMS, pair=pair_vars("b"),
                      gw_ports=(harness.BASE_PORT + 5, harness.BASE_PORT + 6))
    try:
        a.start()
        b.start_gateway()
        wait_peers(a)
        yield a, b
    finally:
        b.stop()
        a.stop()


def wait_peers(g, seconds: float = 20) -> None:
    """Until the gateway's peers session with the other is established (`show peers`)."""
    deadline = time.monotonic() + seconds
    while "last_status=ESTA" not in g.admin("show peers"):
        assert time.monotonic() < deadline, g.admin("show peers")
        time.sleep(0.1)


def native(g, team: str, n: int = 40) -> httpx.Response:
    body = {"prompt": "Once upon a time", "n_predict": n, "ignore_eos": True}
    return httpx.post(g.gateway + "/completion", json=body, headers={"Authorization": f"Bearer {KEYS[team]}"}, timeout=300)


def used(g, team: str) -> int:
    text = httpx.get(g.metrics, timeout=10).text
    m = re.search(rf'^voltafleet_team_budget_used_tokens\{{team="{team}",period="day"\}} (\d+)$', text, re.M)
    return int(m.group(1)) if m else 0


def settle() -> None:
    time.sleep(3 * POLL_MS / 1000)  # each gateway has read the other's counts


def test_a_budget_spent_half_through_each_gateway_refuses_at_the_same_total_as_through_one(two):
    a, b = two
    p = httpx.post(a.direct + "/completion", json={"prompt": "Once upon a time", "n_predict": 1}).json()["tokens_evaluated"]
    # through one gateway (tests/gateway_local/test_budgets.py): 40 + p, 40 + p, then the third refused
    assert native(a, "spend").status_code == 200
    settle()
    assert native(b, "spend").status_code == 200  # 40 + p < 60: b admits it, knowing a's
    settle()
    assert used(a, "spend") == used(b, "spend") == 2 * (40 + p)  # each counts the other's tokens as its own
    ra, rb = native(a, "spend"), native(b, "spend")
    assert (ra.status_code, rb.status_code) == (429, 429), (ra.text, rb.text)
    assert f"has used {2 * (40 + p)} of its daily budget of 60 tokens" in rb.json()["error"]["message"]
    assert native(b, "free").status_code == 200  # another team is served


def test_a_teams_requests_per_minute_are_one_count_across_the_gateways(two):
    a, b = two
    codes = [native(g, "rate", 2).status_code for g in (a, a, b, b)]
    assert codes == [200, 200, 200, 200], codes
    time.sleep(0.3)  # the peers' pushes
    ra, rb = native(a, "rate", 2), native(b, "rate", 2)
    assert (ra.status_code, rb.status_code) == (429, 429), (ra.text, rb.text)
    assert ra.json()["error"]["message"].startswith("Your team has reached its limit of requests per minute")


def test_the_budget_port_answers_its_own_counts_and_nothing_else(two):
    a, b = two
    text = httpx.get(f"http://127.0.0.12:{BUDGET_PORT}{pairmod.SPENT_PATH}", timeout=5).text
    lines = text.splitlines()
    assert re.fullmatch(r"day \d{4}-\d\d-\d\d", lines[0]) and re.fullmatch(r"month \d{4}-\d\d", lines[1])
    own = {t: int(d) for t, d, _ in (line.split() for line in lines[2:])}
    assert 0 < own["spend"] < used(b, "spend")  # b's own: one request of the two it counts
    assert httpx.get(f"http://127.0.0.12:{BUDGET_PORT}/metrics", timeout=5).status_code == 404
    assert httpx.post(f"http://127.0.0.12:{BUDGET_PORT}{pairmod.SPENT_PATH}", timeout=5).status_code == 404


def test_a_gateway_restarted_while_the_other_is_down_still_counts_what_the_other_served(two):
    a, b = two
    total = used(b, "spend")
    a.haproxy.terminate()
    a.haproxy.wait(30)
    a.procs.remove(a.haproxy)
    try:
        b.restart()  # a new process: its memory of a's counts is gone, a cannot be read, its kept copy is
        time.sleep(1)
        assert used(b, "spend") == total
        assert native(b, "spend").status_code == 429
        assert "voltafleet_gateway_budget_peer_age_seconds{peer=\"a\"}" in httpx.get(b.metrics, timeout=5).text
    finally:
        a.start_haproxy()
        wait_peers(a)
