"""Fail closed (issue 48 item 3): an error anywhere in the gateway's checks or its counting answers
503 gateway_error (never a request served unchecked or an answer passed on uncounted) and counts
voltafleet_gateway_errors_total{stage}. Faults injected into the project's own gateway (template
and Lua, this machine's HAProxy): an unreadable day file, a corrupt map value (through the runtime
API, as an operator's typo would land), malformed answers from an upstream that misbehaves on
purpose (a small HTTP server standing in for llama-server: the real one never sends them)."""
from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import httpx
import pytest

from tests.gateway_local import harness
from voltafleet.front import budgets, routes, teams

KEYS = {"web": "key-web", "capped": "key-capped"}
BUDGETS = {"capped": {"tokens_per_day": 100000}}
USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
LATE_S = 2.0


def answer(mode: str) -> tuple:
    """(content type, body) of the stand-in upstream's answer to a chat request in `mode` (its x-fake header), or
    (content type, body, seconds) for one whose last byte comes that many seconds after the rest."""
    chat = {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant",
                                                                                         "content": "hi"}}]}
    if mode == "ok":
        return "application/json", json.dumps({**chat, "usage": USAGE}, separators=(",", ":")).encode()
    if mode == "html":
        return "text/html", b"<html>an error page of some proxy</html>"
    if mode == "nofigures":
        return "application/json", json.dumps(chat, separators=(",", ":")).encode()
    if mode == "big-nofigures":  # larger than HAProxy's buffer: checked by the filter as it passes
        return "application/json", json.dumps({**chat, "pad": "x" * 100000}, separators=(",", ":")).encode()
    if mode in ("big-late-end", "big-nofigures-late-end"):  # its last byte LATE_S after the rest
        figures = {"usage": USAGE} if mode == "big-late-end" else {}
        return "application/json", json.dumps({**chat, **figures, "pad": "x" * 100000}, separators=(",", ":")).encode(), LATE_S
    raise ValueError(mode)


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    assert shutil.which("haproxy"), "haproxy is not installed (make setup installs it)"
    g = harness.Faked(tmp_path_factory.mktemp("failclosed"), KEYS, budgets=BUDGETS, answer=answer)
    try:
        yield g.start()
    finally:
        g.stop()


def chat(g, team: str, mode: str = "ok") -> httpx.Response:
    return httpx.post(g.gateway + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                      headers={"Authorization": f"Bearer {KEYS[team]}", "x-fake": mode}, timeout=30)


def errors(g) -> dict[str, int]:
    text = httpx.get(g.metrics, timeout=10).text
    return {s: int(v) for s, v in re.findall(r'^voltafleet_gateway_errors_total\{stage="(\w+)"\} (\d+)$', text, re.M)}


def refused(r: httpx.Response) -> bool:
    """The gateway's own fail-closed answer."""
    return r.status_code == 503 and r.json()["error"]["code"] == "gateway_error" and r.headers["Retry-After"] == "1"


