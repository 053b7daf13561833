"""Closed by route (issue 48 item 1): every route of the pinned llama-server is classified in
voltafleet/front/routes.py (read from the pinned source, so a route a future pin adds fails here until
it is put in the table), and through the project's own gateway a team's key reaches only the team
routes: any other path, method or spelling is the gateway's own 404, never a server's answer. A
conversation id never reaches a server (it would keep generating after its client left, and replay)."""
from __future__ import annotations

import subprocess
import time

import httpx
import pytest

from tests.fixture_vars import PINNED_COMMIT
from tests.gateway_local.harness import ALIAS
from tests.gateway_local.test_usage import CHAT, idle
from voltafleet.front import routes


def pinned_source(path: str) -> str:
    """A file of llama.cpp at the pinned commit, from the lab's git mirror (made by `lab up`)."""
    from lab.fleet import CACHE

    git = CACHE / "mirror/git/llama.cpp.git"
    out = subprocess.run(["git", "--git-dir", str(git), "show", f"{PINNED_COMMIT}:{path}"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail(f"no pinned llama.cpp source in {git.name} (python -m lab up makes it): {out.stderr.strip()}",
                    pytrace=False)
    return out.stdout


def test_every_route_of_the_pinned_llama_server_is_classified():
    found = routes.source_routes(pinned_source("tools/server/server.cpp"), pinned_source("tools/server/server-http.cpp"))
    assert len(found) > 40 and ("POST", "/v1/messages") in found and ("GET", "/props") in found, sorted(found)
    assert routes.unclassified(found) == [], "classify these routes in voltafleet/front/routes.py ROUTES"
    # and the table names no route the source lacks (a renamed route would otherwise keep its stale entry)
    assert sorted(set(routes.ROUTES) - found) == []


def gateway_404(r: httpx.Response) -> bool:
    return r.status_code == 404 and r.json()["error"]["code"] == "route_not_found"


def test_a_teams_key_reaches_only_the_team_routes(local_gateway):
    g = local_gateway
    with httpx.Client(base_url=g.gateway, headers={"Authorization": "Bearer key-web"}, timeout=30) as c:
        for (method, path), route in sorted(routes.ROUTES.items()):
            url = path.replace(":id_slot", "0")
            r = c.request(method, url, json={} if method in ("POST", "PUT") else None)
            if route.who == routes.TEAM:
                assert not gateway_404(r), (method, path)  # the server's own answer
            else:
                assert gateway_404(r), (method, path, r.status_code, r.text[:200])
        # a team route by another method, or a spelling the server would decode or match otherwise
        for method, url in (("DELETE", "/v1/chat/completions"), ("PUT", "/v1/messages"), ("GET", "/v1/completions"),
                            ("OPTIONS", "/v1/chat/completions"), ("GET", "/v1/models/"), ("GET", "/V1/models"),
                            ("GET", "/v1/%6dodels"), ("GET", "/metrics/teams"), ("GET", "/v1/stream?conv_id=x")):
            assert gateway_404(c.request(method, url)), (method, url)
        assert c.get("/v1/models").json()["data"][0]["id"] == ALIAS
    # no key: the 401 comes first, whatever the route
    assert httpx.get(g.gateway + "/props", timeout=30).status_code == 401


def test_a_conversation_id_never_reaches_a_server(local_gateway):
    """With X-Conversation-Id the pinned server keeps a stream session (replayed by GET /v1/stream) and
    generates on after its client left. Through the gateway the header is gone: the cut stream stops
    generating, and the server has no session to replay."""
    g = local_gateway
    s0 = idle(g)
    body = {"messages": CHAT, "max_tokens": 3000, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=g.gateway, headers={"Authorization": "Bearer key-web", "X-Conversation-Id": "conv-48"},
                      timeout=60) as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            n = 0
            for line in r.iter_lines():
                n += line.startswith("data: {")
                if n == 10:
                    break
    time.sleep(0.5)
    generated = idle(g)["tokens_predicted_total"] - s0["tokens_predicted_total"]
    assert generated < 3000, generated  # it stopped when the client left
    assert httpx.get(g.direct + "/v1/stream", params={"conv_id": "conv-48"}, timeout=10).status_code == 404
