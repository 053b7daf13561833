"""Usage per team is exact (issue 39 item 2): each answer's tokens, as /metrics/teams counts them
through the project's own gateway (template and Lua filter, HAProxy of this machine), equal
the figures llama-server reports for the same requests: streamed and not, chat, completions
and the native /completion, answers over 64 KiB; a stream its client cuts counts what the
gateway forwarded, its prompt included (test_request_rewrite). Skipped where haproxy or the
pinned llama-server is not on this machine."""
from __future__ import annotations

import json
import re
import time

import httpx
import openai
import pytest

from tests.gateway_local.harness import ALIAS

CHAT = [{"role": "user", "content": "Count from one to twenty in words."}]


def server(g) -> dict[str, float]:
    """llama-server's own Prometheus counters (--metrics)."""
    text = httpx.get(g.direct + "/metrics", timeout=10).text
    return {m: float(v) for m, v in re.findall(r"^llamacpp:(\w+) (\S+)$", text, re.M)}


def counted(g, send, team: str = "web") -> tuple[dict[str, float], object]:
    """send()'s result and what the gateway counted for the team meanwhile (counter deltas),
    once the request was logged."""
    before = g.team_counters(team)
    out = send()
    time.sleep(0.3)  # the log line (which counts) is written as the connection's request ends
    after = g.team_counters(team)
    return {k: after[k] - before.get(k, 0) for k in after}, out


def sdk(g, key="key-web") -> openai.OpenAI:
    return openai.OpenAI(base_url=g.gateway + "/v1", api_key=key, max_retries=0, timeout=120)


def test_non_streamed_chat_and_completions_count_the_usage_block(local_gateway):
    g = local_gateway
    d, r = counted(g, lambda: sdk(g).chat.completions.create(model=ALIAS, messages=CHAT, max_tokens=40))
    assert (d["prompt_tokens_total"], d["completion_tokens_total"]) == (r.usage.prompt_tokens, r.usage.completion_tokens)
    assert r.usage.completion_tokens == 40 and d["requests_total"] == 1 and d["cut_streams_total"] == 0
    assert d["reasoning_tokens_total"] == 0  # this llama-server pin reports no reasoning_tokens (its thought is in the 40)
    assert r.choices[0].message.model_extra.get("reasoning_content")
    d, r = counted(g, lambda: sdk(g).completions.create(model=ALIAS, prompt="Once upon a time", max_tokens=25))
    assert (d["prompt_tokens_total"], d["completion_tokens_total"]) == (r.usage.prompt_tokens, 25)


def stream_chat(g, **extra):
    """A streamed chat answer through the SDK: (its chunks' text events, the last chunk's timings,
    the usage chunk or None)."""
    events, timings, usage = 0, None, None
    for c in sdk(g).chat.completions.create(model=ALIAS, messages=CHAT, max_tokens=60, stream=True,
                                            extra_body={"ignore_eos": True}, **extra):
        events += bool(c.choices and (c.choices[0].delta.content or c.choices[0].delta.model_extra.get("reasoning_content")))
        timings = (c.model_extra or {}).get("timings") or timings
        usage = c.usage or usage
    return events, timings, usage


def test_a_streamed_chat_counts_the_servers_own_figures_with_or_without_include_usage(local_gateway):
    g = local_gateway
    plain = sdk(g).chat.completions.create(model=ALIAS, messages=CHAT, max_tokens=1).usage.prompt_tokens
    d, (events, timings, usage) = counted(g, lambda: stream_chat(g))
    assert usage is None and timings["predicted_n"] == 60  # no usage chunk: the last chunk's timings
    assert d["completion_tokens_total"] == 60 and d["prompt_tokens_total"] == timings["cache_n"] + timings["prompt_n"] == plain
    d, (events, timings, usage) = counted(g, lambda: stream_chat(g, stream_options={"include_usage": True}))
    assert (d["prompt_tokens_total"], d["completion_tokens_total"]) == (usage.prompt_tokens, usage.completion_tokens) == (plain, 60)
    assert d["cut_streams_total"] == 0


