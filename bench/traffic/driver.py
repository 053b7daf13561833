"""Replay a traffic schedule (bench/traffic/model.py) against a llama-server or the gateway; stdlib only
(it runs on the GPU machine as the proof's `traffic51` phase, and here).

    .venv/bin/python -m bench.traffic.driver --port 8080 [--host 127.0.0.1] [--key-file F] \\
        [--per-slot 1] [--slots 16] [--turn-s 6 | --calibrate] [--seed 51] [--conversations N] [--out R.json]

Each conversation is a thread: it waits for its arrival, sends its opening, then after each answer
waits its think time and sends the next turn, the history as a chat client keeps it
(voltafleet.hostside.workload: the model's chat template on the server, thinking on with the turn's
budget, the answer sent back as its content alone, never the thought). Requests go out on a pool of
workload.Client connections (llama-server closes a connection after each streamed answer, so a
client opens the next one at once); `X-Session-Id: <conversation>` goes with every request (the
gateway's conversation affinity; llama-server ignores it). A failed turn ends its conversation.

Per request: conversation, turn, when it was due and sent, TTFT, the tokens streamed (thought and
answer), the server's prompt tokens processed (timings.prompt_n) and found cached (timings.cache_n).
The summary: the cached share of follow-up prompts (tokens, and the median request's), follow-up and
opening TTFT p50/p99, aggregate tok/s, and the busy share of the slots the run achieved.
"""
from __future__ import annotations

import argparse
import json
import queue
import statistics
import threading
import time

from bench.traffic.model import Params, Schedule, schedule
from voltafleet.hostside import workload
from voltafleet.hostside.workload import cached_share, history, percentile


def request(pool: queue.Queue, messages: list[dict], turn, conv_id: str, t0: float) -> tuple[dict, str | None]:
    """One turn on a pooled connection: its record and the answer's content (None when it failed)."""
    wait = time.monotonic()
    c = pool.get()
    sent = time.monotonic()
    rec = {"sent_s": round(sent - t0, 4), "pool_wait_ms": round((sent - wait) * 1000, 2)}
    try:
        got = c.chat(messages, turn.max_tokens, thinking_budget=turn.thinking_tokens,
                     headers={"X-Session-Id": conv_id})
    except Exception as e:  # noqa: BLE001  (a record, and the conversation ends)
        c.reset()
        rec.update(error=f"{type(e).__name__}: {e}"[:300], end_s=round(time.monotonic() - t0, 4))
        return rec, None
    finally:
        pool.put(c)
    timings, usage = got["timings"], got["usage"]
    rec.update(ttft_ms=round((got["first"] - got["start"]) * 1000, 2), end_s=round(got["end"] - t0, 4),
               tokens=int(usage.get("completion_tokens") or got["chunks"]), reasoning_chunks=got["reasoning_chunks"],
               content_chunks=got["content_chunks"], prompt_n=timings.get("prompt_n"), cache_n=timings.get("cache_n"),
               prompt_tokens=usage.get("prompt_tokens"), cached_share=cached_share(timings),
               content_chars=len(got["content"]))
    return rec, got["content"]


def replay(s: Schedule, port: int, host: str = "127.0.0.1", key: str | None = None, pool_size: int | None = None,
           model: str | None = None) -> dict:
    """Replay `s` in real time; the records (one per request sent, in order of sending) and the summary."""
    workload.HOST[0] = host
    pool: queue.Queue = queue.Queue()
    for _ in range(pool_size or max(1, round(s.params.population))):
        pool.put(workload.Client(port, key, None))
    records, lock = [], threading.Lock()
    t0 = time.monotonic()

    def converse(conv) -> None:
        messages = [{"role": "system", "content": s.system}] if s.system else []
        due = conv.arrival_s
        for turn in conv.turns:
            time.sleep(max(0.0, due - (time.monotonic() - t0)))
            messages = messages + [{"role": "user", "content": turn.text}]
            rec, content = request(pool, messages, turn, conv.id, t0)
            rec = {"conversation": conv.id, "turn": turn.index, "followup": turn.index > 0, "due_s": round(due, 4),
                   "user_tokens": turn.user_tokens, "thinking_tokens": turn.thinking_tokens,
                   "answer_tokens": turn.answer_tokens, **rec}
            with lock:
                records.append(rec)
            if content is None:
                return
            messages = history(messages, content)  # the answer alone: the thought is never sent back
            due = rec["end_s"] + (conv.turns[turn.index + 1].think_s if turn.index + 1 < len(conv.turns) else 0)

    threads = [threading.Thread(target=converse, args=(c,), daemon=True) for c in s.conversations]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records.sort(key=lambda r: r["sent_s"])
    return {"fingerprint": s.fingerprint(), "rate": s.rate, "think_s": s.think_s, "records": records,
            "summary": summarise(records, s.params.slots)}


