"""The two gaps of issue 39's usage, closed at the request (the gateway's own template and Lua
filter in front of the pinned llama-server on this machine):

- an OpenAI-format stream (chat, completions) that its client cuts before the last event counts
  its prompt: the gateway adds "timings_per_token":true to the body, so every event carries
  timings (cache_n + prompt_n, predicted_n), and the team's budget counts them;
- a native completion cannot hide its figures with response_fields: refused with a 400 naming the
  field when the gateway sees it, overridden (an empty list, the whole answer) where it cannot.

The client's answer is the server's own, with timings in each event. Skipped where haproxy or the
pinned llama-server is not on this machine."""
from __future__ import annotations

import json
import re
import time

import httpx
import openai
import pytest

from tests.gateway_local import harness
from tests.gateway_local.harness import ALIAS
from tests.gateway_local.test_usage import counted, idle

CHAT = [{"role": "user", "content": "Write a long story about a lighthouse keeper and the sea."}]
PROMPT = "Once upon a time, in a lighthouse by the sea, there lived"
BUDGET = 400  # the cutting team's tokens a day
KEYS = {"web": "key-web", "cutter": "key-cutter"}


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    harness.require()
    g = harness.Local(tmp_path_factory.mktemp("rewrite"), KEYS, budgets={"cutter": {"tokens_per_day": BUDGET}})
    try:
        yield g.start()
    finally:
        g.stop()


def sdk(g, team="web") -> openai.OpenAI:
    return openai.OpenAI(base_url=g.gateway + "/v1", api_key=KEYS[team], max_retries=0, timeout=120)


def server_prompt_tokens(g, kind: str) -> int:
    """What llama-server itself reports as the prompt of the request (asked directly, not streamed)."""
    direct = openai.OpenAI(base_url=g.direct + "/v1", api_key="-", max_retries=0, timeout=120)
    if kind == "chat":
        return direct.chat.completions.create(model=ALIAS, messages=CHAT, max_tokens=1).usage.prompt_tokens
    return direct.completions.create(model=ALIAS, prompt=PROMPT, max_tokens=1).usage.prompt_tokens


def cut_stream(g, kind: str, team: str = "web", events: int = 6) -> tuple[int, dict | None]:
    """An OpenAI SDK stream of 2,000 tokens that its client leaves after `events` events: (events
    read, the last timings the client saw)."""
    client = sdk(g, team)
    extra = {"extra_body": {"ignore_eos": True}, "max_tokens": 2000, "stream": True, "model": ALIAS}
    s = client.chat.completions.create(messages=CHAT, **extra) if kind == "chat" else \
        client.completions.create(prompt=PROMPT, **extra)
    n, timings = 0, None
    with s:
        for chunk in s:
            n += 1
            timings = (chunk.model_extra or {}).get("timings") or timings
            if n == events:
                break  # the client goes away mid-stream (the SDK closes the connection)
    return n, timings


def used_today(g, team: str) -> int:
    m = re.search(r'^voltafleet_team_budget_used_tokens\{team="%s",period="day"\} (\d+)$' % team,
                  httpx.get(g.metrics, timeout=10).text, re.M)
    return int(m.group(1)) if m else 0


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_a_cut_openai_stream_counts_the_prompt_the_server_evaluated(gw, kind):
    plain = server_prompt_tokens(gw, kind)
    s0 = idle(gw)
    d, (n, timings) = counted(gw, lambda: cut_stream(gw, kind), team="web")
    generated = idle(gw)["tokens_predicted_total"] - s0["tokens_predicted_total"]
    assert n == 6 and d["cut_streams_total"] == 1 and d["requests_total"] == 1, d
    # each event the client read carried the server's figures (timings_per_token added by the gateway)
    assert timings["cache_n"] + timings["prompt_n"] == plain, timings
    assert d["prompt_tokens_total"] == plain > 10, (d, plain)
    # completion: the last event the gateway forwarded (at least what the client read, at most what was generated)
    assert timings["predicted_n"] <= d["completion_tokens_total"] <= generated < 2000, (d, timings, generated)


