"""Issue 51 item 4: the prompt (prefill) rates the checkpoint decision quotes, and their V100
consequences, from the raw records. Pure: no pyinfra, no GPU.

    .venv/bin/python -m bench.gpu.prefill51

The H200 under the chat workload: bench/records/proof38/run2, config chat-np16-ck0 (16 real chats on
v100_32gb's argv, the FORCE_MMQ build, no checkpoints: every follow-up reprocesses its whole history).
results.json holds each request's start and TTFT. The server's log lines the record keeps (its first
120) give each prompt's tokens and slot (`new prompt ... task.n_tokens = N`) for the first
repetition: turns 0 and 1 whole, 8 of turn 2's 16 prompts.
- A request's rate: its prompt tokens over its own TTFT. Prompts are matched to requests by order (the
  n-th prompt the server started is the n-th first token); within a turn the prompts differ by under 3 %.
- A wave's rate: the 16 prompts' tokens over the time from the first request sent to the last first token.
The H200 engine alone: llama-bench pp512 on the FORCE_MMQ build (bench/records/proof27/run2), median of 3.
The V100: 363-384 prompt tokens a second on the MMQ path, a field report (llama.cpp #25139, quoted in
docs/domain.md), not a record of ours.
Turn 3 of the same 16 chats without checkpoints: a follow-up returns to its conversation's slot, and each
turn adds about the same tokens to it (a 100-word question, the last answer's content, the template), so
its turn-3 prompt is its turn-1 prompt plus twice its growth from turn 0 to turn 1. Checked against the
turn-2 prompts the log keeps and against the turn-3 prompts bench/records/proof49/run3 logged for the first
8 of the same conversations (chat-np8-ck0: the same seeds, so the same turns 0 and 1).
"""
from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUN38 = REPO / "bench/records/proof38/run2/results.json"
RUN27 = REPO / "bench/records/proof27/run2/results.json"
RUN49 = REPO / "bench/records/proof49/run3/results.json"
V100_PP = (363, 384)  # prompt tok/s of a qwen35 27B on GV100s with FORCE_MMQ: llama.cpp #25139 (docs/domain.md)
CONFIG, SLOTS = "chat-np16-ck0", 16

# llama.cpp's log time is minutes.seconds.milliseconds.microseconds since the server started
PROMPT = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) I slot\s+operator\(\): id\s+(\d+) \| task -?\d+ \| "
                    r"new prompt, .*task\.n_tokens = (\d+)$")


def prompts(log: list[str]) -> list[tuple[float, int, int]]:
    """Every prompt the server started, in order: (seconds since its start, slot, prompt tokens)."""
    out = []
    for line in log:
        if m := PROMPT.match(line):
            mi, s, ms, us, slot, n = map(int, m.groups())
            out.append((mi * 60 + s + ms / 1e3 + us / 1e6, slot, n))
    return out


def turns(log: list[str], slots: int = SLOTS) -> list[dict[int, int]]:
    """The first repetition's turns as {slot: prompt tokens} in the order the server started them,
    `slots` prompts a turn after the warm-up's one; the last may be partial (the record keeps the
    log's first 120 lines)."""
    started = prompts(log)[1:]  # [0] is the warm-up request
    return [{slot: n for _, slot, n in started[i:i + slots]} for i in range(0, len(started), slots)]


def wave(recs: list[dict], tokens: list[int]) -> dict:
    """One turn's requests sent at once, `tokens` their prompts in the order the server started them:
    the wave's rate and the median request's (the n-th prompt started is the n-th first token)."""
    assert len(recs) == len(tokens)
    by_first = sorted(recs, key=lambda q: q["t_start"] + q["ttft_ms"] / 1000)
    span = max(q["t_start"] + q["ttft_ms"] / 1000 for q in recs) - min(q["t_start"] for q in recs)
    per_request = [n / (q["ttft_ms"] / 1000) for n, q in zip(tokens, by_first)]
    return {"tokens": sum(tokens), "span_s": span, "rate": sum(tokens) / span,
            "request_rate": statistics.median(per_request),
            "ttft_p50_ms": statistics.median(q["ttft_ms"] for q in recs)}


def turn3_tokens(by_turn: list[dict[int, int]]) -> int:
    """The prompt tokens of turn 3's 16 follow-ups: each conversation's turn 1 plus twice its growth."""
    t0, t1 = by_turn[0], by_turn[1]
    return sum(t1[s] + 2 * (t1[s] - t0[s]) for s in t1)