def summarise(records: list[dict], slots: int) -> dict:
    """The run's figures from its records: follow-ups' cached share (all their prompt tokens, and the
    median request's), TTFT p50/p99 of follow-ups and openings, aggregate tok/s (every streamed token
    over the first send to the last token), the slots' busy share (request time over slots x wall)."""
    ok = [r for r in records if "error" not in r]
    follow = [r for r in ok if r["followup"]]
    counted = [r for r in follow if r.get("cache_n") is not None and r.get("prompt_n") is not None]
    cached, fresh = sum(r["cache_n"] for r in counted), sum(r["prompt_n"] for r in counted)
    out = {"requests": len(records), "errors": len(records) - len(ok), "followups": len(follow),
           "followup_cached_share": round(cached / (cached + fresh), 4) if cached + fresh else None,
           "followup_cached_p50": percentile([r["cached_share"] for r in counted if r["cached_share"] is not None], 50),
           "followup_ttft_p50_ms": percentile([r["ttft_ms"] for r in follow], 50),
           "followup_ttft_p99_ms": percentile([r["ttft_ms"] for r in follow], 99),
           "opening_ttft_p50_ms": percentile([r["ttft_ms"] for r in ok if not r["followup"]], 50),
           "opening_ttft_p99_ms": percentile([r["ttft_ms"] for r in ok if not r["followup"]], 99)}
    if ok:
        wall = max(r["end_s"] for r in ok) - min(r["sent_s"] for r in ok)
        busy = sum(r["end_s"] - r["sent_s"] for r in ok)
        out.update(wall_s=round(wall, 2), tokens=sum(r["tokens"] for r in ok),
                   aggregate_tps=round(sum(r["tokens"] for r in ok) / wall, 2) if wall > 0 else None,
                   mean_turn_s=round(statistics.mean(r["end_s"] - r["sent_s"] for r in ok), 3),
                   busy_share=round(busy / (slots * wall), 3) if wall > 0 else None)
    return out


def calibrate(p: Params, port: int, host: str = "127.0.0.1", key: str | None = None, n: int | None = None) -> float:
    """turn_s measured: the openings of a schedule of p, `n` at once (default round(busy x slots), the
    slots the run keeps busy), each a single turn; the mean seconds one held its slot. Follow-ups are
    shorter prompts, so this errs long (a lower rate): the run's summary gives the busy share achieved."""
    workload.HOST[0] = host
    n = n or max(1, round(p.busy * p.slots))
    s = schedule(Params(**{**p.__dict__, "conversations": n, "seed": p.seed + 100_000}))
    times, lock = [], threading.Lock()

    def one(conv) -> None:
        turn = conv.turns[0]
        got = workload.Client(port, key, None).chat([{"role": "user", "content": turn.text}], turn.max_tokens,
                                                    thinking_budget=turn.thinking_tokens)
        with lock:
            times.append(got["end"] - got["start"])
    threads = [threading.Thread(target=one, args=(c,)) for c in s.conversations]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not times:
        raise RuntimeError("calibration: no request answered")
    return statistics.mean(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--key-file")
    ap.add_argument("--seed", type=int, default=51)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--per-slot", type=float, default=1)
    ap.add_argument("--busy", type=float, default=0.8)
    ap.add_argument("--turn-s", type=float, default=6.0)
    ap.add_argument("--calibrate", action="store_true", help="measure turn_s first (driver.calibrate)")
    ap.add_argument("--conversations", type=int)
    ap.add_argument("--out", help="the records and summary as JSON")
    a = ap.parse_args(argv)
    key = open(a.key_file).read().strip() if a.key_file else None
    p = Params(seed=a.seed, slots=a.slots, per_slot=a.per_slot, busy=a.busy, turn_s=a.turn_s,
               conversations=a.conversations)
    if a.calibrate:
        p = Params(**{**p.__dict__, "turn_s": calibrate(p, a.port, a.host, key)})
    r = replay(schedule(p), a.port, a.host, key)
    r["turn_s"] = p.turn_s
    if a.out:
        with open(a.out, "w") as f:
            json.dump(r, f, indent=1)
    print(json.dumps({"turn_s": p.turn_s, "rate": r["rate"], "think_s": r["think_s"], **r["summary"]}, indent=1))
    return 0 if not r["summary"]["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