def test_streamed_completions_and_the_native_completion_count_exactly(local_gateway):
    g = local_gateway

    def v1():
        return [c for c in sdk(g).completions.create(model=ALIAS, prompt="Once upon a time", max_tokens=30, stream=True,
                                                     extra_body={"ignore_eos": True})][-1].usage

    d, usage = counted(g, v1)
    assert (d["prompt_tokens_total"], d["completion_tokens_total"]) == (usage.prompt_tokens, 30)

    def native(stream: bool) -> dict:
        body = {"prompt": "Once upon a time", "n_predict": 35, "ignore_eos": True, "stream": stream}
        with httpx.Client(base_url=g.gateway, headers={"Authorization": "Bearer key-batch"}, timeout=120) as c:
            if not stream:
                return c.post("/completion", json=body).json()
            with c.stream("POST", "/completion", json=body) as r:
                return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")][-1]

    for stream in (False, True):
        d, last = counted(g, lambda: native(stream), team="batch")
        assert (d["prompt_tokens_total"], d["completion_tokens_total"]) == (last["tokens_evaluated"], 35)
    assert g.team_counters("web").get("requests_total", 0) > 0  # the other team's usage is its own (counted above)


def test_an_answer_over_64_kib_counts_whole_streamed_or_not(local_gateway):
    g = local_gateway
    raw_box = {}

    def big():
        raw = sdk(g).chat.completions.with_raw_response.create(model=ALIAS, messages=CHAT, max_tokens=300, logprobs=True,
                                                                top_logprobs=20, extra_body={"ignore_eos": True})
        raw_box["bytes"] = len(raw.content)
        return raw.parse()

    d, r = counted(g, big)
    assert raw_box["bytes"] > 64 * 1024, raw_box
    assert (d["prompt_tokens_total"], d["completion_tokens_total"]) == (r.usage.prompt_tokens, 300)

    def long_stream():
        size = 0
        with httpx.Client(base_url=g.gateway, headers={"Authorization": "Bearer key-web"}, timeout=300) as c:
            with c.stream("POST", "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 1500, "stream": True,
                                                                 "ignore_eos": True}) as resp:
                for chunk in resp.iter_bytes():
                    size += len(chunk)
        return size

    d, size = counted(g, long_stream)
    assert size > 64 * 1024 and d["completion_tokens_total"] == 1500 and d["cut_streams_total"] == 0


def idle(g) -> dict[str, float]:
    """The server's counters once no request is in flight (a cut stream's slot has stopped)."""
    for _ in range(100):
        s = server(g)
        if s.get("requests_processing", 0) == 0:
            return s
        time.sleep(0.1)
    raise AssertionError("llama-server still busy")


@pytest.mark.parametrize("path", ["/completion", "/v1/chat/completions"])
def test_a_stream_its_client_cuts_counts_what_the_gateway_sent(local_gateway, path):
    g = local_gateway
    body = {"prompt": "Once upon a time", "n_predict": 3000} if path == "/completion" else \
        {"messages": CHAT, "max_tokens": 3000}
    s0 = idle(g)
    seen = {"events": 0, "last": None}

    def cut():
        with httpx.Client(base_url=g.gateway, headers={"Authorization": "Bearer key-web"}, timeout=60) as c:
            with c.stream("POST", path, json={**body, "stream": True, "ignore_eos": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        seen["events"] += 1
                        seen["last"] = line
                        if seen["events"] == 40:
                            return  # the client goes away mid-stream

    d, _ = counted(g, cut)
    s1 = idle(g)
    generated = s1["tokens_predicted_total"] - s0["tokens_predicted_total"]
    assert d["cut_streams_total"] == 1 and d["requests_total"] == 1, d
    # what the gateway forwarded: at least what the client read, at most what the server generated (fewer than asked)
    assert 40 <= d["completion_tokens_total"] <= generated < 3000, (d, generated)
    # each event carries the prompt's tokens: native, tokens_evaluated; chat, its timings (the gateway adds
    # timings_per_token to the request)
    last = json.loads(seen["last"][6:])
    prompt = last["tokens_evaluated"] if path == "/completion" else last["timings"]["cache_n"] + last["timings"]["prompt_n"]
    assert d["prompt_tokens_total"] == prompt > 0, (d, last)
    if path != "/completion":  # exact: the last forwarded event's predicted_n, not a count of text events
        assert d["completion_tokens_total"] >= last["timings"]["predicted_n"]


# ------------------------------------------------ issue 48: /v1/messages (Anthropic), counted exactly

STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper, the sea and a storm that "
                                     "lasted for three days and three nights without end."}]


