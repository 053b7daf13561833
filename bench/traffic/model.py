"""A busy fleet's chat traffic as data (issue 51): pure, stdlib only, no network.

    .venv/bin/python -m bench.traffic.model [--per-slot 1|2|4] [--slots 16] [--turn-s 6] [--seed 51] [--json]

One seed gives one schedule, exactly (conversation ids, arrival times, think times, every turn's
text and lengths): `schedule(Params(...))`. What it models (bench/traffic/README.md):

- Conversations arrive as a Poisson process of rate `rate` (exponential gaps). Each has `turns`
  turns: 2 + Poisson(turns_extra), at most max_turns. Between a turn's answer and the next question
  the user thinks an exponential time of mean `think_s`.
- Every turn is a user message of `user_tokens` words (the opening from `opening`, the others from
  `followup`: lognormals of stated median and sigma, clipped), answered with `thinking_tokens` of
  thought (the request's thinking budget) then `answer_tokens` of answer (max_tokens is their sum).
  A conversation ends early rather than outgrow a slot's context (`ctx_per_slot`).
- The rate keeps the server `busy` (80 %) busy. Offered load, the share of the slots held:
      busy = rate x (mean turns x turn_s) / slots    so    rate = busy x slots / (mean turns x turn_s)
  with turn_s the mean time one turn holds a slot (measured: driver.calibrate, or given).
- Conversations per server: the population, the conversations open at once (Little's law: the
  arrival rate times a conversation's lifetime, mean turns x turn_s + (mean turns - 1) x think_s), is
  per_slot x slots (16, 32, 64 on v100_32gb's 16 slots); the think time is what makes it so:
      think_s = (per_slot / busy - 1) x mean turns x turn_s / (mean turns - 1)
  A run holds `conversations` of them in all (default: twice the population).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
from dataclasses import asdict, dataclass, field, replace

from voltafleet.hostside.workload import WORDS

TEMPLATE_TOKENS = 8  # the chat template's tokens around each message (<|im_start|>role\n ... <|im_end|>\n) and margin


@dataclass(frozen=True)
class Lognormal:
    """Token counts: round(exp(N(ln median, sigma))), clipped to [lo, hi] (the median stays the median
    when lo <= median <= hi)."""
    median: float
    sigma: float
    lo: int
    hi: int

    def draw(self, rng: random.Random) -> int:
        return max(self.lo, min(self.hi, round(rng.lognormvariate(math.log(self.median), self.sigma))))


@dataclass(frozen=True)
class Params:
    seed: int = 51
    slots: int = 16                 # the server's slots (v100_32gb: 16)
    per_slot: float = 1             # conversations open at once per slot: 1, 2, 4
    busy: float = 0.8               # offered load: the share of slot time the arrivals ask for
    turn_s: float = 6.0             # mean seconds one turn holds a slot (measure it: driver.calibrate)
    conversations: int | None = None  # in the run; None: 2 x the population
    turns_extra: float = 2.0        # turns = 2 + Poisson(turns_extra), at most max_turns (mean ~3.9)
    max_turns: int = 8
    opening: Lognormal = field(default_factory=lambda: Lognormal(800, 0.5, 64, 3000))     # first question
    followup: Lognormal = field(default_factory=lambda: Lognormal(120, 0.8, 8, 1000))     # later questions
    thinking: Lognormal = field(default_factory=lambda: Lognormal(256, 0.6, 16, 1024))    # thought (budget)
    answer: Lognormal = field(default_factory=lambda: Lognormal(160, 0.6, 16, 768))       # answer after it
    system_tokens: int = 0          # a system prompt every conversation shares (0: none)
    ctx_per_slot: int = 8192        # v100_32gb: 131072 / 16

    @property
    def population(self) -> float:
        """Conversations open at once, on average: per_slot x slots."""
        return self.per_slot * self.slots

    @property
    def total(self) -> int:
        return self.conversations if self.conversations is not None else round(2 * self.population)


def mean_turns(p: Params) -> float:
    """E[turns] of 2 + Poisson(turns_extra) capped at max_turns (exact)."""
    lam, cap = p.turns_extra, p.max_turns - 2
    pmf = [math.exp(-lam) * lam ** k / math.factorial(k) for k in range(cap)]
    return 2 + sum(k * q for k, q in enumerate(pmf)) + cap * (1 - sum(pmf))


def arrival_rate(busy: float, slots: int, turns: float, turn_s: float) -> float:
    """Conversations a second that keep `slots` slots `busy` busy: busy x slots / (turns x turn_s)."""
    return busy * slots / (turns * turn_s)


def offered_load(rate: float, turns: float, turn_s: float, slots: int) -> float:
    """The share of slot time asked for: arrival rate x mean service time per conversation / slots."""
    return rate * turns * turn_s / slots


def think_time(per_slot: float, busy: float, turns: float, turn_s: float) -> float:
    """The mean think time that makes per_slot x slots conversations open at once (Little's law)."""
    if per_slot < busy:
        raise ValueError(f"per_slot {per_slot} < busy {busy}: fewer conversations than busy slots")
    return (per_slot / busy - 1) * turns * turn_s / (turns - 1)


def words(n: int, rng: random.Random) -> str:
    """n words of the workload client's list (voltafleet.hostside.workload.WORDS: a word is about one
    token), drawn at random, so that two conversations share no more than a word or two of prefix."""
    return " ".join(rng.choices(WORDS, k=max(1, n)))


def _poisson(rng: random.Random, lam: float) -> int:
    k, t, limit = 0, rng.random(), math.exp(-lam)
    while t > limit:
        k += 1
        t *= rng.random()
    return k


@dataclass(frozen=True)
class Turn:
    index: int
    think_s: float        # the user's pause after the previous answer (0 for the opening)
    user_tokens: int
    text: str
    thinking_tokens: int  # the request's thinking budget
    answer_tokens: int    # the answer after the thought; max_tokens = thinking_tokens + answer_tokens

    @property
    def max_tokens(self) -> int:
        return self.thinking_tokens + self.answer_tokens


@dataclass(frozen=True)
class Conversation:
    id: str
    arrival_s: float      # the opening's send time, seconds from the run's start
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Schedule:
    params: Params
    rate: float           # conversations a second
    think_s: float        # mean think time
    system: str           # the shared system prompt ("" for none)
    conversations: tuple[Conversation, ...]

    def events(self) -> list[dict]:
        """Every request of the run in order of conversation and turn: the opening at its arrival time,
        each follow-up `after_s` seconds after the previous answer ended."""
        return [{"conversation": c.id, "turn": t.index, **({"at_s": c.arrival_s} if t.index == 0 else
                                                          {"after_s": t.think_s}),
                 "user_tokens": t.user_tokens, "thinking_tokens": t.thinking_tokens,
                 "answer_tokens": t.answer_tokens, "text": t.text}
                for c in self.conversations for t in c.turns]

    def to_json(self) -> dict:
        return {"params": asdict(self.params), "rate": self.rate, "think_s": self.think_s, "system": self.system,
                "mean_turns": mean_turns(self.params), "conversations": [asdict(c) for c in self.conversations]}

    def fingerprint(self) -> str:
        """sha256 of the schedule's JSON: two runs of one seed replay the same traffic when it matches."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()


def conversation(p: Params, index: int, arrival_s: float, think_s: float, system_tokens: int) -> Conversation:
    """Conversation `index` of seed p.seed (its own random stream: it does not change with the run's size)."""
    rng = random.Random(f"{p.seed}:conversation:{index}")
    n = min(p.max_turns, 2 + _poisson(rng, p.turns_extra))
    turns, used = [], system_tokens + (TEMPLATE_TOKENS if system_tokens else 0)
    for k in range(n):
        user = (p.opening if k == 0 else p.followup).draw(rng)
        thinking, answer = p.thinking.draw(rng), p.answer.draw(rng)
        pause = 0.0 if k == 0 else rng.expovariate(1 / think_s) if think_s > 0 else 0.0
        text = words(user, rng)
        # this turn's prompt and its thought and answer must fit the slot; the history keeps the answer alone
        if used + user + thinking + answer + 2 * TEMPLATE_TOKENS > p.ctx_per_slot:
            break
        used += user + answer + 2 * TEMPLATE_TOKENS
        turns.append(Turn(k, round(pause, 6), user, text, thinking, answer))
    return Conversation(f"s{p.seed}-c{index:04d}", round(arrival_s, 6), tuple(turns))


def schedule(p: Params) -> Schedule:
    """The run's traffic from p (one seed, one schedule)."""
    turns = mean_turns(p)
    rate = arrival_rate(p.busy, p.slots, turns, p.turn_s)
    think_s = think_time(p.per_slot, p.busy, turns, p.turn_s)
    arrivals = random.Random(f"{p.seed}:arrivals")
    system = words(p.system_tokens, random.Random(f"{p.seed}:system")) if p.system_tokens else ""
    t, convs = 0.0, []
    for i in range(p.total):
        convs.append(conversation(p, i, t, think_s, p.system_tokens))
        t += arrivals.expovariate(rate)
    return Schedule(p, rate, think_s, system, tuple(convs))


def describe(s: Schedule) -> dict:
    """What a schedule holds: its rate, think time, population, and the drawn lengths' medians."""
    import statistics
    turns = [t for c in s.conversations for t in c.turns]
    opening = [t.user_tokens for t in turns if t.index == 0]
    follow = [t.user_tokens for t in turns if t.index > 0]
    return {"conversations": len(s.conversations), "requests": len(turns), "population": s.params.population,
            "rate_per_s": round(s.rate, 4), "think_s": round(s.think_s, 2), "mean_turns": round(mean_turns(s.params), 3),
            "drawn_mean_turns": round(len(turns) / len(s.conversations), 3),
            "arrivals_span_s": round(s.conversations[-1].arrival_s, 1),
            "median_opening": statistics.median(opening), "median_followup": statistics.median(follow or [0]),
            "median_thinking": statistics.median(t.thinking_tokens for t in turns),
            "median_answer": statistics.median(t.answer_tokens for t in turns), "fingerprint": s.fingerprint()[:16]}


def params_from(d: dict) -> Params:
    """Params from a plan's dict (lognormals as {median, sigma, lo, hi})."""
    d = dict(d)
    for k in ("opening", "followup", "thinking", "answer"):
        if isinstance(d.get(k), dict):
            d[k] = Lognormal(**d[k])
    return replace(Params(), **d)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=51)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--per-slot", type=float, default=1)
    ap.add_argument("--busy", type=float, default=0.8)
    ap.add_argument("--turn-s", type=float, default=6.0)
    ap.add_argument("--conversations", type=int)
    ap.add_argument("--json", action="store_true", help="the whole schedule, not its summary")
    a = ap.parse_args(argv)
    s = schedule(Params(seed=a.seed, slots=a.slots, per_slot=a.per_slot, busy=a.busy, turn_s=a.turn_s,
                        conversations=a.conversations))
    print(json.dumps(s.to_json() if a.json else describe(s), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
