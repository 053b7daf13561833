"""How long a traffic schedule holds the GPU machine (issue 51): a step simulation of one llama-server,
for planning device time, not a measurement. Pure, stdlib only.

    .venv/bin/python -m bench.traffic.estimate [--per-slot 2] [--ckpt 4] [--cache-mib 0] [--turn-s 6]

`replay_seconds(schedule, server)` plays the schedule (bench/traffic/model.py) as the driver sends it: an
opening at its arrival, each follow-up a think time after the previous answer ended; the server has
`slots` slots and a FIFO queue. Each step decodes a token on every slot that is decoding and processes
up to n_batch (2,048) prompt tokens of the slots still prefilling; it lasts

    step = decode_ms(slots decoding) + prompt tokens / prefill_tps (+ the checkpoint and cache copies made)

with the rates of the H200 records (FORCE_MMQ / Volta-rule builds, the shape-exact Qwen3.6-27B Q4_K_S):
    prefill_tps   2,250  16 chat prompts at once (bench/records/proof38/run2, bench/gpu/prefill51.py: 2.2-2.3K)
    decode_ms     12.4 ms a step at 1 stream, 51.3 at 16 (1/80.8 and 1/19.5 tok/s: bench/records/proof32/run1,
                  thinking budget 256 and 1,024: a budget turns backend sampling off), linear in between
    checkpoint_s  0.1 s a checkpoint, 2 a prompt (proof38 run2: 16 openings at once 6.4 s TTFT with
                  checkpoints, 3.4 without: 3 s for 32 checkpoints)
    cache_save_s  0.2 s a slot saved to the host prompt cache (issue 19: 16 idle slots saved before one
                  request, TTFT 3,379 ms vs 231), the same to load one
What a slot reuses (the pinned server-context.cpp get_available_slot, server-task.cpp prompt cache):
a follow-up takes its own idle slot (LCP similarity > 0.1) and, at --ctx-checkpoints > 0, resumes where its
last answer began (0.88 of the prompt in proof38); at 0 it reprocesses the whole history (a hybrid model
cannot roll back). Else it takes the least recently used idle slot; with --cache-ram, every idle slot whose
content changed is saved first (cache_idle_slots), an entry being the slot's KV (34,816 bytes a token at
q8_0), its recurrent state and its checkpoints (149.6 MiB each), the oldest dropped past the limit, and a
conversation found there is loaded as if its slot had kept it.
"""
from __future__ import annotations

import argparse
import heapq
import json
from collections import OrderedDict
from dataclasses import dataclass

from bench.traffic.model import TEMPLATE_TOKENS, Params, Schedule, schedule

MIB = 1 << 20
N_BATCH = 2048


@dataclass(frozen=True)
class Rates:
    prefill_tps: float = 2250.0
    step_1_ms: float = 12.4
    step_16_ms: float = 51.3
    checkpoint_s: float = 0.1
    cache_save_s: float = 0.2
    kv_bytes_per_token: int = 34816
    state_bytes: int = round(149.627 * MIB)

    def decode_ms(self, n: int) -> float:
        return 0.0 if n <= 0 else self.step_1_ms + (self.step_16_ms - self.step_1_ms) * (n - 1) / 15


@dataclass(frozen=True)
class Server:
    slots: int = 16
    ckpt: int = 4            # --ctx-checkpoints
    cache_mib: int = 0       # --cache-ram


def prompts(s: Schedule) -> dict:
    """{(conversation, turn): (prompt tokens, tokens a resumed follow-up reprocesses)} as the driver sends them."""
    out = {}
    for c in s.conversations:
        used = s.params.system_tokens + (TEMPLATE_TOKENS if s.params.system_tokens else 0)
        for t in c.turns:
            prompt = used + t.user_tokens + TEMPLATE_TOKENS
            fresh = prompt if t.index == 0 else c.turns[t.index - 1].answer_tokens + t.user_tokens + 2 * TEMPLATE_TOKENS
            out[(c.id, t.index)] = (prompt, min(prompt, fresh))
            used += t.user_tokens + t.answer_tokens + 2 * TEMPLATE_TOKENS
    return out