def test_a_team_that_always_cuts_its_streams_reaches_its_budget(gw):
    """The escape issue 39 left: a client cutting every stream before its end counted no prompt
    and spent its budget only by the text events. Now each cut stream counts its prompt."""
    plain = server_prompt_tokens(gw, "chat")
    served = 0
    for _ in range(BUDGET // plain + 2):
        before = used_today(gw, "cutter")
        if before >= BUDGET:
            with pytest.raises(openai.RateLimitError) as e:
                cut_stream(gw, "chat", team="cutter")
            assert e.value.body["code"] == "insufficient_quota"
            break
        _, timings = cut_stream(gw, "chat", team="cutter", events=3)
        idle(gw)  # the cut stream's slot has stopped: HAProxy has logged (counted) it
        grew = used_today(gw, "cutter") - before
        # prompt + the completion tokens the gateway forwarded (a few: the client read 3 events)
        assert plain + timings["predicted_n"] <= grew <= plain + 40, (grew, plain, timings)
        served += 1
    else:
        raise AssertionError(f"never refused: {used_today(gw, 'cutter')} tokens used of {BUDGET}")
    assert 1 <= served <= BUDGET // plain + 1, served


def events(resp_lines: list[str]) -> list[dict]:
    return [json.loads(line[6:]) for line in resp_lines if line.startswith("data: {")]


def stream_lines(base: str, path: str, body: dict | bytes, key: str | None = None) -> tuple[int, list[str]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    kw = {"content": body, "headers": {**headers, "content-type": "application/json"}} if isinstance(body, bytes) \
        else {"json": body, "headers": headers}
    with httpx.Client(base_url=base, timeout=120) as c:
        with c.stream("POST", path, **kw) as r:
            return r.status_code, list(r.iter_lines())


def test_the_client_gets_the_servers_own_stream_with_timings_in_every_event(gw):
    body = {"messages": CHAT, "max_tokens": 24, "stream": True, "temperature": 0, "seed": 7}
    _, direct = stream_lines(gw.direct, "/v1/chat/completions", body)
    code, through = stream_lines(gw.gateway, "/v1/chat/completions", body, KEYS["web"])
    a, b = events(direct), events(through)
    assert code == 200 and len(a) == len(b) > 20
    assert sum("timings" in e for e in a) == 1  # direct: only the last event
    assert all("timings" in e for e in b[1:]) and "timings" not in b[0]  # all but the role's event
    strip = ("timings", "id", "created")
    assert [{k: v for k, v in e.items() if k not in strip} for e in a] == \
        [{k: v for k, v in e.items() if k not in strip} for e in b]
    others = [[line for line in lines if not line.startswith("data: {")] for lines in (direct, through)]
    assert others[0] == others[1] and "data: [DONE]" in others[1]  # the same framing, the same end


@pytest.mark.parametrize("raw", [
    b'{"timings_per_token": false, "prompt": "%s", "max_tokens": 8, "stream": true}',  # its own false
    b'{\n  "prompt": "%s",\n  "max_tokens": 8,\n  "stream": true\n}\n\n',  # pretty-printed, newlines after
    b'{"prompt": "%s", "max_tokens": 8, "stream": true, "pad": "' + b"x" * 60000 + b'"}',  # over HAProxy's buffer
], ids=["its-own-false", "pretty-printed", "over-the-buffer"])
def test_any_body_gets_the_member_and_a_content_length_that_holds(gw, raw):
    raw = raw.replace(b"%s", PROMPT.encode())
    plain = server_prompt_tokens(gw, "completions")
    d, (code, lines) = counted(gw, lambda: stream_lines(gw.gateway, "/v1/completions", raw, KEYS["web"]))
    ev = events(lines)
    assert code == 200 and len(ev) == 9 and all("timings" in e for e in ev), (code, lines[:2])
    assert d["prompt_tokens_total"] == plain and d["completion_tokens_total"] == 8, d


def test_a_chunked_body_gets_the_member_too(gw):
    def parts():
        yield b'{"messages": [{"role": "user", "content": "hi"}], '
        time.sleep(0.2)
        yield b'"max_tokens": 5, "stream": true, "ignore_eos": true}'

    with httpx.Client(base_url=gw.gateway, headers={"Authorization": f"Bearer {KEYS['web']}"}, timeout=60) as c:
        with c.stream("POST", "/v1/chat/completions", content=parts()) as r:
            assert r.headers.get("content-length") is None
            ev = events(list(r.iter_lines()))
    assert r.status_code == 200 and len(ev) == 7 and sum("timings" in e for e in ev) == 6, ev


def test_a_body_whose_brace_went_before_a_long_run_of_spaces_is_refused_by_the_server(gw):
    """A client cannot slip past the member with spaces after its JSON: over 4 KB of them and the
    member lands after the object, which the server refuses; nothing is generated, nothing counted."""
    raw = json.dumps({"messages": CHAT, "max_tokens": 50, "stream": True}).encode() + b" " * 20000
    d, (code, lines) = counted(gw, lambda: stream_lines(gw.gateway, "/v1/chat/completions", raw, KEYS["web"]))
    assert code >= 400 and "parse error" in "".join(lines) and d["completion_tokens_total"] == 0, (code, lines)


def native(g, path: str, body: dict) -> httpx.Response:
    return httpx.post(g.gateway + path, json=body, headers={"Authorization": f"Bearer {KEYS['web']}"}, timeout=120)


@pytest.mark.parametrize("path", ["/completion", "/completions"])
def test_response_fields_is_refused_with_a_400_naming_it(gw, path):
    s0 = idle(gw)
    body = {"prompt": PROMPT, "input_prefix": "def f(", "input_suffix": ")", "n_predict": 5,
            "response_fields": ["content"]}
    d, r = counted(gw, lambda: native(gw, path, body))
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "response_fields" and err["type"] == "invalid_request_error"
    assert "response_fields" in err["message"] and err["code"] == "unsupported_parameter"
    assert d["requests_total"] == 1 and d["prompt_tokens_total"] == d["completion_tokens_total"] == 0
    assert idle(gw)["tokens_predicted_total"] == s0["tokens_predicted_total"]  # it never reached the server
    assert native(gw, path, {k: v for k, v in body.items() if k != "response_fields"}).status_code == 200


@pytest.mark.parametrize("path, body", [
    # response_fields after HAProxy's buffer (the 400's match reads the buffered start of the body)
    ("/completion", {"prompt": PROMPT, "n_predict": 7, "pad": "x" * 40000, "response_fields": ["content"]}),
], ids=["after-the-buffer"])
def test_response_fields_the_gateway_cannot_see_is_overridden_and_the_answer_counted(gw, path, body):
    d, r = counted(gw, lambda: native(gw, path, body))
    answer = r.json()
    assert r.status_code == 200 and answer["tokens_predicted"] == 7 and "generation_settings" in answer
    assert (d["prompt_tokens_total"], d["completion_tokens_total"]) == (answer["tokens_evaluated"], 7)


def test_a_path_spelled_with_an_escape_is_refused_before_any_server(gw):
    """llama-server decodes %XX before routing: "/%63ompletion" would reach /completion around the 400's
    match. The gateway lets only exact spellings through (closed by route): a 404 from the gateway."""
    s0 = idle(gw)
    for path in ("/%63ompletion", "/v1/chat%2Fcompletions", "/v1/chat/completions/", "//completion"):
        r = native(gw, path, {"prompt": PROMPT, "n_predict": 7, "response_fields": ["content"]})
        assert r.status_code == 404 and r.json()["error"]["code"] == "route_not_found", (path, r.text)
    assert idle(gw)["tokens_predicted_total"] == s0["tokens_predicted_total"]  # none reached the server


def test_a_request_without_a_member_route_passes_unchanged(gw):
    """/v1/models (no figures to carry) is not rewritten: its answer is the server's own."""
    r = httpx.get(gw.gateway + "/v1/models", headers={"Authorization": f"Bearer {KEYS['web']}"}, timeout=30)
    direct = httpx.get(gw.direct + "/v1/models", timeout=30)
    assert r.status_code == 200 and r.json()["data"][0]["id"] == direct.json()["data"][0]["id"] == ALIAS
    assert gw.team_counters("web")["requests_total"] > 0
