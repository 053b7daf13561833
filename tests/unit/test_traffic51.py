"""Issue 51 item 1: the traffic model (bench/traffic/model.py) is seeded and replayable, its arrivals,
lengths, population and rate are the stated ones; the driver sends the history without the thought;
qwen35gen's varying file keeps the shape and writes symmetric seeded weights."""
import functools
import json
import statistics
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from bench.traffic import driver
from bench.traffic.model import (Lognormal, Params, arrival_rate, describe, mean_turns, offered_load, params_from,
                                 schedule, think_time)
from lab import qwen35gen as gen


@functools.lru_cache(maxsize=None)
def big(**kw):
    """A long schedule (thousands of conversations), made once."""
    return schedule(Params(**kw))


def test_same_seed_same_schedule_other_seed_another():
    a, b, c = schedule(Params(seed=7)), schedule(Params(seed=7)), schedule(Params(seed=8))
    assert a == b and a.to_json() == b.to_json() and a.fingerprint() == b.fingerprint()
    assert c.fingerprint() != a.fingerprint()
    assert [x.arrival_s for x in c.conversations] != [x.arrival_s for x in a.conversations]
    assert a.conversations[0].turns[0].text != c.conversations[0].turns[0].text
    assert [e["conversation"] for e in a.events()] == [e["conversation"] for e in b.events()]
    # a conversation does not change with the run's size
    assert schedule(Params(seed=7, conversations=5)).conversations[3] == a.conversations[3]
    assert params_from(json.loads(json.dumps(a.to_json()["params"]))) == a.params


