"""Tiers (issue 41): a tier is a group of server hosts, one gateway backend a tier, each team
routed to its tier; bad input refused naming the file, the key and the fix before any host is
touched. tests/gateway_local/test_tiers.py proves the routing through a real HAProxy."""
import hashlib
import json
import re

import pytest
import yaml

from tests.fixture_vars import all_yml_settings, all_yml_vars
from voltafleet.state import fleetplan
from voltafleet.front import gateway, teams, tiers
from voltafleet.inputs.config import ConfigError, validate_values
from voltafleet.inputs.groupvars import build_inventory

A, B, C = (hashlib.sha256(k.encode()).hexdigest() for k in ("key-a", "key-b", "key-c"))
SHA = "a" * 64
TEAMS = [{"name": "web", "key_sha256": A},
         {"name": "ide", "key_sha256": B, "tier": "latency"},
         {"name": "chat", "key_sha256": C, "tiers": ["throughput", "latency"], "overflow": "refuse"}]


def test_a_tier_is_a_backend_named_after_it_and_throughput_keeps_the_fleets():
    assert [tiers.backend(t) for t in ("throughput", "latency", "h200-mtp")] == ["llama", "llama_latency", "llama_h200-mtp"]
    assert [tiers.tier_of_backend(b) for b in ("llama", "llama_latency", "vf_teams", "stats", "llama_")] == [
        "throughput", "latency", None, None, None]
    assert tiers.ordered({"latency", "batch"}) == ["throughput", "batch", "latency"]  # throughput: always, first


def test_each_team_has_a_tier_the_tiers_it_may_ask_for_and_an_overflow():
    t = teams.parse(TEAMS)
    assert [(x.tier, x.tiers, x.overflow) for x in t] == [
        ("throughput", (), None), ("latency", (), None), ("throughput", ("throughput", "latency"), "refuse")]
    assert tiers.tiers_map(t, "throughput") == (
        "chat throughput throughput,latency refuse\nchat/latency 1\nchat/throughput 1\n"
        "ide latency latency throughput\nide/latency 1\n"
        "web throughput throughput throughput\nweb/throughput 1\n")
    assert "ide latency latency refuse\n" in tiers.tiers_map(t, "refuse")  # the fleet default applies


@pytest.mark.parametrize("entry, says, fix", [
    ({"tier": "Latency"}, "has tier: 'Latency'", "lowercase letters"),
    ({"tier": "low_latency"}, "has tier: 'low_latency'", "lowercase letters"),
    ({"tiers": "latency"}, "has tiers: 'latency'", "give a list of tier names"),
    ({"tiers": []}, "has tiers: []", "give a list of tier names"),
    ({"tier": "latency", "tiers": ["throughput"]}, "its tiers ['throughput'] do not list it", "add latency to tiers"),
    ({"overflow": "queue"}, "has overflow: 'queue'", "use throughput"),
])
def test_a_bad_tier_of_a_team_is_refused_naming_the_file_the_key_and_the_fix(cfg, entry, says, fix):
    with pytest.raises(ConfigError) as e:
        validate_values("gw1", {**cfg.flat(), "gateway_teams": [{"name": "ide", "key_sha256": A, **entry}]},
                        {"gateway_teams": "group_vars/gateway.yml"})
    text = str(e.value)
    assert "group_vars/gateway.yml: gateway_teams: team 1 (ide)" in text and says in text and fix in text


