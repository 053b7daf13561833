"""The tune's workload recorded from the fleet's own logs (issue 29): what a group's traffic
looks like, read from the last hours of the gateway's log (how many requests each instance
serves at once) and the canary's llama-server journals (each request's prompt, the part of it
already in the slot's cache, and its answer). Pure: the lines come from roles/profile.

    >>> reqs = requests([
    ...     "1.0 h llama-server[7]: 0.01.0 I slot operator(): id  0 | task 3 | new prompt, n_ctx_slot = 1024, n_keep = 0, task.n_tokens = 40",
    ...     "1.0 h llama-server[7]: 0.01.0 I slot operator(): id  0 | task 3 | cached n_tokens = 30, memory_seq_rm [30, end)",
    ...     "1.2 h llama-server[7]: 0.01.2 I slot print_timing: id  0 | task 3 |        eval time =  99.0 ms /    16 tokens"])
    >>> reqs
    [Request(prompt=40, cached=30, answer=16)]
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from voltafleet.front.gateway import is_backend_of
from voltafleet.measure.smoke import percentile  # nearest rank: a value that was measured

MIN_REQUESTS = 20           # fewer finished requests in the window: no profile (the shipped tune_* stay)
FOLLOWUP_CACHED = 0.5       # a request whose prompt was at least this share in its slot's cache continues a conversation
CLIENTS_PERCENTILE = 90     # the instance's requests in flight the workload drives: this percentile of the gateway's

_PID = re.compile(r"llama-server\[(\d+)\]:")
_NEW = re.compile(r"\| task (\d+) \| new prompt,.*task\.n_tokens = (\d+)")
_CACHED = re.compile(r"\| task (\d+) \| cached n_tokens = (\d+)")
_EVAL = re.compile(r"\| task (\d+) \|\s+eval time =\s+[\d.]+ ms /\s+(\d+) tokens")
# the gateway's log-format (templates/haproxy.cfg.j2): ... %b/%s %TR/%Tw/%Tc/%Tr/%Ta %ST %B %CC %CS %tsc %ac/%fc/%bc/%sc/%rc
_HAPROXY = re.compile(r" \S+/(\S+) -?\d+/-?\d+/-?\d+/-?\d+/-?\d+ (\d{3}) \d+ \S+ \S+ \S{4} \d+/\d+/\d+/(\d+)/\+?\d+ ")  # %rc: +N after a redispatch


class ProfileError(ValueError):
    pass


@dataclass(frozen=True)
class Request:
    prompt: int   # the prompt's tokens (task.n_tokens)
    cached: int   # of them, already in the slot's cache when the request started
    answer: int   # tokens generated


def requests(lines: list[str]) -> list[Request]:
    """Finished requests in llama-server journal lines (`journalctl -o short-unix`, any number
    of instances and restarts: a task is its server process's pid and task id)."""
    new: dict[tuple, int] = {}
    cached: dict[tuple, int] = {}
    out = []
    for line in lines:
        pid = _PID.search(line)
        if not pid:
            continue
        if m := _NEW.search(line):
            key = (pid.group(1), m.group(1))
            new[key] = int(m.group(2))
            cached.pop(key, None)
        elif m := _CACHED.search(line):
            cached.setdefault((pid.group(1), m.group(1)), int(m.group(2)))  # the first: before the prompt's own steps
        elif (m := _EVAL.search(line)) and (pid.group(1), m.group(1)) in new:
            key = (pid.group(1), m.group(1))
            out.append(Request(new.pop(key), cached.pop(key, 0), int(m.group(2))))
    return out


def in_flight(lines: list[str], host: str) -> list[int]:
    """The requests in flight on an instance of `host` (its HAProxy servers, gateway.backend_name)
    as each answered request of theirs ended: itself and the others the gateway's log counts (%sc
    of the log-format, logged once the request has left the server). Each gateway counts its own
    requests: with one gateway active at a time (the others standby) that is the instance's."""
    out = []
    for line in lines:
        m = _HAPROXY.search(line)
        if m and is_backend_of(m.group(1), host) and m.group(2) != "503":
            out.append(int(m.group(3)) + 1)
    return out


def gateway_fields(line: str) -> str | None:
    """The part of a gateway log line in_flight reads (server, timers, status, bytes, connection
    counts), without the client's address, the request line or the team: what is kept on the controller."""
    m = _HAPROXY.search(line)
    return m.group(0) if m else None


def workload(reqs: list[Request], flight: list[int], hours: float) -> tuple[dict, dict]:
    """The tune_* values the group's traffic stands for, and what they were read from.
    ProfileError when the window holds too little to stand for anything."""
    if len(reqs) < MIN_REQUESTS:
        raise ProfileError(f"the canary's servers finished {len(reqs)} request(s) in the last {hours:g} h "
                           f"(fewer than {MIN_REQUESTS}): no profile. Fix: a longer window (--profile-hours), "
                           "a canary that served traffic, or tune_profile_hours: 0 for the tune_* of group_vars")
    follow = [r.cached >= FOLLOWUP_CACHED * r.prompt for r in reqs]
    # a new conversation's prompt (a follow-up's carries its conversation: the workload adds that itself)
    fresh = [r.prompt for r, f in zip(reqs, follow) if not f] or [r.prompt - r.cached for r in reqs]
    values = {"tune_prompt_tokens": max(1, round(statistics.median(fresh))),
              "tune_answer_tokens": max(1, round(statistics.median(r.answer for r in reqs))),
              "tune_followup_share": round(sum(follow) / len(reqs), 2),
              "tune_clients": max(1, percentile(flight, CLIENTS_PERCENTILE)) if flight else None}
    if values["tune_clients"] is None:
        raise ProfileError(f"the gateway logged no answered request of the canary's instances in the last {hours:g} h: "
                           "no profile. Fix: tune a canary that serves behind the gateway, or tune_profile_hours: 0")
    source = {"source": f"the fleet's logs, last {hours:g} h", "requests": len(reqs), "gateway_lines": len(flight),
              "prompt_tokens_p90": percentile([r.prompt for r in reqs], 90),
              "answer_tokens_p90": percentile([r.answer for r in reqs], 90),
              "in_flight_max": max(flight)}
    return values, source
