"""Token budgets per team (issue 39 item 3): the UTC periods and their resets, the 429's body and
Retry-After, the budgets' map, the files' format, the validation of gateway_teams' budget fields
and the rendered gateway (voltafleet/front/budgets.py, voltafleet/front/teams.py, templates/haproxy.cfg.j2)."""
import calendar
import hashlib
import re
from pathlib import Path

import pytest

from voltafleet.front import budgets, teams

A, B = (hashlib.sha256(k.encode()).hexdigest() for k in ("key-a", "key-b"))
LUA = (Path(__file__).resolve().parents[2] / "roles/gateway/files/voltafleet-teams.lua").read_text()


def at(*ymdhms) -> int:
    return calendar.timegm(ymdhms)


@pytest.mark.parametrize("now, period, starts, resets", [
    (at(2026, 1, 15, 13, 5, 9), "day", at(2026, 1, 15, 0, 0, 0), at(2026, 1, 16, 0, 0, 0)),
    (at(2026, 1, 15, 23, 59, 59), "day", at(2026, 1, 15, 0, 0, 0), at(2026, 1, 16, 0, 0, 0)),
    (at(2026, 1, 16, 0, 0, 0), "day", at(2026, 1, 16, 0, 0, 0), at(2026, 1, 17, 0, 0, 0)),
    (at(2026, 1, 31, 23, 0, 0), "month", at(2026, 1, 1, 0, 0, 0), at(2026, 2, 1, 0, 0, 0)),
    (at(2026, 12, 31, 12, 0, 0), "month", at(2026, 12, 1, 0, 0, 0), at(2027, 1, 1, 0, 0, 0)),
    (at(2028, 2, 29, 12, 0, 0), "day", at(2028, 2, 29, 0, 0, 0), at(2028, 3, 1, 0, 0, 0)),
])
def test_periods_are_utc_calendar_days_and_months(now, period, starts, resets):
    assert budgets.start(now, period) == starts and budgets.reset(now, period) == resets


def test_the_429_names_the_budget_what_was_used_and_the_reset_in_utc():
    body, retry = budgets.over_budget("web", "day", 1000, 1042, at(2026, 1, 15, 23, 0, 0))
    err = body["error"]
    assert err["type"] == err["code"] == "insufficient_quota" and err["param"] is None
    assert err["message"] == ("Your team web has used 1042 of its daily budget of 1000 tokens (prompt + completion, "
                              "UTC day): it resets at 2026-01-16T00:00:00Z")
    assert retry == 3600
    body, retry = budgets.over_budget("web", "month", 10, 10, at(2026, 12, 31, 23, 59, 59))
    assert "monthly budget of 10 tokens" in body["error"]["message"] and "2027-01-01T00:00:00Z" in body["error"]["message"]
    assert retry == 1


def test_the_month_is_named_first_its_reset_is_the_later_one():
    assert budgets.exceeded({"day": 100, "month": 1000}, {"day": 100, "month": 1000}) == "month"
    assert budgets.exceeded({"day": 100, "month": 1000}, {"day": 100, "month": 500}) == "day"
    assert budgets.exceeded({"day": 100, "month": 1000}, {"day": 99, "month": 999}) is None
    assert budgets.exceeded({"day": 0, "month": 0}, {"day": 10 ** 9, "month": 10 ** 9}) is None  # 0: no budget


def test_the_gateways_lua_builds_the_same_429_text():
    """The Lua file's format string is the Python message's, field for field."""
    fmt = re.search(r"'\{\"error\":\{\"message\":\"(Your team [^']+?)'\s*\.\.\s*'([^']+)'", LUA)
    lua_message = (fmt.group(1) + fmt.group(2)).split('","type"')[0]
    lua_message = lua_message % ("web", 1042, "daily", 1000, "day", "2026-01-16T00:00:00Z")
    body, _ = budgets.over_budget("web", "day", 1000, 1042, at(2026, 1, 15, 23, 0, 0))
    assert lua_message == body["error"]["message"]
    assert '"type":"insufficient_quota","param":null,"code":"insufficient_quota"' in LUA