def test_arrivals_are_poisson_at_the_stated_rate():
    s = big(conversations=4000)
    gaps = [y.arrival_s - x.arrival_s for x, y in zip(s.conversations, s.conversations[1:])]
    assert statistics.mean(gaps) == pytest.approx(1 / s.rate, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(1 / s.rate, rel=0.07)  # exponential: sd = mean
    pauses = [t.think_s for c in s.conversations for t in c.turns[1:]]
    assert statistics.mean(pauses) == pytest.approx(s.think_s, rel=0.05)


def test_lengths_have_the_stated_medians_and_turns_the_stated_mean():
    p = Params(conversations=4000)
    turns = [t for c in big(conversations=4000).conversations for t in c.turns]
    for name, dist, got in (("opening", p.opening, [t.user_tokens for t in turns if t.index == 0]),
                            ("followup", p.followup, [t.user_tokens for t in turns if t.index > 0]),
                            ("thinking", p.thinking, [t.thinking_tokens for t in turns]),
                            ("answer", p.answer, [t.answer_tokens for t in turns])):
        assert statistics.median(got) == pytest.approx(dist.median, rel=0.05), name
        assert dist.lo <= min(got) and max(got) <= dist.hi
    assert mean_turns(p) == pytest.approx(3.994, abs=0.001)
    assert len(turns) / 4000 == pytest.approx(mean_turns(p), rel=0.03)  # the context guard trims little
    text = big(conversations=4000).conversations[0].turns[0]
    assert len(text.text.split()) == text.user_tokens  # a word a token
    r = __import__("random").Random(1)
    assert statistics.median(Lognormal(100, 1.0, 1, 10_000).draw(r) for _ in range(20_000)) == pytest.approx(100, rel=0.05)


def test_every_conversation_fits_its_slot():
    p = Params(conversations=2000, ctx_per_slot=4096)
    for c in schedule(p).conversations:
        history = sum(t.user_tokens + t.answer_tokens for t in c.turns[:-1])
        last = c.turns[-1]
        assert history + last.user_tokens + last.max_tokens + 16 * len(c.turns) <= p.ctx_per_slot
        assert len(c.turns) >= 1


def test_busy_rate_formula():
    assert arrival_rate(0.8, 16, 4, 6.0) == pytest.approx(0.8 * 16 / 24)
    assert offered_load(arrival_rate(0.8, 16, 4, 6.0), 4, 6.0, 16) == pytest.approx(0.8)
    assert think_time(1, 0.8, 4, 6.0) == pytest.approx(0.25 * 24 / 3)
    with pytest.raises(ValueError):
        think_time(0.5, 0.8, 4, 6.0)
    s = schedule(Params(turn_s=3.0, busy=0.8))
    assert offered_load(s.rate, mean_turns(s.params), 3.0, 16) == pytest.approx(0.8)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_conversations_open_at_once_are_k_times_the_slots(k):
    """With each turn holding its slot turn_s (no queueing), the conversations open at once over the
    steady part of the run are per_slot x slots (Little's law), and the slots are `busy` busy."""
    p = Params(per_slot=k, conversations=3000, turn_s=5.0)
    s = big(per_slot=k, conversations=3000, turn_s=5.0)
    assert p.population == 16 * k
    spans, busy = [], 0.0
    for c in s.conversations:
        end = c.arrival_s + len(c.turns) * p.turn_s + sum(t.think_s for t in c.turns)
        spans.append((c.arrival_s, end))
        busy += len(c.turns) * p.turn_s
    lo, hi = s.conversations[300].arrival_s, s.conversations[-300].arrival_s  # past the ramp, before the tail
    open_time = sum(max(0.0, min(e, hi) - max(a, lo)) for a, e in spans)
    assert open_time / (hi - lo) == pytest.approx(16 * k, rel=0.08)
    assert busy / (16 * s.conversations[-1].arrival_s) == pytest.approx(0.8, rel=0.06)
    assert describe(s)["population"] == 16 * k


class _Chat(BaseHTTPRequestHandler):
    """A stand-in llama-server: streams a thought and an answer, says what it was sent."""
    seen: list = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append({"body": body, "session": self.headers.get("X-Session-Id")})
        n = len(self.seen)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunks = [{"choices": [{"delta": {"reasoning_content": f"SECRET-THOUGHT-{n} "}}]}] * 2
        chunks += [{"choices": [{"delta": {"content": f"answer-{n} "}}]}] * 3
        chunks += [{"choices": [], "usage": {"completion_tokens": 5, "prompt_tokens": 40},
                    "timings": {"cache_n": 30 if n > 1 else 0, "prompt_n": 10 if n > 1 else 40}}]
        for c in chunks:
            self.wfile.write(b"data: " + json.dumps(c).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True


def test_driver_sends_the_history_without_the_thought_and_records_every_request():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _Chat.seen = []
    try:
        small = Lognormal(5, 0.2, 2, 10)
        p = Params(seed=3, slots=1, per_slot=1, busy=0.5, turn_s=0.02, conversations=1, turns_extra=0, max_turns=3,
                   opening=small, followup=small, thinking=small, answer=small)
        s = schedule(replace(p, turns_extra=5))
        r = driver.replay(s, srv.server_address[1])
    finally:
        srv.shutdown()
    conv = s.conversations[0]
    assert len(_Chat.seen) == len(conv.turns) == len(r["records"]) == 3
    for i, (seen, turn) in enumerate(zip(_Chat.seen, conv.turns)):
        msgs = seen["body"]["messages"]
        assert seen["session"] == conv.id
        assert seen["body"]["thinking_budget_tokens"] == turn.thinking_tokens
        assert seen["body"]["max_tokens"] == turn.thinking_tokens + turn.answer_tokens
        assert [m["role"] for m in msgs] == ["user", "assistant"] * i + ["user"]
        assert msgs[-1]["content"] == turn.text
        assert "SECRET-THOUGHT" not in json.dumps(msgs)  # the thought never goes back
        for j in range(i):
            assert msgs[2 * j + 1]["content"] == f"answer-{j + 1} " * 3
    rec = r["records"]
    assert [x["turn"] for x in rec] == [0, 1, 2] and all("error" not in x for x in rec)
    assert all(x["reasoning_chunks"] == 2 and x["content_chunks"] == 3 and x["tokens"] == 5 for x in rec)
    sm = r["summary"]
    assert sm["followups"] == 2 and sm["followup_cached_share"] == 0.75 and sm["errors"] == 0
    assert sm["aggregate_tps"] > 0 and sm["followup_ttft_p50_ms"] is not None


def test_summary_figures():
    recs = [{"followup": False, "ttft_ms": 100.0, "sent_s": 0.0, "end_s": 2.0, "tokens": 10, "cache_n": 0,
             "prompt_n": 50, "cached_share": 0.0},
            {"followup": True, "ttft_ms": 20.0, "sent_s": 1.0, "end_s": 3.0, "tokens": 10, "cache_n": 90,
             "prompt_n": 10, "cached_share": 0.9},
            {"followup": True, "ttft_ms": 40.0, "sent_s": 2.0, "end_s": 4.0, "tokens": 20, "cache_n": 30,
             "prompt_n": 70, "cached_share": 0.3},
            {"followup": True, "error": "x", "sent_s": 3.0, "end_s": 3.1}]
    sm = driver.summarise(recs, slots=2)
    assert sm["requests"] == 4 and sm["errors"] == 1 and sm["followups"] == 2
    assert sm["followup_cached_share"] == pytest.approx(120 / 200)
    assert sm["aggregate_tps"] == pytest.approx(40 / 4) and sm["busy_share"] == pytest.approx(6 / (2 * 4))
    assert sm["followup_ttft_p99_ms"] == 40.0 and sm["opening_ttft_p50_ms"] == 100.0


@pytest.mark.parametrize("t", [gen.T.Q4_K, gen.T.Q5_K, gen.T.Q6_K, gen.T.Q8_0])
def test_random_blocks_are_symmetric_with_the_stated_spread(t):
    import gguf
    raw = np.frombuffer(gen.random_blocks(t, 2000, 0.1, np.random.default_rng(1)), dtype=np.uint8)
    v = gguf.quants.dequantize(raw.reshape(2000, -1), t).ravel()
    assert raw.size == 2000 * gguf.GGML_QUANT_SIZES[t][1]
    assert abs(v.mean()) < 0.002 and v.std() == pytest.approx(0.1, rel=0.02) and v.min() == -v.max()


def test_varying_file_keeps_the_shape_and_answers_with_plain_words(tmp_path):
    import gguf
    from tests.unit.test_qwen35 import _vocab_tokens
    toks = [f"t{i}" for i in range(400)]
    words = {7: "Ġfleet", 9: "Ġcanary", 11: "Ġserves"}
    for i, w in words.items():
        toks[i] = w
    toks[12] = "Ġab"  # too short: not an answer
    vocab = tmp_path / "vocab.gguf"
    _vocab_tokens(vocab, toks)
    shape = replace(gen.SHAPES["tiny"], n_embd=256, n_ff=512, head_dim=64, n_vocab=400)
    zero = gen.write_sparse(str(vocab), str(tmp_path / "zero.gguf"), shape)
    vary = gen.write_sparse(str(vocab), str(tmp_path / "vary.gguf"), shape, vary=5)
    again = gen.write_sparse(str(vocab), str(tmp_path / "again.gguf"), shape, vary=5)
    assert zero == vary == again
    assert (tmp_path / "vary.gguf").read_bytes() == (tmp_path / "again.gguf").read_bytes()  # seeded
    t = {x.name: x for x in gguf.GGUFReader(str(tmp_path / "vary.gguf")).tensors}
    z = {x.name: x for x in gguf.GGUFReader(str(tmp_path / "zero.gguf")).tensors}
    assert [(x.name, x.tensor_type, list(x.shape)) for x in t.values()] == \
        [(x.name, x.tensor_type, list(x.shape)) for x in z.values()]
    out = gguf.quants.dequantize(t["output.weight"].data, t["output.weight"].tensor_type)
    assert sorted(np.flatnonzero(np.abs(out).sum(axis=1))) == sorted(words)
    emb = gguf.quants.dequantize(t["token_embd.weight"].data, t["token_embd.weight"].tensor_type)
    assert (np.abs(emb).sum(axis=1) > 0).all()
    assert t["blk.3.attn_q.weight"].data.any() and not t["blk.2.attn_qkv.weight"].data.any()
    assert not t["blk.3.ffn_down.weight"].data.any() and list(t["output_norm.weight"].data[:2]) == [1.0, 1.0]
    with pytest.raises(ValueError):
        gen.write_sparse(str(vocab), str(tmp_path / "both.gguf"), shape, accept=True, vary=1)
