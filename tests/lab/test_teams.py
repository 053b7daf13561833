"""Many teams through one gateway (issue 30), on the lab fleet with pooled keep-alive clients:
a key per team (sha256 in group_vars, a map on the gateway), limits per team (429 with
Retry-After), usage per team (/metrics/teams), keys added, rotated and revoked by a
gateway-only run that restarts no server and loses no request; limits, teams and the servers'
key changed in the running HAProxy whole, without a reload (issue 39)."""
from __future__ import annotations

import hashlib
import re
import secrets
import time

import httpx
import openai
import pytest

from bench.lab.load import Load
from tests.lab.helpers import GATEWAY_URL, SERVER_HOST, deploy, gateways, lab, metrics_url, pids, ssh, wait_holder
from voltafleet.front import gateway, teams


URL = GATEWAY_URL
KEY = {name: "vf-" + secrets.token_urlsafe(24) for name in ("web", "web2", "batch", "slow", "stranger")}
BATCH_SHARE = 0.25  # of the lab's 24 slots: 6 requests in flight


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def team_vars(web_keys=("web",)) -> dict:
    return {"gateway_teams": [{"name": "web", "key_sha256": [sha(KEY[k]) for k in web_keys], "requests_per_minute": 100000},
                              {"name": "batch", "key_sha256": sha(KEY["batch"]), "slot_share": BATCH_SHARE,
                               "requests_per_minute": 100000},
                              {"name": "slow", "key_sha256": sha(KEY["slow"]), "requests_per_minute": 5}]}


def gateway_only(vars: dict, tmp) -> None:
    """A gateway-only run (pyinfra --limit gateway: the pair): the servers are not even connected to."""
    run = deploy(vars, tmp, limit="gateway")
    assert run.rc == 0, run
    assert "vf-lab-1" not in run.out  # no server host in this run


def haproxy_pid() -> int:
    """The pid of the gateway's running HAProxy worker (`show info`): a reload or a restart
    starts a new one."""
    info = ssh(lab()["gateway"], gateway.runtime("show info"))
    return int(re.search(r"^Pid: (\d+)$", info, re.M).group(1))


def running_map(path: str) -> dict[str, str]:
    """{key: value} of the map as the running HAProxy holds it (`show map`), whole values."""
    return dict(teams.running_entries(ssh(lab()["gateway"], gateway.runtime(f"show map {path}"))))


def with_team(name: str, key: str, **limits) -> dict:
    """The module's teams and one more."""
    v = team_vars()
    v["gateway_teams"].append({"name": name, "key_sha256": sha(key), **limits})
    return v


def statuses(key: str, n: int) -> list[int]:
    """The statuses of n requests in a row on one keep-alive connection with this key."""
    with httpx.Client(base_url=URL, headers={"Authorization": f"Bearer {key}"}, timeout=60) as c:
        return [c.post("/completion", json={"prompt": "hi", "n_predict": 2}).status_code for _ in range(n)]


def under_load(change) -> dict:
    """Run change() while a pooled keep-alive load of the web team goes on: its summary."""
    load = Load(URL, clients=4, tokens=16, seconds=300, max_requests=100000, key=KEY["web"], pause_s=0.1).start()
    try:
        change()
        time.sleep(1)
    finally:
        s = load.stop()
    return s


