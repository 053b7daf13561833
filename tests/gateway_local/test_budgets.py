"""Token budgets per team (issue 39 item 3) through the project's own gateway on this machine:
a team over its budget gets the 429 that names it (insufficient_quota, Retry-After to the UTC
reset); a request already running when the budget runs out finishes and is counted; the counts
survive a reload (a new worker while the old one finishes a stream: both workers' tokens
counted) and a restart; a starting worker reads the month's days and compacts the old ones.
Skipped where haproxy or the pinned llama-server is not on this machine."""
from __future__ import annotations

import calendar
import concurrent.futures
import re
import time

import httpx
import openai
import pytest

from tests.gateway_local import harness
from voltafleet.front import budgets

KEYS = {"web": "key-web", "tiny": "key-tiny", "pair": "key-pair"}
BUDGETS = {"tiny": {"tokens_per_day": 60}, "pair": {"tokens_per_day": 50, "tokens_per_month": 10 ** 9},
           "web": {"tokens_per_month": 10 ** 9}}


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    harness.require()
    g = harness.Local(tmp_path_factory.mktemp("budgets"), KEYS, budgets=BUDGETS)
    try:
        yield g.start()
    finally:
        g.stop()


def native(g, team: str, n: int, stream: bool = False) -> httpx.Response:
    """A native /completion of exactly n tokens (the prompt's own are counted too)."""
    body = {"prompt": "Once upon a time", "n_predict": n, "ignore_eos": True, "stream": stream}
    return httpx.post(g.gateway + "/completion", json=body, headers={"Authorization": f"Bearer {KEYS[team]}"}, timeout=300)


def prompt_tokens(g) -> int:
    return httpx.post(g.direct + "/completion", json={"prompt": "Once upon a time", "n_predict": 1}).json()["tokens_evaluated"]


def budget(g) -> dict[tuple[str, str, str], int]:
    """{(metric, team, period): value} of /metrics/teams' budget lines."""
    text = httpx.get(g.metrics, timeout=10).text
    return {(m, t, p): int(v) for m, t, p, v in
            re.findall(r'^voltafleet_team_(budget_\w*tokens)\{team="(\w+)",period="(\w+)"\} (\d+)$', text, re.M)}


def test_a_team_over_its_daily_budget_gets_the_429_naming_it_and_others_are_served(gw):
    p = prompt_tokens(gw)
    assert [native(gw, "tiny", 40).status_code for _ in range(2)] == [200, 200]  # 40 + p < 60: the second starts
    time.sleep(0.3)
    used = 2 * (40 + p)
    b = budget(gw)
    assert b[("budget_tokens", "tiny", "day")] == 60 and ("budget_tokens", "tiny", "month") not in b
    assert b[("budget_used_tokens", "tiny", "day")] == b[("budget_used_tokens", "tiny", "month")] == used
    r = native(gw, "tiny", 5)
    now = time.time()
    want, retry = budgets.over_budget("tiny", "day", 60, used, now)
    assert r.status_code == 429 and r.json() == want, r.text
    assert abs(int(r.headers["Retry-After"]) - retry) <= 2 and 0 < retry <= 86400
    with pytest.raises(openai.RateLimitError) as e:  # what an SDK client sees
        openai.OpenAI(base_url=gw.gateway + "/v1", api_key=KEYS["tiny"], max_retries=0).completions.create(
            model=harness.ALIAS, prompt="hi", max_tokens=2)
    assert e.value.code == "insufficient_quota" and "daily budget of 60 tokens" in e.value.message
    assert native(gw, "web", 3).status_code == 200  # another team is served
    time.sleep(0.3)
    assert budget(gw)[("budget_used_tokens", "tiny", "day")] == used  # a refused request counts nothing