def ttft_growth(reps: list[dict]) -> tuple[float, float]:
    """Seconds the last and the median first token of a wave come later each turn: the median over every
    repetition's turn-to-turn steps."""
    last, mid = [], []
    for rep in reps:
        ttft = [[q["ttft_ms"] for q in t["recs"]] for t in rep["turns"]]
        last += [(max(b) - max(a)) / 1000 for a, b in zip(ttft, ttft[1:])]
        mid += [(statistics.median(b) - statistics.median(a)) / 1000 for a, b in zip(ttft, ttft[1:])]
    return statistics.median(last), statistics.median(mid)


def logged_turns(run49: dict, name: str = "chat-np8-ck0") -> dict[tuple[int, int], tuple[int, ...]]:
    """Whole conversations in another run's log: {(turn 0, turn 1 tokens): every turn's tokens} for the
    first repetition of `name` (8 slots: its 33 prompt lines fit in the 120 the record keeps)."""
    (r,) = [x for x in run49["host49"] if x["name"] == name]
    by_turn = turns(r["log"], r["slots"])[:r["turns"]]
    assert all(len(t) == r["slots"] for t in by_turn)
    return {(by_turn[0][s], by_turn[1][s]): tuple(t[s] for t in by_turn) for s in by_turn[0]}


def pp512(bench: dict, build: str = "mmq") -> float:
    """llama-bench pp512 (median of 3) of `build` in an issue-27 style record."""
    (r,) = [x for x in bench["llama_bench"] if x["build"] == build and x["what"] == "pp27"]
    (row,) = [row for row in r["rows"] if row["n_prompt"] == 512 and row["n_gen"] == 0]
    return sorted(row["samples_ts"])[1]


def figures(run38: dict, run27: dict) -> dict:
    """Every figure: the H200's waves (turns 0 and 1), its llama-bench pp512, the ratios to the V100's
    field range, turn 3's tokens and the V100's time for them (seconds, at the range's ends)."""
    (r,) = [x for x in run38["host38"] if x["name"] == CONFIG]
    assert r["ckpt"] == 0 and r["slots"] == SLOTS
    by_turn = turns(r["log"])
    rep = r["reps"][0]["turns"]
    waves = [wave(rep[k]["recs"], list(by_turn[k].values())) for k in (0, 1)]
    bench = pp512(run27)
    lo, hi = V100_PP
    tokens3 = turn3_tokens(by_turn)
    return {"waves": waves, "turns": by_turn, "ttft_growth_s": ttft_growth(r["reps"]),
            "wave_rate": (min(w["rate"] for w in waves), max(w["rate"] for w in waves)),
            "request_rate": statistics.median(w["request_rate"] for w in waves),
            "growth": (waves[1]["tokens"] - waves[0]["tokens"]) / SLOTS,
            "pp512": bench, "v100": V100_PP,
            "ratio_pp512": (bench / hi, bench / lo),
            "ratio_wave": (min(w["rate"] for w in waves) / hi, max(w["rate"] for w in waves) / lo),
            "turn3_tokens": tokens3, "v100_turn3_s": (tokens3 / hi, tokens3 / lo)}


def report(f: dict) -> str:
    a, b = f["wave_rate"]
    return "\n".join([
        f"H200, 16 chat prompts at once (proof38/run2 {CONFIG}, turns 0-1): {a:,.0f}-{b:,.0f} prompt tok/s a wave; "
        f"a request's tokens over its TTFT: {f['request_rate']:,.0f} (median)",
        f"each turn adds {f['growth']:.0f} tokens a conversation; the wave's last first token comes "
        f"{f['ttft_growth_s'][0]:.2f} s later a turn, its median {f['ttft_growth_s'][1]:.2f} s",
        f"H200 llama-bench pp512, FORCE_MMQ (proof27/run2): {f['pp512']:,.0f} tok/s",
        f"V100 (#25139): {f['v100'][0]}-{f['v100'][1]} tok/s: pp512 {f['ratio_pp512'][0]:.1f}-{f['ratio_pp512'][1]:.1f}x, "
        f"the wave {f['ratio_wave'][0]:.1f}-{f['ratio_wave'][1]:.1f}x",
        f"turn 3, 16 follow-ups without checkpoints: {f['turn3_tokens']:,} tokens, "
        f"{f['v100_turn3_s'][0]:.1f}-{f['v100_turn3_s'][1]:.1f} s on a V100"])


if __name__ == "__main__":
    print(report(figures(json.loads(RUN38.read_text()), json.loads(RUN27.read_text()))))