def usage() -> dict[tuple[str, str], float]:
    """{(metric, labels): value} from the gateway's /metrics/teams."""
    out = {}
    for line in httpx.get(metrics_url(teams.METRICS_PATH), timeout=10).text.splitlines():
        m = re.match(r"^(voltafleet_team_\w+)\{([^}]*)\} (\S+)$", line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def delta(after: dict, before: dict, metric: str, labels: str) -> float:
    return after.get((metric, labels), 0) - before.get((metric, labels), 0)


@pytest.fixture(scope="module")
def team_fleet(first_rollout, tmp_path_factory):
    """The lab fleet with two teams (a whole run: the servers converge, none restarts when
    they were converged); the gateway without teams again at the end. The tests take this,
    not `converged`, which would roll the teams back out."""
    from tests.lab.helpers import still

    tmp = tmp_path_factory.mktemp("teams")
    if not still():
        assert deploy().rc == 0  # the repository's configuration first, so the pids below are the converged ones
    hosts = lab()["hosts"]
    before = pids(hosts)
    run = deploy(team_vars(), tmp)
    assert run.rc == 0, run
    assert pids(hosts) == before  # keys are the gateway's business: no server restarted
    mode = ssh(lab()["gateway"], f"stat -c '%a %U %G' {teams.KEYS_MAP} {teams.LIMITS_MAP}").splitlines()
    assert mode == ["640 root haproxy"] * 2
    yield tmp
    gateway_only({}, tmp)


def test_a_request_without_a_known_key_gets_401_at_the_gateway_in_openais_shape(team_fleet):
    from tests.lab.helpers import gateway_stat

    served = lambda: sum(int(r["stot"]) for r in gateway_stat(lab()["gateway"]).values())  # noqa: E731
    before = served()
    c = openai.OpenAI(base_url=URL + "/v1", api_key=KEY["stranger"], max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError) as e:
        c.chat.completions.create(model="qwen3.6-27b", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert e.value.code == "invalid_api_key" and e.value.body["type"] == "invalid_request_error"
    assert e.value.response.headers["www-authenticate"] == "Bearer"
    for headers in ({}, {"Authorization": "Basic dXNlcjpwYXNz"}, {"Authorization": "Bearer x"}):  # none, another scheme, unknown
        r = httpx.post(URL + "/v1/completions", json={"model": "qwen3.6-27b", "prompt": "hi", "max_tokens": 2},
                       headers=headers, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (headers, r.text)
    assert served() == before  # no server saw them
    ok = openai.OpenAI(base_url=URL + "/v1", api_key=KEY["web"], max_retries=0, timeout=60)
    assert ok.models.list().data[0].id == "qwen3.6-27b"


def test_a_flooding_team_gets_429s_while_the_other_keeps_its_ttft_and_usage_matches(team_fleet):
    web = dict(clients=3, tokens=24, seconds=20, max_requests=40, key=KEY["web"], streams_only=True)
    before = usage()
    alone = Load(URL, **web).start()
    alone.wait()
    base = alone.stop()
    flood = Load(URL, clients=24, tokens=48, seconds=40, max_requests=100000, key=KEY["batch"], client="openai",
                 honor_retry_after=True)  # as the SDK's own retry would: it waits Retry-After
    flood.start()
    time.sleep(3)
    loaded = Load(URL, **web).start()
    loaded.wait()
    under = loaded.stop()
    batch = flood.stop()
    print(f"\nweb alone: {base}\nweb while batch floods: {under}\nbatch: {batch}")
    assert base["served"] == base["requests"] == 40 and under["served"] == under["requests"] == 40
    assert under["failed"] == under["cut"] == under["busy"] == under["limited"] == 0
    # the flooder: 429s with Retry-After, never a 5xx, never a cut stream; its share of slots still served
    limited = [r for r in flood.results if r["outcome"] == "limited"]
    assert limited and {r["retry_after"] for r in limited} == {"2"}
    assert batch["failed"] == batch["cut"] == batch["busy"] == 0 and batch["served"] > 0
    # the web team's time to first token is what it is alone, within the lab's shared two cores
    assert under["ttft_p50_ms"] <= 3 * base["ttft_p50_ms"] + 500, (base, under)
    # usage per team on the gateway's Prometheus endpoint matches what this test sent
    after = usage()
    assert delta(after, before, "voltafleet_team_responses_total", 'team="web",code="200"') == 80
    assert delta(after, before, "voltafleet_team_requests_total", 'team="web"') == 80
    assert delta(after, before, "voltafleet_team_responses_total", 'team="batch",code="200"') == batch["served"]
    assert delta(after, before, "voltafleet_team_responses_total", 'team="batch",code="429"') == len(limited)
    assert delta(after, before, "voltafleet_team_requests_total", 'team="batch"') == batch["requests"]
    # every answer's completion tokens, streamed or not (the flood alternates them): 48 each (ignore_eos)
    plain = [r["tokens"] for r in flood.results if r["ok"] and not r["stream"]]
    assert plain and set(plain) == {48}
    assert delta(after, before, "voltafleet_team_completion_tokens_total", 'team="batch"') == 48 * batch["served"]
    assert delta(after, before, "voltafleet_team_completion_tokens_total", 'team="web"') == 24 * 80  # its streams
    assert delta(after, before, "voltafleet_team_request_seconds_total", 'team="web"') > 0
    assert delta(after, before, "voltafleet_team_bytes_out_total", 'team="web"') > 0


def test_the_sdk_reads_a_429_and_its_retry_after(team_fleet):
    share = int(BATCH_SHARE * 24)  # the team's limit: 6 of the lab's 24 slots
    # n_probs makes each of the tiny model's tokens slower: six 800-token streams last 5-9 s, not 1-2, so
    # they are all in flight together when the seventh is sent
    hold = Load(URL, clients=share, tokens=800, seconds=60, max_requests=share, key=KEY["batch"],
                streams_only=True, body={"n_probs": 100}).start()
    try:
        deadline = time.monotonic() + 20
        while usage().get(("voltafleet_team_in_flight", 'team="batch"'), 0) < share:  # all six streams in flight
            assert time.monotonic() < deadline, usage()
            time.sleep(0.1)
        c = openai.OpenAI(base_url=URL + "/v1", api_key=KEY["batch"], max_retries=0, timeout=60)
        with pytest.raises(openai.RateLimitError) as e:
            c.completions.create(model="qwen3.6-27b", prompt="hi", max_tokens=2)
        assert e.value.code == "rate_limit_exceeded" and e.value.response.headers["retry-after"] == "2"
        assert "in flight" in e.value.body["message"]
    finally:
        held = hold.stop()
    assert held["served"] == share  # the six in flight were served to their end


def test_a_team_over_its_requests_per_minute_gets_429_and_the_others_are_served(team_fleet):
    c = openai.OpenAI(base_url=URL + "/v1", api_key=KEY["slow"], max_retries=0, timeout=60)
    for _ in range(5):
        assert c.completions.create(model="qwen3.6-27b", prompt="hi", max_tokens=2).usage.completion_tokens == 2
    with pytest.raises(openai.RateLimitError) as e:
        c.completions.create(model="qwen3.6-27b", prompt="hi", max_tokens=2)
    assert "per minute" in e.value.body["message"] and e.value.response.headers["retry-after"] == "2"
    web = openai.OpenAI(base_url=URL + "/v1", api_key=KEY["web"], max_retries=0, timeout=60)
    assert web.completions.create(model="qwen3.6-27b", prompt="hi", max_tokens=2).usage.completion_tokens == 2


def test_rotating_a_key_under_load_loses_no_request_and_a_revoked_key_fails_at_once(team_fleet):
    tmp = team_fleet
    hosts = lab()["hosts"]
    before = pids(hosts)
    # the team's clients keep one pooled keep-alive connection each while the keys change under them
    old = httpx.Client(base_url=URL, headers={"Authorization": f"Bearer {KEY['web']}"}, timeout=60)
    assert old.post("/completion", json={"prompt": "hi", "n_predict": 2}).status_code == 200
    load = Load(URL, clients=4, tokens=16, seconds=300, max_requests=100000, key=KEY["web"], pause_s=0.1).start()
    gateway_only(team_vars(("web", "web2")), tmp)  # step 1: the new key added beside the old one
    time.sleep(1)
    on_old = load.stop()
    load2 = Load(URL, clients=4, tokens=16, seconds=300, max_requests=100000, key=KEY["web2"], pause_s=0.1).start()
    gateway_only(team_vars(("web2",)), tmp)  # step 2: the old key revoked, the clients on the new one
    time.sleep(1)
    on_new = load2.stop()
    print(f"\nrotation: old key {on_old}\nnew key {on_new}")
    for s in (on_old, on_new):
        assert s["requests"] > 0 and s["served"] == s["requests"], s
    # the revoked key fails on its next request, on the connection it already had, and on every
    # one after (each of the gateway's threads: no lookup cache keeps it)
    for _ in range(8):
        r = old.post("/completion", json={"prompt": "hi", "n_predict": 2})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.post(URL + "/completion", json={"prompt": "hi", "n_predict": 2},
                          headers={"Authorization": f"Bearer {KEY['web']}"}, timeout=60).status_code == 401
    assert httpx.post(URL + "/completion", json={"prompt": "hi", "n_predict": 2},
                      headers={"Authorization": f"Bearer {KEY['web2']}"}, timeout=60).status_code == 200
    assert pids(hosts) == before  # no server restarted
    old.close()
    gateway_only(team_vars(), tmp)  # back to the module's teams


def test_a_lowered_requests_per_minute_holds_on_the_next_requests_without_a_reload(team_fleet):
    tmp = team_fleet
    name, key = "q" + secrets.token_hex(4), "vf-" + secrets.token_urlsafe(24)  # a team no request counted yet
    gateway_only(with_team(name, key, requests_per_minute=1000), tmp)
    pid = haproxy_pid()
    s = under_load(lambda: gateway_only(with_team(name, key, requests_per_minute=3), tmp))
    assert s["requests"] > 0 and s["served"] == s["requests"] and s["failed"] == s["cut"] == 0, s
    assert haproxy_pid() == pid  # changed in the running process: no reload, no restart
    assert running_map(teams.LIMITS_MAP)[name].split()[1:] == ["3"]  # "<concurrent> 3", whole
    assert statuses(key, 5) == [200, 200, 200, 429, 429]  # 3 a minute, from the next request on
    gateway_only(team_vars(), tmp)


def test_a_team_added_without_a_reload_is_served_and_limited(team_fleet):
    tmp = team_fleet
    name, key = "n" + secrets.token_hex(4), "vf-" + secrets.token_urlsafe(24)
    pid = haproxy_pid()
    assert statuses(key, 1) == [401]  # not a team yet
    s = under_load(lambda: gateway_only(with_team(name, key, requests_per_minute=2, max_concurrent=5), tmp))
    assert s["requests"] > 0 and s["served"] == s["requests"] and s["failed"] == s["cut"] == 0, s
    assert haproxy_pid() == pid
    assert running_map(teams.LIMITS_MAP)[name] == "5 2"
    assert statuses(key, 3) == [200, 200, 429]
    gateway_only(team_vars(), tmp)


def test_a_new_servers_key_reaches_the_running_gateway_whole_and_loses_no_request(team_fleet):
    """The gateway sends the servers the key of server_api_key_file; a new key replaces the
    running map's "Bearer <key>" whole (HAProxy 2.6's CLI kept "Bearer" alone before). The lab's
    servers take no key, so every request after a cut value would still pass: the value the
    running gateway sends is read back whole instead."""
    tmp = team_fleet
    keys = {}
    for n in ("old", "new"):
        keys[n] = "vf-srv-" + secrets.token_urlsafe(24)
        (tmp / f"server-key-{n}").write_text(keys[n] + "\n")
        (tmp / f"server-key-{n}").chmod(0o600)
    try:
        gateway_only({**team_vars(), "server_api_key_file": str(tmp / "server-key-old")}, tmp)  # a reload: set-header
        assert running_map(teams.UPSTREAM_MAP) == {"upstream": f"Bearer {keys['old']}"}
        pid = haproxy_pid()
        s = under_load(lambda: gateway_only({**team_vars(), "server_api_key_file": str(tmp / "server-key-new")}, tmp))
        assert s["requests"] > 0 and s["served"] == s["requests"] and s["failed"] == s["cut"] == 0, s
        assert haproxy_pid() == pid
        assert running_map(teams.UPSTREAM_MAP) == {"upstream": f"Bearer {keys['new']}"}
        assert statuses(KEY["web"], 2) == [200, 200]
    finally:
        gateway_only(team_vars(), tmp)


# ------------------------------------------------------------------ every token counted (issue 39 item 2)

CHAT = [{"role": "user", "content": "Count from one to twenty in words."}]


def sdk(team: str = "web") -> openai.OpenAI:
    return openai.OpenAI(base_url=URL + "/v1", api_key=KEY[team], max_retries=0, timeout=300)


def counted(send, team: str = "web") -> tuple[dict[str, float], object]:
    """send()'s result and the team's /metrics/teams deltas meanwhile, once its requests were logged."""
    before = usage()
    out = send()
    time.sleep(0.5)  # a request is counted when HAProxy logs it, as its connection's request ends
    after = usage()
    return {m[len("voltafleet_team_"):]: delta(after, before, m, f'team="{team}"') for m, _ in after}, out


def servers_predicted() -> float:
    """Tokens every lab instance generated so far (llama-server's own --metrics counter)."""
    total = 0.0
    for h in lab()["hosts"]:
        for i in (0, 1):
            text = httpx.get(f"http://{SERVER_HOST}:{h['server_port_base'] + i}/metrics", timeout=10).text
            total += float(re.search(r"^llamacpp:tokens_predicted_total (\S+)$", text, re.M).group(1))
    return total


def test_every_token_of_a_teams_answers_is_counted_streamed_or_not_as_the_servers_report(team_fleet):
    c = sdk()
    d, r = counted(lambda: c.chat.completions.create(model="qwen3.6-27b", messages=CHAT, max_tokens=40))
    assert (d["prompt_tokens_total"], d["completion_tokens_total"]) == (r.usage.prompt_tokens, r.usage.completion_tokens)
    assert d["cut_streams_total"] == 0 and d["reasoning_tokens_total"] == 0  # the pinned server reports none
    prompt = r.usage.prompt_tokens

    def stream(**extra):
        last, use = None, None
        for ch in c.chat.completions.create(model="qwen3.6-27b", messages=CHAT, max_tokens=50, stream=True,
                                            extra_body={"ignore_eos": True}, **extra):
            last, use = (ch.model_extra or {}).get("timings") or last, ch.usage or use
        return last, use

    d, (timings, use) = counted(stream)  # no usage chunk: the last chunk's timings are the server's figures
    assert use is None and timings["predicted_n"] == 50 and timings["cache_n"] + timings["prompt_n"] == prompt
    assert (d["prompt_tokens_total"], d["completion_tokens_total"]) == (prompt, 50)
    d, (timings, use) = counted(lambda: stream(stream_options={"include_usage": True}))
    assert (d["prompt_tokens_total"], d["completion_tokens_total"]) == (use.prompt_tokens, use.completion_tokens) == (prompt, 50)
    d, r = counted(lambda: [x for x in c.completions.create(model="qwen3.6-27b", prompt="Once upon a time", max_tokens=30,
                                                             stream=True, extra_body={"ignore_eos": True})][-1])
    assert (d["prompt_tokens_total"], d["completion_tokens_total"]) == (r.usage.prompt_tokens, 30)
    with httpx.Client(base_url=URL, headers={"Authorization": f"Bearer {KEY['web']}"}, timeout=120) as h:
        d, native = counted(lambda: h.post("/completion", json={"prompt": "Once upon a time", "n_predict": 35,
                                                                "ignore_eos": True}).json())
    assert (d["prompt_tokens_total"], d["completion_tokens_total"]) == (native["tokens_evaluated"], 35)
    assert d["requests_total"] == 1


def test_a_teams_key_reaches_only_the_routes_in_the_table_and_each_answer_is_counted(team_fleet):
    """Issue 48, through the lab gateway: every route of the pinned llama-server that is not a team route
    (voltafleet/front/routes.py, docs/gateway.md) is the gateway's 404 for a team's key; /v1/messages
    counts its whole prompt (the cached part the server reports apart: a follow-up on the same
    conversation reaches the same instance by affinity and reuses its cache) and its output."""
    from voltafleet.front import routes

    with httpx.Client(base_url=URL, headers={"Authorization": f"Bearer {KEY['web']}"}, timeout=120) as h:
        for (method, path), route in sorted(routes.ROUTES.items()):
            r = h.request(method, path.replace(":id_slot", "0"), json={} if method == "POST" else None)
            ours = r.status_code == 404 and r.json()["error"]["code"] == "route_not_found"
            assert ours == (route.who != routes.TEAM), (method, path, r.status_code, r.text[:200])
        body = {"model": "qwen3.6-27b", "max_tokens": 16, "messages": CHAT}
        for turn in range(2):
            d, r = counted(lambda: h.post("/v1/messages", json=body).json())
            u = r["usage"]
            assert d["prompt_tokens_total"] == u["input_tokens"] + u["cache_read_input_tokens"], (turn, d, u)
            assert d["completion_tokens_total"] == u["output_tokens"] == 16 and d["requests_total"] == 1, (turn, d, u)
        assert u["cache_read_input_tokens"] > 0, u  # the follow-up: its instance's cache, counted too


def test_an_answer_over_64_kib_is_counted_whole(team_fleet):
    size = {}

    def big():
        raw = sdk().chat.completions.with_raw_response.create(model="qwen3.6-27b", messages=CHAT, max_tokens=300,
                                                              logprobs=True, top_logprobs=20,
                                                              extra_body={"ignore_eos": True})
        size["bytes"] = len(raw.content)
        return raw.parse()

    d, r = counted(big)
    assert size["bytes"] > 64 * 1024 and r.usage.completion_tokens == 300
    assert (d["prompt_tokens_total"], d["completion_tokens_total"]) == (r.usage.prompt_tokens, 300)

    def long_stream():
        n = 0
        for ch in sdk().chat.completions.create(model="qwen3.6-27b", messages=CHAT, max_tokens=800, stream=True,
                                                stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
            n += len(ch.model_dump_json())
        return n, ch.usage

    d, (n, use) = counted(long_stream)
    assert n > 64 * 1024 and use.completion_tokens == 800
    assert (d["prompt_tokens_total"], d["completion_tokens_total"]) == (use.prompt_tokens, 800)


def test_a_stream_its_client_cuts_counts_what_the_gateway_sent(team_fleet):
    generated0 = servers_predicted()
    got = {"events": 0}

    def cut():
        s = sdk().chat.completions.create(model="qwen3.6-27b", messages=CHAT, max_tokens=900, stream=True,
                                          extra_body={"ignore_eos": True})
        for ch in s:
            got["events"] += bool(ch.choices and (ch.choices[0].delta.content
                                                 or ch.choices[0].delta.model_extra.get("reasoning_content")))
            if got["events"] == 40:
                s.close()  # the client goes away mid-stream
                return

    d, _ = counted(cut)
    time.sleep(2)  # the server notices the closed connection and stops its slot
    generated = servers_predicted() - generated0
    assert d["cut_streams_total"] == 1 and d["requests_total"] == 1, d
    # what the gateway forwarded: at least what the client read, at most what the servers generated (under 900)
    assert 40 <= d["completion_tokens_total"] <= generated < 900, (d, generated)


# ------------------------------------------------------------------ token budgets per team (issue 39 item 3)

def budget_used(team: str, period: str = "day") -> float:
    return usage().get(("voltafleet_team_budget_used_tokens", f'team="{team}",period="{period}"'), -1)


def native_status(key: str, n: int = 40) -> httpx.Response:
    return httpx.post(URL + "/completion", headers={"Authorization": f"Bearer {key}"}, timeout=120,
                      json={"prompt": "Once upon a time", "n_predict": n, "ignore_eos": True})


def wait_new_worker(old: int) -> int:
    """The gateway's new worker pid once it answers (after `systemctl reload` or `restart`)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            pid = haproxy_pid()
            if pid != old and httpx.get(metrics_url(teams.METRICS_PATH, lab()["gateway"]), timeout=5).status_code == 200:
                return pid
        except (AssertionError, AttributeError, httpx.HTTPError):
            pass
        time.sleep(0.5)
    raise AssertionError("no new HAProxy worker")


def spent_budget_team(tmp) -> tuple[str, str, float]:
    """A new team with a daily budget of 60 tokens, spent by 40-token requests: (name, key, its use)."""
    from voltafleet.front import budgets

    name, key = "b" + secrets.token_hex(4), "vf-" + secrets.token_urlsafe(24)
    v = team_vars()
    v["gateway_teams"].append({"name": name, "key_sha256": sha(key), "tokens_per_day": 60})
    gateway_only(v, tmp)
    assert ssh(lab()["gateway"], f"stat -c '%a %U %G' {budgets.DIR}") == "750 haproxy haproxy"
    codes = [native_status(key).status_code for _ in range(3)]
    assert codes == [200, 200, 429], codes  # 40 + the prompt's tokens a request: the third finds the budget spent
    time.sleep(0.5)
    return name, key, budget_used(name)


def test_a_team_over_its_daily_budget_gets_the_429_naming_it(team_fleet):
    from voltafleet.front import budgets

    name, key, used = spent_budget_team(team_fleet)
    assert 80 < used < 120 and usage()[("voltafleet_team_budget_tokens", f'team="{name}",period="day"')] == 60
    r = native_status(key)
    want, retry = budgets.over_budget(name, "day", 60, int(used), time.time())
    assert r.status_code == 429 and r.json() == want, r.text
    assert abs(int(r.headers["Retry-After"]) - retry) <= 5
    assert statuses(KEY["web"], 1) == [200]  # the other teams are served
    day = ssh(lab()["gateway"], f"stat -c '%U' {budgets.DIR}/{budgets.day_file(time.time())}")
    assert day == "haproxy"  # written by HAProxy's worker
    gateway_only(team_vars(), team_fleet)


def test_the_budget_counts_survive_a_reload_and_a_restart_of_the_gateway(team_fleet):
    name, key, used = spent_budget_team(team_fleet)
    web = budget_used("web", "month")
    pid = haproxy_pid()
    ssh(lab()["gateway"], "systemctl reload haproxy")
    pid = wait_new_worker(pid)
    assert budget_used(name) == used and budget_used("web", "month") == web
    r = native_status(key)
    assert r.status_code == 429 and "daily budget of 60 tokens" in r.json()["error"]["message"]
    ssh(lab()["gateway"], "systemctl restart haproxy")
    wait_new_worker(pid)
    assert budget_used(name) == used and budget_used("web", "month") == web
    assert native_status(key).status_code == 429
    gateway_only(team_vars(), team_fleet)


def test_a_budget_spent_half_through_each_gateway_refuses_at_the_same_total_as_through_one(team_fleet):
    """Through one gateway (spent_budget_team): 40 + p tokens twice, then the third refused. Here the first
    through vf-lab-gw; the address moved to vf-lab-gw2 (the first's HAProxy stopped); the second through it,
    the third refused there; back on the first, the first refuses too (issue 52)."""
    first, second = gateways()
    name, key = "p" + secrets.token_hex(4), "vf-" + secrets.token_urlsafe(24)
    v = team_vars()
    v["gateway_teams"].append({"name": name, "key_sha256": sha(key), "tokens_per_day": 60})
    gateway_only(v, team_fleet)
    assert wait_holder()["name"] == first["name"]
    assert native_status(key).status_code == 200
    one = budget_used(name)
    time.sleep(1.5)  # the second reads the first's counts every gateway_budget_peer_poll_ms (1 s)
    ssh(first, "systemctl stop haproxy")
    try:
        wait_holder(second["name"])
        assert native_status(key).status_code == 200  # 40 + p < 60: the second admits it, counting the first's
        time.sleep(0.3)
        assert budget_used(name) == 2 * one  # the second's figure: both requests
        r = native_status(key)
        assert r.status_code == 429 and f"has used {int(2 * one)} of its daily budget of 60" in r.json()["error"]["message"]
    finally:
        ssh(first, "systemctl start haproxy")
        wait_holder(first["name"])
    time.sleep(1.5)  # the first reads the second's counts
    assert native_status(key).status_code == 429 and budget_used(name) == 2 * one
    gateway_only(team_vars(), team_fleet)


def test_a_gateways_counts_are_answered_to_the_other_gateway_only(team_fleet):
    from voltafleet.front import pair

    first, second = gateways()
    url = f"http://{first['address']}:10001{pair.SPENT_PATH}"
    assert httpx.get(url, timeout=5).status_code == 403  # this machine, a client on the bridge: refused
    out = ssh(second, f"curl -s -w '\\n%{{http_code}}' {url}")
    assert out.endswith("\n200") and out.startswith("day "), out  # the other gateway reads them
    assert ssh(second, f"curl -s -o /dev/null -w '%{{http_code}}' http://{first['address']}:10001/metrics") == "404"