def test_requests_already_running_when_the_budget_runs_out_finish_and_are_counted(gw):
    p = prompt_tokens(gw)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both admitted at 0 of 50: each ends counted
        codes = [f.result().status_code for f in [pool.submit(native, gw, "pair", 40) for _ in range(2)]]
    assert codes == [200, 200]
    time.sleep(0.3)
    assert budget(gw)[("budget_used_tokens", "pair", "day")] == 2 * (40 + p) > 50
    r = native(gw, "pair", 5)
    assert r.status_code == 429 and "daily budget of 50 tokens" in r.json()["error"]["message"]


def test_the_counts_survive_a_reload_with_a_stream_in_the_old_worker_and_a_restart(gw):
    p = prompt_tokens(gw)
    before = budget(gw)[("budget_used_tokens", "web", "month")]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        stream = pool.submit(lambda: native(gw, "web", 3000, stream=True))
        time.sleep(1.0)  # the stream runs in the current worker
        old = gw.worker_pid()
        assert not stream.done()
        new = gw.reload()  # a new worker, a fresh Lua state; the old one finishes the stream
        assert new != old and not stream.done()
        mid = budget(gw)  # the new worker's first figures: from the file
        last = [line for line in stream.result().text.splitlines() if line.startswith("data: {")][-1]
    assert '"tokens_predicted":3000' in last and mid[("budget_used_tokens", "web", "month")] == before
    time.sleep(0.5)
    after = budget(gw)  # the old worker logged the stream: its line reached the new worker through the file
    assert after[("budget_used_tokens", "web", "month")] == before + 3000 + p
    assert after[("budget_used_tokens", "tiny", "day")] > 60 and native(gw, "tiny", 5).status_code == 429
    gw.restart()
    assert budget(gw) == after  # every team's figures, read back from the files by a fresh process
    r = native(gw, "tiny", 5)
    assert r.status_code == 429 and "daily budget of 60 tokens" in r.json()["error"]["message"]


def ready(g, seconds: float = 30) -> None:
    """Wait for the worker's task to have read the month's counts (voltafleet_gateway_budgets_ready 1)."""
    deadline = time.monotonic() + seconds
    while "voltafleet_gateway_budgets_ready 1" not in httpx.get(g.metrics, timeout=10).text:
        assert time.monotonic() < deadline, "the budgets were never loaded"
        time.sleep(0.1)


def test_a_starting_worker_reads_the_months_days_and_compacts_the_old_ones(gw):
    """On a frozen clock (faketime: HAProxy's UTC time is 2027-03-15 12:00, whatever today is), so the
    month always has a day older than yesterday: that day is compacted, yesterday kept, the previous
    month's files removed; the real month's files are another month's, left as they are."""
    folder = gw.tmp / "budgets"
    now = calendar.timegm((2027, 3, 15, 12, 0, 0))
    (folder / "2027-03-01.log").write_text("web 100 1\nweb 20\nother 5 7\n")  # compacted: a line a team
    (folder / budgets.day_file(now - 86400)).write_text("web 7 1\n")  # yesterday: kept as it is
    (folder / "2027-02-15.sum").write_text("web 999\n")  # the previous month: removed
    real = sorted(p.name for p in folder.iterdir() if not p.name.startswith("2027-"))
    try:
        gw.clock = "2027-03-15 12:00:00"
        gw.restart()
        ready(gw)
        b = budget(gw)
        assert b[("budget_used_tokens", "web", "month")] == 127 and b[("budget_used_tokens", "other", "month")] == 5
        assert b[("budget_used_tokens", "web", "day")] == 0
        assert budgets.sums((folder / "2027-03-01.sum").read_text()) == {"web": 120, "other": 5}
        assert not (folder / "2027-03-01.log").exists() and not (folder / "2027-02-15.sum").exists()
        assert (folder / budgets.day_file(now - 86400)).read_text() == "web 7 1\n"
        assert sorted(p.name for p in folder.iterdir() if not p.name.startswith("2027-")) == real
    finally:
        gw.clock = None
        gw.restart()
        ready(gw)