def test_the_files_lines_are_summed_a_half_written_last_line_waits():
    assert budgets.sums("web 10\nbatch 5\nweb 7\nbat") == {"web": 17, "batch": 5}
    assert budgets.sums("web x\n\nweb 3\n") == {"web": 3}
    assert budgets.sums("web 10 4242\nbatch 5 77\nweb 7\nweb 1 2 3\n") == {"web": 17, "batch": 5}  # a worker's pid after
    assert budgets.day_file(at(2026, 3, 1, 0, 0, 1)) == "2026-03-01.log"


def test_the_budgets_map_holds_only_teams_with_a_budget():
    t = teams.parse([{"name": "web", "key_sha256": A, "tokens_per_day": 1000},
                     {"name": "batch", "key_sha256": B, "tokens_per_month": 5_000_000, "tokens_per_day": None},
                     {"name": "free", "key_sha256": "c" * 64}])
    assert teams.budgets_map(t) == "batch 0 5000000\nweb 1000 0\n"
    assert t[0].tokens_per_day == 1000 and t[0].tokens_per_month is None


@pytest.mark.parametrize("field, value", [("tokens_per_day", 0), ("tokens_per_month", -5), ("tokens_per_day", 1.5),
                                          ("tokens_per_day", True), ("tokens_per_month", "1M"),
                                          ("tokens_per_day", 10 ** 13)])
def test_a_bad_budget_is_refused_naming_the_file_the_key_and_the_fix(cfg, field, value):
    from voltafleet.inputs.config import ConfigError, validate_values

    with pytest.raises(ConfigError) as e:
        validate_values("gw1", {**cfg.flat(), "model_sha256": "a" * 64,
                                "gateway_teams": [{"name": "web", "key_sha256": A, field: value}]},
                        {"gateway_teams": "group_vars/gateway.yml"})
    text = str(e.value)
    assert "group_vars/gateway.yml: gateway_teams:" in text and f"(web) has {field}: {value!r}" in text
    assert "prompt + completion" in text and "leave it out (null) for no budget" in text


def test_the_gateway_refuses_an_over_budget_team_from_the_map_with_the_luas_answer(cfg):
    from tests.unit.test_gateway import render

    text = render({"gateway_teams": [{"name": "web", "key_sha256": A, "tokens_per_day": 10}]})
    front = text[text.index("frontend llama"):text.index("backend llama")]
    assert f"setenv VOLTAFLEET_BUDGET_DIR {budgets.DIR}" in text and f"setenv VOLTAFLEET_BUDGETS_MAP {teams.BUDGETS_MAP}" in text
    assert text.index("setenv VOLTAFLEET_BUDGET_DIR") < text.index("lua-load")
    assert f"set-var(txn.budget_day) var(txn.team),map({teams.BUDGETS_MAP}),field(1,' ')" in front
    assert f"set-var(txn.budget_month) var(txn.team),map({teams.BUDGETS_MAP}),field(2,' ')" in front
    rules = front.splitlines()
    check = next(i for i, r in enumerate(rules) if "http-request lua.vf_budget" in r)
    answer = next(i for i, r in enumerate(rules) if "hdr Retry-After %[var(txn.vf_budget_retry)]" in r)
    forward = next(i for i, r in enumerate(rules) if "Authorization" in r and "http-request" in r)
    assert front.index("over_rate") < front.index("lua.vf_budget") and check < answer < forward
    assert "status 429" in rules[answer] and 'lf-string "%[var(txn.vf_budget_body)]"' in rules[answer]
    assert 'core.register_action("vf_budget", {"http-req"}' in LUA and 'os.getenv("VOLTAFLEET_BUDGET_DIR")' in LUA