def test_a_tier_group_must_say_its_slots_and_name_its_tier_plainly(cfg):
    src = {"server_tier": "group_vars/latency.yml", "server_parallel": "group_vars/all.yml"}
    with pytest.raises(ConfigError, match=r"(?s)group_vars/latency\.yml: server_tier: is latency but server_parallel is "
                                          r"empty.*Fix: set server_parallel in the same group"):
        validate_values("l1", {**cfg.flat(), "server_tier": "latency", "server_parallel": None}, src)
    with pytest.raises(ConfigError, match=r"(?s)server_tier: is 'Low Latency'.*Fix: give lowercase letters"):
        validate_values("l1", {**cfg.flat(), "server_tier": "Low Latency"}, src)
    assert validate_values("l1", {**cfg.flat(), "server_tier": "latency", "server_parallel": 2}, src)["server_tier"] == "latency"
    assert validate_values("t1", {**cfg.flat(), "server_parallel": None}, src)["server_tier"] == "throughput"  # as it was
    with pytest.raises(ConfigError, match=r"gateway_tier_overflow: is 'queue'.*\n  Fix: use one of throughput, refuse"):
        validate_values("gw1", {**cfg.flat(), "gateway_tier_overflow": "queue"}, {})


def inventory(tmp_path, groups: dict, **group_vars):
    gv = tmp_path / f"gv{len(list(tmp_path.glob('gv*')))}"
    gv.mkdir()
    (gv / "all.yml").write_text(yaml.safe_dump({**all_yml_vars(), "model_sha256": SHA}))
    for name, data in group_vars.items():
        (gv / f"{name}.yml").write_text(yaml.safe_dump(data))
    return build_inventory(groups, origin="inventory/test.py", group_vars=gv)


def test_a_team_sent_to_a_tier_no_server_host_serves_refuses_the_inventory(tmp_path):
    gw = {"gateway_teams": TEAMS}
    groups = {"gateway": ["gw1"], "v100": ["s1", "s2"]}
    with pytest.raises(ConfigError) as e:
        inventory(tmp_path, groups, gateway=gw)
    text = str(e.value)
    assert text.startswith("voltafleet: gw1: configuration refused")
    assert "group_vars/gateway.yml: gateway_teams: team ide is sent to the tier latency, which no server host serves" in text
    assert "team chat may ask for the tier latency" in text and "servers per tier now: throughput (2)" in text
    out = inventory(tmp_path, {**groups, "latency": ["l1"]}, gateway=gw, latency={"server_tier": "latency", "server_parallel": 2})
    assert [(h, d["server_tier"]) for h, d in out["latency"]] == [("l1", "latency")]
    # without teams every request goes to throughput: a fleet of latency hosts alone cannot serve it
    with pytest.raises(ConfigError, match="gateway_teams: is empty, so every request goes to the throughput tier"):
        inventory(tmp_path, {"gateway": ["gw1"], "latency": ["l1"]}, latency={"server_tier": "latency", "server_parallel": 2})
    inventory(tmp_path, {"latency": ["l1"]}, latency={"server_tier": "latency", "server_parallel": 2})  # no gateway: nothing to route


def render(backends, **cfg_over):
    import jinja2

    cfg = all_yml_settings(**cfg_over)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader("templates"), trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return env.get_template("haproxy.cfg.j2").render(**gateway.template_vars(cfg, backends))


FLEET = gateway.backends([("h1", "10.0.0.1", [8080, 8081], 16), ("l1", "10.0.0.3", [8080, 8081], 2, "latency")])


def section(text: str, head: str) -> str:
    start = text.index("\n" + head + "\n") + 1
    end = text.find("\n\n", start)
    return text[start:end if end > 0 else None]


def test_each_tier_is_a_backend_with_affinity_admission_and_health_checks_of_its_own():
    text = render(FLEET, gateway_teams=TEAMS)
    thr, lat = section(text, "backend llama"), section(text, "backend llama_latency")
    assert re.findall(r"server (\S+) .* maxconn (\d+)", thr) == [("h1-0", "16"), ("h1-1", "16")]
    assert re.findall(r"server (\S+) .* maxconn (\d+)", lat) == [("l1-0", "2"), ("l1-1", "2")]  # admission: its slots
    for b in (thr, lat):
        assert "balance hash var(txn.affinity)" in b and "hash-type consistent" in b and "option httpchk GET /health" in b
        assert "option http-server-close" in b
    assert "errorfile 503 /etc/haproxy/voltafleet-503-latency.http" in lat and "errorfile" not in thr
    assert "http-response set-header x-voltafleet-tier latency" in lat
    assert "\n    default_backend llama\n" in text