def messages(g, max_tokens: int, stream: bool = False, cut: int | None = None) -> dict:
    """POST /v1/messages through the gateway (httpx, keep-alive): the whole answer, or a stream's events
    {type: [data, ...]} read to its end or left after `cut` events."""
    body = {"model": ALIAS, "max_tokens": max_tokens, "messages": STORY, "stream": stream}
    with httpx.Client(base_url=g.gateway, headers={"Authorization": "Bearer key-web"}, timeout=120) as c:
        if not stream:
            r = c.post("/v1/messages", json=body)
            assert r.status_code == 200, r.text
            return r.json()
        seen: dict[str, list[dict]] = {}
        n = 0
        with c.stream("POST", "/v1/messages", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    event = json.loads(line[6:])
                    seen.setdefault(event["type"], []).append(event)
                    n += 1
                    if n == cut:
                        break  # the client goes away mid-stream
        return seen


def test_anthropic_messages_count_the_cached_prompt_too(local_gateway):
    """llama-server reports input_tokens without the cached part (cache_read_input_tokens beside it): a
    follow-up that reuses the slot's cache counts its whole prompt, as the server evaluated it."""
    g = local_gateway
    d1, first = counted(g, lambda: messages(g, 20))
    d2, second = counted(g, lambda: messages(g, 20))
    for d, r in ((d1, first), (d2, second)):
        u = r["usage"]
        assert d["prompt_tokens_total"] == u["input_tokens"] + u["cache_read_input_tokens"], (d, u)
        assert d["completion_tokens_total"] == u["output_tokens"] == 20 and d["requests_total"] == 1, (d, u)
    assert second["usage"]["cache_read_input_tokens"] > 0, second["usage"]  # the same prompt: its slot's cache
    assert d2["prompt_tokens_total"] == d1["prompt_tokens_total"]


def test_a_streamed_anthropic_answer_counts_message_start_and_message_delta(local_gateway):
    g = local_gateway
    d, ev = counted(g, lambda: messages(g, 30, stream=True))
    start = ev["message_start"][0]["message"]["usage"]
    assert start["output_tokens"] == 0  # the server's first event: its 0 is not the answer's figure
    assert d["prompt_tokens_total"] == start["input_tokens"] + start["cache_read_input_tokens"], (d, start)
    assert d["completion_tokens_total"] == ev["message_delta"][-1]["usage"]["output_tokens"] == 30, d
    assert d["cut_streams_total"] == 0


def test_a_cut_anthropic_stream_counts_the_events_it_forwarded(local_gateway):
    """Cut after 8 events (before message_delta): its prompt from message_start, its completion the
    content_block_delta events the gateway forwarded, at least what the client read, at most what the
    server generated (never the first event's 0)."""
    g = local_gateway
    s0 = idle(g)
    d, ev = counted(g, lambda: messages(g, 3000, stream=True, cut=8))
    generated = idle(g)["tokens_predicted_total"] - s0["tokens_predicted_total"]
    start = ev["message_start"][0]["message"]["usage"]
    read = len(ev.get("content_block_delta", []))
    assert "message_delta" not in ev and d["cut_streams_total"] == 1, (d, list(ev))
    assert d["prompt_tokens_total"] == start["input_tokens"] + start["cache_read_input_tokens"] > 0, (d, start)
    assert 0 < read <= d["completion_tokens_total"] <= generated < 3000, (d, read, generated)
