"""The API a client expects, through the lab gateway with the OpenAI SDK (issue 32, first part):
one stable model name on every instance, and usage in the stream."""
import openai

URL = "http://127.0.0.1:18800/v1"


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
    OpenAI-shaped body and Retry-After; the SDK's own retry waits that long and is served."""
    import sys
    import time

    import httpx

    from tests.lab.helpers import REPO, deploy, lab

    sys.path.insert(0, str(REPO / "bench"))
    from load import PROMPT, Load

    slots = 4 * 2 * len(lab()["hosts"])
    assert deploy({"gateway_queue_timeout_s": 1}, tmp_path).rc == 0
    seen = []
    http = httpx.Client(event_hooks={"response": [lambda r: seen.append((time.monotonic(), r.status_code,
                                                                         r.headers.get("retry-after")))]})
    sdk = openai.OpenAI(base_url=URL, api_key="lab-has-no-key", max_retries=8, timeout=120, http_client=http)
    # long streams hold every slot; the SDK sends the load's prompt, so affinity queues it behind them
    load = Load(URL.removesuffix("/v1"), clients=2 * slots, tokens=400, seconds=90, max_requests=600).start()
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
        # the retry came no sooner than Retry-After said (the SDK honours it)
        nxt = [t for t, code, _ in seen if t > busy[0][0]]
        assert nxt and nxt[0] - busy[0][0] >= 4.5
    finally:
        load.stop()
        http.close()
        assert deploy().rc == 0
