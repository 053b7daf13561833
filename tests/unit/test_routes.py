"""The gateway's route table (voltafleet/front/routes.py, issue 48 item 1): the parser of llama-server's
route registrations, the allow-list HAProxy gets, its place in the rendered configuration (with and
without team keys), and docs/gateway.md's table equal to the code's."""
from __future__ import annotations

import json
import re
from pathlib import Path

from tests.unit.test_gateway import render
from voltafleet.front import routes

SOURCE = '''
    ctx_http.get ("/health",                   ex_wrapper(routes.get_health));
    ctx_http.post("/v1/messages",              ex_wrapper(routes.post_anthropic_messages));
    ctx_http.del ("/v1/stream",                ex_wrapper(stream_delete_h));
    ctx_http.post("/slots/:id_slot",           ex_wrapper(routes.post_slots));
    ctx_http.post("/v1/brand-new",             ex_wrapper(routes.post_new));
'''
HTTP = '''
        path_predict = getenv("AIP_PREDICT_ROUTE", "/predict", true);
            srv->Get(params.api_prefix + "/",           serve_asset_cached("index.html", true, cache_revalidate));
        srv->Get(params.api_prefix + "/sw.js", [](const httplib::Request &, httplib::Response & res) {
                    srv->Get(params.api_prefix + "/" + a.name, serve_asset_nocache(a.name));
'''


def test_the_parser_finds_every_kind_of_registration_and_names_the_unclassified():
    found = routes.source_routes(SOURCE, HTTP)
    assert found == {("GET", "/health"), ("POST", "/v1/messages"), ("DELETE", "/v1/stream"), ("POST", "/slots/:id_slot"),
                     ("POST", "/v1/brand-new"), ("POST", "/predict"), ("GET", "/"), ("GET", "/sw.js")}
    assert routes.unclassified(found) == ["POST /v1/brand-new"]


def test_only_the_fleets_api_is_allowed_and_nothing_internal():
    allowed = routes.allowed()
    assert allowed == sorted(f"{m}:{p}" for (m, p), r in routes.ROUTES.items() if r.who == routes.TEAM)
    assert {"POST:/v1/chat/completions", "POST:/v1/completions", "POST:/v1/messages", "GET:/v1/models"} <= set(allowed)
    for internal in ("/props", "/metrics", "/slots", "/tokenize", "/detokenize", "/apply-template", "/lora-adapters",
                     "/v1/stream", "/infill", "/v1/embeddings", "/v1/responses", "/cors-proxy", "/predict"):
        assert not any(a.endswith(":" + internal) for a in allowed), internal
    # a team route is counted (a note how), every other one says why not
    assert all(r.counted if r.who == routes.TEAM else (r.why and not r.counted) for r in routes.ROUTES.values())
    assert all(r.who in (routes.TEAM, routes.OPERATOR, routes.NOBODY) for r in routes.ROUTES.values())


def frontend(text: str) -> list[str]:
    return text[text.index("frontend llama"):text.index("\nbackend llama")].splitlines()


def test_the_allow_list_refuses_every_other_route_before_any_backend_with_or_without_teams():
    for text in (render(), render({"gateway_teams": [{"name": "web", "key_sha256": "a" * 64}]})):
        rules = frontend(text)
        refuse = next(i for i, r in enumerate(rules) if "return status 404" in r and "route" not in r.split("string")[0] and
                      "route_not_found" in r)
        rule = rules[refuse]
        assert rule.endswith("unless { var(txn.route) -m str " + " ".join(routes.allowed()) + " }"), rule
        err = json.loads(re.search(r"string '([^']+)'", rule).group(1))["error"]
        assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", "route_not_found", None)
        assert "http-request set-var(txn.route) method,concat(:,txn.path)" in rules[refuse - 1]
        assert any(r.strip() == "http-request del-header x-conversation-id" for r in rules)
        # before any rule that could send the request on (the backends are chosen after every http-request rule)
        assert not any("use_backend" in r or "lua.vf_budget" in r for r in rules[:refuse])
        if "401" in text:
            assert any("return status 401" in r for r in rules[:refuse])  # a keyless request: its 401 first


def test_every_stage_of_the_gateway_refuses_when_it_did_not_say_it_passed():
    text = render({"gateway_teams": [{"name": "web", "key_sha256": "a" * 64}]})
    rules = [r.strip() for r in frontend(text)]
    marks = [r for r in rules if r.startswith("http-request set-var(txn.vf_error)")]
    assert any("str(limits) unless { var(txn.limit_concurrent) -m reg ^[0-9]+$ }" in r for r in marks)
    assert any("str(budget) unless { var(txn.vf_budget_ok) -m found }" in r for r in marks)
    assert any("str(rewrite) unless { var(txn.vf_kind) -m found }" in r for r in marks)
    # each mark is followed by the 503 that refuses it
    for i, r in enumerate(rules):
        if r in marks:
            assert rules[i + 1].startswith("http-request return status 503") and "gateway_error" in rules[i + 1]
    assert rules.count("http-request lua.vf_budget") == 1  # every team's request is checked, with a budget or not
    assert any(r.startswith("http-response return status 503") and "var(txn.vf_error)" in r for r in rules)
    lua = (Path(__file__).resolve().parents[2] / "roles/gateway/files/voltafleet-teams.lua").read_text()
    stages = set(re.search(r"local errors = \{([^}]*)\}", lua).group(1).replace("=", " ").replace(",", " ").split()) - {"0"}
    assert stages == set(routes.ERROR_STAGES)


def test_docs_gateway_shows_the_table_of_the_code():
    page = (Path(__file__).resolve().parents[2] / "docs/gateway.md").read_text()
    assert routes.table_markdown() in page