def test_a_team_goes_to_its_tier_while_it_has_a_free_slot_else_overflows_or_waits_there():
    text = render(FLEET, gateway_teams=TEAMS)
    front = section(text, "frontend llama")
    assert f"var(txn.team),map({teams.TIERS_MAP})" in front
    rules = re.findall(r"use_backend .*", front)
    assert rules == ["use_backend llama_latency if { var(txn.tier) -m str latency } { be_conn_free(llama_latency) gt 0 } { queue(llama_latency) eq 0 }",
                     "use_backend llama_latency if { var(txn.tier) -m str latency } { var(txn.overflow) -m str refuse }"]
    assert front.index("filter lua.vf_usage") < front.index("use_backend")  # both tiers' answers counted
    b400 = json.loads(re.search(r"return status 400 .* string '([^']+)'", front).group(1))["error"]
    assert b400["code"] == "tier_not_found" and b400["message"].endswith("it serves throughput, latency")
    assert "!{ var(txn.tier) -m str throughput latency }" in front
    b403 = json.loads(re.search(r"return status 403 .* lf-string '([^']+)'", front).group(1))["error"]
    assert b403["code"] == "tier_not_allowed" and "%[var(txn.team)]" in b403["message"]
    assert f"!{{ var(txn.team),concat(/,txn.tier),map({teams.TIERS_MAP}) -m found }}" in front
    # permission before limits: a refused tier never counts against the team's rate
    assert front.index("return status 403") < front.index("track-sc0")


def test_a_fleet_of_one_tier_renders_as_before():
    text = render(gateway.backends([("h1", "10.0.0.1", [8080], 16)]))
    assert "llama_" not in text and "use_backend" not in text and "tier" not in text
    teamed = render(gateway.backends([("h1", "10.0.0.1", [8080], 16)]), gateway_teams=TEAMS[:1])
    assert "use_backend" not in teamed and "it serves throughput\"" in teamed  # the header may name throughput only


def test_the_gateway_warns_of_no_team_and_refuses_a_team_without_its_tier():
    served = {"throughput": 3}
    problems = tiers.fleet_problems(teams.parse(TEAMS), served, "group_vars/gateway.yml")
    assert [p.line() for p in problems] == [
        "group_vars/gateway.yml: gateway_teams: team ide is sent to the tier latency, which no server host serves.",
        "group_vars/gateway.yml: gateway_teams: team chat may ask for the tier latency, which no server host serves."]
    assert tiers.fleet_problems(teams.parse(TEAMS), {"throughput": 1, "latency": 1}) == []
    assert tiers.fleet_problems(teams.parse(TEAMS), {}) == []  # a gateway set up before its servers


def test_the_fleet_plan_carries_each_hosts_tier_to_the_gateway():
    plan = fleetplan.FleetPlan(rollout="r", servers=(fleetplan.ServerEntry("l1", "10.0.0.3", (8080,), 2, None, "latency"),))
    back = fleetplan.FleetPlan.from_json(plan.to_json())
    assert back.server("l1").tier == "latency"
    old = fleetplan.FleetPlan.from_json('{"rollout": "r", "servers": [{"host": "h", "address": "a", "ports": [1]}]}')
    assert old.server("h").tier == "throughput"  # a plan written before tiers


def test_a_tiers_busy_answer_names_the_tier_and_says_when_to_retry():
    head, body = gateway.busy_page(7, "latency").split("\r\n\r\n", 1)
    assert head.startswith("HTTP/1.1 503 ") and "\r\nRetry-After: 7" in head and f"Content-Length: {len(body)}" in head
    err = json.loads(body)["error"]
    assert err["code"] == "tier_busy" and "latency tier" in err["message"] and err["type"] == "server_error"
    assert tiers.errorfile("latency", gateway.ERRORFILE) == "/etc/haproxy/voltafleet-503-latency.http"
    assert tiers.errorfile("throughput", gateway.ERRORFILE) == gateway.ERRORFILE
