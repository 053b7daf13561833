"""The API a client expects, through the lab gateway with the OpenAI SDK (issue 32, first part):
one stable model name on every instance, and usage in the stream."""
import openai
from tests.lab.helpers import GATEWAY_URL, SERVER_HOST

URL = GATEWAY_URL + "/v1"


def client() -> openai.OpenAI:
    return openai.OpenAI(base_url=URL, api_key="lab-has-no-key", max_retries=0, timeout=60)


def test_the_fleet_answers_to_one_model_name_and_shows_no_path(gw):
    c = client()
    seen = set()
    for _ in range(12):  # the gateway spreads new connections over the six instances
        ids = [m.id for m in c.models.list().data]
        assert ids == ["qwen3.6-27b"], ids  # server_model_alias, never <model_dir>/<sha16>/<file>.gguf
        seen.add(ids[0])
        c = client()
    assert seen == {"qwen3.6-27b"}
    r = c.completions.create(model="qwen3.6-27b", prompt="The capital of France is", max_tokens=4,
                             extra_body={"ignore_eos": True})
    assert r.model == "qwen3.6-27b" and r.usage.completion_tokens == 4


def test_usage_arrives_at_the_end_of_a_stream_through_the_gateway(gw):
    stream = client().chat.completions.create(
        model="qwen3.6-27b", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    usage = [ch.usage for ch in chunks if ch.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == 8 and usage[0].prompt_tokens > 0
    assert chunks[-1].usage is not None  # the last chunk carries it


def test_another_model_name_gets_openais_model_not_found_from_the_gateway(gw):
    import httpx
    import pytest

    with pytest.raises(openai.NotFoundError) as e:
        client().chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert e.value.code == "model_not_found" and e.value.body["param"] == "model"
    assert "this fleet serves qwen3.6-27b" in e.value.body["message"]
    # a request that names no model (llama-server's own /completion) or an empty one is served
    with httpx.Client(base_url=URL.removesuffix("/v1"), timeout=60) as h:
        assert h.post("/completion", json={"prompt": "hi", "n_predict": 2}).status_code == 200
        assert h.post("/v1/completions", json={"model": "", "prompt": "hi", "max_tokens": 2}).status_code == 200


def test_the_sdk_retries_a_busy_fleet_after_retry_after_and_succeeds(gw, tmp_path):
    """2x the fleet's slots in other clients and a 1 s queue: the gateway answers 503 with an
    OpenAI-shaped body and Retry-After; the SDK's own retry waits that long and is served (the
    other clients go at the first 503, so the fleet has room by the time the retry comes)."""
    import threading
    import time

    import httpx

    from bench.lab.load import PROMPT, Load
    from tests.lab.helpers import deploy, lab

    slots = 4 * 2 * len(lab()["hosts"])
    assert deploy({"gateway_queue_timeout_s": 1}, tmp_path).rc == 0
    seen, bodies = [], []

    def hook(r):
        if r.status_code == 503:  # the gateway's own answer: OpenAI's error shape
            r.read()
            bodies.append(r.json()["error"])
            if not load.stopping.is_set():  # the fleet was busy: its other clients go (the retry must find room)
                threading.Thread(target=load.abort, daemon=True).start()
        seen.append((time.monotonic(), r.status_code, r.headers.get("retry-after")))

    http = httpx.Client(event_hooks={"response": [hook]})
    sdk = openai.OpenAI(base_url=URL, api_key="lab-has-no-key", max_retries=8, timeout=120, http_client=http)
    # long streams hold every slot; the SDK sends the load's prompt, so affinity queues it behind them
    load = Load(URL.removesuffix("/v1"), clients=2 * slots, tokens=400, seconds=90, max_requests=600,
                streams_only=True).start()  # streams: the abort below ends their generation on the servers too
    try:
        got = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            seen.clear()
            r = sdk.completions.create(model="qwen3.6-27b", prompt=PROMPT, max_tokens=4, extra_body={"ignore_eos": True})
            if any(code == 503 for _, code, _ in seen):
                got = r
                break
        assert got is not None, "the fleet was never busy for the SDK"
        assert got.usage.completion_tokens == 4 and seen[-1][1] == 200
        busy = [(t, ra) for t, code, ra in seen if code == 503]
        assert all(ra == "5" for _, ra in busy)
        assert bodies and all(b["code"] == "fleet_busy" and b["type"] == "server_error" and "param" in b for b in bodies)
        # the retry came no sooner than Retry-After said (the SDK honours it)
        nxt = [t for t, code, _ in seen if t > busy[0][0]]
        assert nxt and nxt[0] - busy[0][0] >= 4.5
    finally:
        assert load.abort() == 0  # its 400-token streams only kept the fleet busy: cut at their next token
        http.close()
        assert deploy().rc == 0


# ---------------------------------------------------------------- issue 32: thinking, tools, JSON

BUDGET = 32  # group_vars/lab.yml server_reasoning_budget: the tiny model never ends a thought itself


def tokens(text: str) -> int:
    """The text's tokens, from a server's own /tokenize (on its host's port: the gateway serves no /tokenize)."""
    import httpx

    from tests.lab.helpers import lab

    port = lab()["hosts"][0]["server_port_base"]
    return len(httpx.post(f"http://{SERVER_HOST}:{port}/tokenize", json={"content": text}, timeout=30).json()["tokens"])


def test_thoughts_arrive_in_reasoning_content_within_the_fleet_budget_and_can_be_turned_off(gw):
    """The thought's length is counted in the server's own steps: a streamed delta each (re-tokenizing a sampled
    thought can give more tokens than the server generated: '대통령' came back as 3)."""
    c = client()
    ask = dict(model="qwen3.6-27b", messages=[{"role": "user", "content": "Why is the sky blue?"}], max_tokens=80)
    r = c.chat.completions.create(**ask)
    m = r.choices[0].message
    thought = m.model_extra["reasoning_content"]
    # the real template opens <think>; the server forces </think> after the budget, then the answer
    assert thought and m.content and "<think>" not in m.content and "</think>" not in m.content
    assert r.usage.completion_tokens == 80

    def streamed(**extra):
        """(the reasoning deltas, in the order they came, and the content) of one streamed answer; a delta is
        one token step of the server, and a chunk never carries both kinds."""
        steps, content = [], ""
        for ch in c.chat.completions.create(**ask, stream=True, **extra):
            if ch.choices:
                d = ch.choices[0].delta
                r_, c_ = (d.model_extra or {}).get("reasoning_content"), d.content
                assert not (r_ and c_)
                if r_:
                    assert not content  # reasoning first, then content, never back
                    steps.append(r_)
                content += c_ or ""
        return steps, content

    steps, content = streamed()
    assert 1 < len(steps) <= BUDGET + 1 and content  # the fleet's budget, then the answer
    # a request's own budget
    steps, content = streamed(extra_body={"thinking_budget_tokens": 4})
    assert 1 <= len(steps) <= 5 and content
    # greedy, the thought re-tokenizes to the server's own count (no sampled rarity to split)
    own = c.chat.completions.create(**ask, temperature=0, extra_body={"thinking_budget_tokens": 4}).choices[0].message
    assert tokens(own.model_extra["reasoning_content"]) <= 5 and own.content
    # thinking off for one request: no thought at all, the whole answer in content
    off = c.chat.completions.create(**ask, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert not off.choices[0].message.model_extra.get("reasoning_content") and off.choices[0].message.content


def test_a_request_with_tools_renders_through_the_real_qwen_template(gw):
    """The lab model carries the Qwen3.5/3.6 template; a server's own /apply-template (on its host's port:
    the gateway serves no /apply-template, closed by route) gives
    exactly the reference rendering of Python's jinja2 (tests/fixtures/api, kept as a fixture)."""
    import json

    import httpx

    from lab.fleet import ensure_sdist
    from tests.fixtures.api.render import PROMPT, REQUEST, render

    req = json.loads(REQUEST.read_text())
    for call in req["messages"][2]["tool_calls"]:  # as the OpenAI SDK sends them: arguments as a JSON string
        call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
    from tests.lab.helpers import lab

    port = lab()["hosts"][0]["server_port_base"]
    served = httpx.post(f"http://{SERVER_HOST}:{port}/apply-template", json=req, timeout=30).json()["prompt"]
    assert httpx.post(URL.removesuffix("/v1") + "/apply-template", json=req, timeout=30).status_code == 404
    assert served == PROMPT.read_text()
    template = (ensure_sdist() / "vendor/llama.cpp/models/templates/Qwen3.5-4B.jinja").read_text()
    assert render(template, json.loads(REQUEST.read_text())) == PROMPT.read_text()  # the fixture is still the reference
    assert "<tools>" in served and "<tool_call>\n<function=get_weather>" in served and "<tool_response>" in served
    # the SDK's own request with tools is served (the random model answers in text)
    r = client().chat.completions.create(model="qwen3.6-27b", messages=req["messages"], tools=req["tools"], max_tokens=8)
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer", "confidence"],
          "properties": {"answer": {"type": "string", "enum": ["yes", "no"]},
                         "confidence": {"type": "integer", "minimum": 0, "maximum": 100}}}


def valid(text: str) -> bool:
    import json

    d = json.loads(text)
    return set(d) == {"answer", "confidence"} and d["answer"] in ("yes", "no") \
        and type(d["confidence"]) is int and 0 <= d["confidence"] <= 100


def test_response_format_json_schema_holds_on_every_instance(gw):
    """Grammar-constrained: even the lab's random model answers valid JSON, on each of the six
    instances (direct) and through the gateway, thinking on (the budget ends it) or off."""
    import openai

    from tests.lab.helpers import lab

    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": SCHEMA}}
    ask = dict(model="qwen3.6-27b", messages=[{"role": "user", "content": "Is Paris in France?"}],
               max_tokens=300, temperature=1.0, response_format=fmt)
    ports = [(h["name"], h["server_port_base"] + i) for h in lab()["hosts"] for i in (0, 1)]
    for name, port in ports:
        direct = openai.OpenAI(base_url=f"http://{SERVER_HOST}:{port}/v1", api_key="lab", max_retries=0, timeout=120)
        for think in (True, False):
            r = direct.chat.completions.create(**ask, extra_body={"chat_template_kwargs": {"enable_thinking": think}})
            assert r.choices[0].finish_reason == "stop" and valid(r.choices[0].message.content), (name, port, r)
    for i in range(6):
        r = client().chat.completions.create(**ask, extra_headers={"x-session-id": f"json-{i}"})
        assert valid(r.choices[0].message.content), r