def replay_seconds(s: Schedule, server: Server = Server(), rates: Rates = Rates()) -> dict:
    """The simulated replay: its wall seconds, mean turn seconds (due to last token, queue included) and
    mean hold (a slot's, start to last token: the model's turn_s), the follow-ups' cached share of prompt
    tokens and the slots' busy share."""
    ptab = prompts(s)
    convs = {c.id: c for c in s.conversations}
    due = [(c.arrival_s, c.id, 0) for c in s.conversations]
    heapq.heapify(due)
    queue: list = []                         # (sent, conv, turn) waiting for a slot, FIFO
    slot_conv = [None] * server.slots        # conversation whose state a slot holds
    slot_used = [0.0] * server.slots
    slot_job: list = [None] * server.slots   # [conv, turn, sent, prompt left, decode left]
    dirty = [False] * server.slots           # content changed since last saved to the cache
    cache: OrderedDict = OrderedDict()       # conversation -> entry bytes
    held = {}                                # conversation -> (tokens in its state, checkpoints)
    now, turn_times, holds, cached, prompt_total, busy = 0.0, [], [], 0, 0, 0.0

    def entry_bytes(cid):
        tokens, ck = held[cid]
        return tokens * rates.kv_bytes_per_token + rates.state_bytes * (1 + min(ck, server.ckpt))

    def save(i):
        nonlocal stall
        cid = slot_conv[i]
        if cid is None or not dirty[i] or not server.cache_mib:
            return
        dirty[i] = False
        size = entry_bytes(cid)
        if size > server.cache_mib * MIB:
            return
        cache.pop(cid, None)
        while cache and sum(cache.values()) + size > server.cache_mib * MIB:
            cache.popitem(last=False)
        cache[cid] = size
        stall += rates.cache_save_s

    while due or queue or any(slot_job):
        stall = 0.0
        while due and due[0][0] <= now:
            t, cid, k = heapq.heappop(due)
            queue.append((t, cid, k))
        while queue and None in slot_job:
            sent, cid, k = queue.pop(0)
            idle = [i for i in range(server.slots) if slot_job[i] is None]
            own = [i for i in idle if slot_conv[i] == cid]
            i = own[0] if own else min(idle, key=lambda j: slot_used[j])
            prompt, fresh = ptab[(cid, k)]
            resumed = bool(own) and k > 0
            if not own and server.cache_mib:
                for j in idle:
                    save(j)
                if cid in cache:
                    cache.move_to_end(cid)
                    stall += rates.cache_save_s
                    resumed = k > 0
            process = fresh if resumed and server.ckpt > 0 else prompt
            cached += (prompt - process) if k > 0 else 0
            prompt_total += prompt if k > 0 else 0
            slot_conv[i], dirty[i] = cid, True
            turn = convs[cid].turns[k]
            slot_job[i] = [cid, k, sent, process, turn.max_tokens, now]
            stall += (2 * rates.checkpoint_s) if server.ckpt > 0 else 0.0
        if not any(slot_job):
            now = max(now, due[0][0]) if due else now
            continue
        decoding = [i for i in range(server.slots) if slot_job[i] and slot_job[i][3] <= 0]
        budget, prompt_tokens = N_BATCH, 0
        for i in range(server.slots):
            job = slot_job[i]
            if job and job[3] > 0 and budget > 0:
                n = min(job[3], budget)
                job[3] -= n
                budget -= n
                prompt_tokens += n
        dt = rates.decode_ms(len(decoding)) / 1000 + prompt_tokens / rates.prefill_tps + stall
        now += dt
        busy += dt * sum(1 for j in slot_job if j)
        for i in decoding:
            job = slot_job[i]
            job[4] -= 1
            if job[4] <= 0:
                cid, k, sent = job[0], job[1], job[2]
                conv = convs[cid]
                prompt, _ = ptab[(cid, k)]
                held[cid] = (prompt + conv.turns[k].max_tokens, 2 * (k + 1))
                turn_times.append(now - sent)
                holds.append(now - job[5])
                slot_job[i], slot_used[i] = None, now
                if k + 1 < len(conv.turns):
                    heapq.heappush(due, (now + conv.turns[k + 1].think_s, cid, k + 1))
    return {"seconds": round(now, 1), "requests": len(turn_times),
            "mean_turn_s": round(sum(turn_times) / len(turn_times), 2) if turn_times else None,
            "mean_hold_s": round(sum(holds) / len(holds), 2) if holds else None,
            "followup_cached_share": round(cached / prompt_total, 3) if prompt_total else None,
            "busy_share": round(busy / (server.slots * now), 3) if now else None}


def config_seconds(p: Params, server: Server, runs: int = 3, load_s: float = 10.0, warmup_s: float = 5.0,
                   rates: Rates = Rates()) -> float:
    """A traffic config's device seconds: the server's start (load_s: proof49 run4 2.7-7.9 s, and the stop),
    a warm-up request, then `runs` replays of seeds seed, seed + 1, ... as the phase runs them."""
    from dataclasses import replace
    return load_s + warmup_s + sum(replay_seconds(schedule(replace(p, seed=p.seed + r)), server, rates)["seconds"]
                                   for r in range(runs))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-slot", type=float, default=1)
    ap.add_argument("--turn-s", type=float, default=6.0)
    ap.add_argument("--ckpt", type=int, default=4)
    ap.add_argument("--cache-mib", type=int, default=0)
    ap.add_argument("--seed", type=int, default=51)
    a = ap.parse_args(argv)
    p = Params(seed=a.seed, per_slot=a.per_slot, turn_s=a.turn_s)
    print(json.dumps(replay_seconds(schedule(p), Server(16, a.ckpt, a.cache_mib)), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