def grew(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def test_every_stage_is_exported_at_zero_and_a_good_answer_is_served(gw):
    e = errors(gw)
    assert set(e) == set(routes.ERROR_STAGES) and not any(e.values()), e
    r = chat(gw, "capped")
    assert r.status_code == 200 and r.json()["usage"] == USAGE


@pytest.mark.parametrize("mode", ["html", "nofigures"])
def test_a_whole_answer_the_gateway_cannot_count_is_its_503(gw, mode):
    before = errors(gw)
    r = chat(gw, "web", mode)
    time.sleep(0.2)
    assert refused(r), (r.status_code, r.text)
    assert "could not check or count" in r.json()["error"]["message"]
    assert grew(before, errors(gw)) == {"count": 1}


def test_an_answer_too_large_to_wait_for_is_spoilt_at_its_end_when_it_has_no_figures(gw):
    before = errors(gw)
    r = chat(gw, "web", "big-nofigures")
    assert len(r.content) == len(answer("big-nofigures")[1])  # the whole length: the client is not left waiting
    with pytest.raises(json.JSONDecodeError):  # but no parser takes it: its last byte is spoilt
        r.json()
    time.sleep(0.2)
    assert grew(before, errors(gw)) == {"count": 1}


@pytest.mark.parametrize("mode", ["big-late-end", "big-nofigures-late-end"])
def test_the_filter_holds_back_only_the_answers_last_byte_and_only_once_it_has_come(gw, mode):
    """With a Content-Length the filter holds back no byte while the server still sends (a stream of HAProxy
    2.6.12 once spun at 100 % CPU holding one byte, 406,180 still to come): every byte but the last reaches the
    client while the upstream waits LATE_S before sending its last, which then goes whole with its figures, or
    spoilt and counted as the gateway's error without them."""
    before, body, tokens = errors(gw), answer(mode)[1], gw.team_counters("web")
    data, at = b"", {}
    with httpx.stream("POST", gw.gateway + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                      headers={"Authorization": f"Bearer {KEYS['web']}", "x-fake": mode}, timeout=30) as r:
        start = time.monotonic()
        for chunk in r.iter_raw():
            data += chunk
            at.setdefault(len(data) >= len(body) - 1, time.monotonic() - start)
    assert r.status_code == 200 and len(data) == len(body)
    done = time.monotonic() - start
    assert done - at[True] > LATE_S / 2, (at, done)  # all but the last byte came before the upstream's wait ended
    time.sleep(0.2)
    if mode == "big-late-end":
        assert json.loads(data)["usage"] == USAGE and grew(before, errors(gw)) == {}
        now = gw.team_counters("web")  # counted for the team: the answer's own figures
        assert [now[k] - tokens[k] for k in ("prompt_tokens_total", "completion_tokens_total")] == [5, 3]
    else:
        assert data[:-1] == body[:-1] and data[-1:] == b'"' and grew(before, errors(gw)) == {"count": 1}


def set_map(g, path: str, key: str, value: str) -> None:
    out = g.admin(f"set map {g.tmp / Path(path).name} {key} " + value.replace(" ", "\\ "))  # the CLI's escape
    assert out.strip() == "", out


def test_a_corrupt_budget_or_limit_refuses_that_teams_requests_and_others_are_served(gw):
    before = errors(gw)
    set_map(gw, teams.BUDGETS_MAP, "capped", "lots 0")
    try:
        assert refused(chat(gw, "capped"))
        assert chat(gw, "web").status_code == 200  # no budget entry: not affected
    finally:
        set_map(gw, teams.BUDGETS_MAP, "capped", "100000 0")
    assert chat(gw, "capped").status_code == 200
    set_map(gw, teams.LIMITS_MAP, "web", "many 100000")
    try:
        assert refused(chat(gw, "web"))
    finally:
        lim = teams.limits(teams.parse([{"name": t, "key_sha256": harness.sha(k)} for t, k in KEYS.items()]),
                           64, 100000, None)
        set_map(gw, teams.LIMITS_MAP, "web", "%d %d" % lim["web"])
    assert chat(gw, "web").status_code == 200
    time.sleep(0.2)
    assert grew(before, errors(gw)) == {"budget": 1, "limits": 1}


def test_an_unreadable_day_file_refuses_budgeted_teams_until_it_reads_again(gw):
    """The day's file a directory (what no worker can read or append to): a restarted worker cannot load
    the month, so a team with a budget is refused (budget_files) while a team without one is served (its
    count not written: record); once the file is back the task reads it and serves everyone."""
    day = gw.tmp / "budgets" / budgets.day_file(time.time())
    saved = day.read_bytes() if day.exists() else b""
    day.unlink(missing_ok=True)
    day.mkdir()
    before = {}
    try:
        gw.restart(budgets=False)
        assert "voltafleet_gateway_budgets_ready 0" in httpx.get(gw.metrics, timeout=10).text
        assert refused(chat(gw, "capped"))
        assert chat(gw, "web").status_code == 200
        time.sleep(0.2)
        e = errors(gw)
        assert e["budget_files"] >= 1 and e["record"] >= 1, e
        before = e
    finally:
        day.rmdir()
        day.write_bytes(saved)
    gw.wait_budgets()
    assert chat(gw, "capped").status_code == 200
    time.sleep(0.2)
    assert not {k for k in grew(before, errors(gw)) if k not in ("budget_files",)}
