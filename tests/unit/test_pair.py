"""Two gateways behind one address (issue 52): the pure decisions (voltafleet/front/pair.py), the
gateway phase one gateway at a time (voltafleet/state/rolling.py), and what the templates make of
them: keepalived's configuration, HAProxy's peers, its budget port, and `haproxy -c` on the result."""
from __future__ import annotations

import shutil
import subprocess

import jinja2
import pytest

from tests.fixture_vars import all_yml_vars
from voltafleet.front import gateway, pair
from voltafleet.inputs import pairvars
from voltafleet.state import rolling
from voltafleet.inputs.settings import Settings


def gw_cfg(address: str | None, **over) -> dict:
    return {**all_yml_vars(), "gateway_vip": "10.0.0.10", "gateway_bind": "10.0.0.10:8000",
            "gateway_address": address, **over}


def typed(gateways: list) -> list:
    """(name, variables, ssh_hostname) as the gateway role gives them to pair.decide: the variables typed."""
    return [(n, Settings.of(c), h) for n, c, h in gateways]


def two(**over) -> list:
    return [("gw-a", gw_cfg("10.0.0.11", **over), "gw-a.fleet"), ("gw-b", gw_cfg("10.0.0.12", **over), "gw-b.fleet")]


def test_one_gateway_is_no_pair_and_needs_nothing():
    assert pair.decide(typed([("gw", all_yml_vars(), None)])) is None and pairvars.problems([("gw", all_yml_vars(), None)]) == []
    assert pair.decide([]) is None


def test_the_first_gateway_holds_the_address_first_and_each_knows_the_others():
    p = pair.decide(typed(two() + [("gw-c", gw_cfg("10.0.0.13"), None)]))
    assert [p.priority(n) for n in ("gw-a", "gw-b", "gw-c")] == [150, 140, 130]
    k = p.keepalived_vars("gw-b")
    assert (k["address"], k["peers"], k["vip"], k["priority"]) == ("10.0.0.12", ["10.0.0.11", "10.0.0.13"], "10.0.0.10", 140)
    assert k["alive_url"] == "http://127.0.0.1:8404/voltafleet/alive"  # the stats frontend, from the host itself
    h = p.haproxy_vars("gw-a")
    assert h["local"] == "gw-a" and h["budget_bind"] == "10.0.0.11:10001" and h["other_addresses"] == "10.0.0.12 10.0.0.13"
    assert h["budget_peers"] == ("gw-b=http://10.0.0.12:10001/voltafleet/budgets/spent "
                                 "gw-c=http://10.0.0.13:10001/voltafleet/budgets/spent")


def test_a_gateways_address_falls_back_to_its_ssh_hostname():
    assert pairvars.address("gw", None, "10.0.0.5") == "10.0.0.5"
    assert pairvars.address("gw", "10.0.0.6", "10.0.0.5") == "10.0.0.6"
    assert pair.alive_url(Settings.of(gw_cfg(None, gateway_metrics_bind="10.0.0.11:18404"))) == "http://10.0.0.11:18404/voltafleet/alive"


@pytest.mark.parametrize("change, key, words", [
    ({"gateway_vip": None}, "gateway_vip", "without one address"),
    ({"gateway_bind": "10.0.0.99:8000"}, "gateway_bind", "not on gateway_vip"),
])
def test_a_pair_without_its_address_is_refused_naming_each_host_and_key(change, key, words):
    found = pairvars.problems([(n, {**c, **change}, h) for n, c, h in two()])
    assert {(host, k) for host, k, _, _ in found} == {("gw-a", key), ("gw-b", key)}
    assert all(words in what and fix for _, _, what, fix in found)


def test_gateways_that_disagree_on_a_shared_value_are_refused():
    gws = two()
    gws[1] = ("gw-b", {**gws[1][1], "gateway_vrrp_router_id": 7}, None)
    found = pairvars.problems(gws)
    assert [(h, k) for h, k, _, _ in found] == [("gw-b", "gateway_vrrp_router_id")]
    assert "gw-a's is 52" in found[0][2]


@pytest.mark.parametrize("address, ssh_hostname, words", [
    (None, "gw-b.fleet", "own IPv4 address"),      # a name: VRRP and the budget port's source check need an address
    ("127.0.0.1", None, "own IPv4 address"),
    ("10.0.0.10", None, "the shared address"),
    ("10.0.0.11", None, "another gateway's too"),
])
def test_each_gateway_needs_its_own_address(address, ssh_hostname, words):
    gws = two()
    gws[1] = ("gw-b", gw_cfg(address), ssh_hostname)
    found = pairvars.problems(gws)
    assert found and all(k == "gateway_address" for _, k, _, _ in found)
    assert any(words in what for _, _, what, _ in found), found


def test_a_wildcard_bind_is_on_every_address_the_vip_included():
    assert pairvars.problems(two(gateway_bind="0.0.0.0:8000")) == []


def test_the_gateway_phase_changes_one_gateway_at_a_time_with_two():
    assert not rolling.gateway_serial([]) and not rolling.gateway_serial(["gw"])
    assert rolling.gateway_serial(["gw-a", "gw-b"]) and rolling.gateway_serial(["a", "b", "c"])


def env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader("templates"), trim_blocks=True, lstrip_blocks=True,
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def test_keepalived_gets_unicast_peers_the_address_and_haproxys_own_check():
    p = pair.decide(typed(two()))
    text = env().get_template("keepalived.conf.j2").render(**p.keepalived_vars("gw-a"))
    assert "unicast_src_ip 10.0.0.11\n" in text and "unicast_peer {\n        10.0.0.12\n    }" in text
    assert "10.0.0.10/24 dev eth0" in text and "priority 150" in text and "state BACKUP" in text
    assert 'script "/usr/bin/curl -sf -m 1 -o /dev/null http://127.0.0.1:8404/voltafleet/alive"' in text
    assert "script_user nobody" in text and "enable_script_security" in text and "preempt_delay 60" in text


def haproxy_text(pair_vars: dict | None, teams: bool = True) -> str:
    cfg = Settings.of({**gw_cfg("10.0.0.11"), "gateway_teams": [{"name": "web", "key_sha256": "a" * 64, "tokens_per_day": 100}]
                       if teams else []})
    args = gateway.template_vars(cfg, gateway.backends([("h1", "10.0.0.1", [8080], 4)]), pair_vars)
    args.update(state_file="/x")
    return env().get_template("haproxy.cfg.j2").render(**args)


def test_haproxy_shares_the_teams_table_and_answers_its_counts_to_the_other_gateways_only():
    text = haproxy_text(pair.decide(typed(two())).haproxy_vars("gw-a"))
    assert "    localpeer gw-a\n" in text
    assert "peers vf_gateways\n    peer gw-a 10.0.0.11:10000\n    peer gw-b 10.0.0.12:10000\n" in text
    assert "store conn_cur,http_req_rate(60s),http_req_cnt,bytes_out_cnt peers vf_gateways\n" in text
    assert "    bind 10.0.0.10:8000 transparent\n" in text  # the address, held or not
    assert 'setenv VOLTAFLEET_BUDGET_PEERS "gw-b=http://10.0.0.12:10001/voltafleet/budgets/spent"' in text
    budget = text[text.index("frontend budget_peers"):]
    assert "bind 10.0.0.11:10001\n" in budget and "deny deny_status 403 unless { src 10.0.0.12 }" in budget
    assert "use-service lua.vf_budget_spent if METH_GET { path /voltafleet/budgets/spent }" in budget
    assert "http-request return status 404" in budget  # nothing else on that port
    assert "if { path /voltafleet/alive }" in text[text.index("frontend stats"):]


def test_one_gateway_has_no_peers_no_budget_port_and_binds_as_before():
    text = haproxy_text(None)
    assert "peers" not in text.replace("VOLTAFLEET_BUDGET_PEERS", "") and "budget_peers" not in text
    assert "transparent" not in text and "localpeer" not in text and "/voltafleet/alive" not in text


def test_haproxy_accepts_the_pairs_configuration(tmp_path):
    import re

    assert shutil.which("haproxy"), "no haproxy on this machine (make setup installs it)"
    text = haproxy_text(pair.decide(typed(two())).haproxy_vars("gw-a"))
    for path in sorted(set(re.findall(r"/etc/haproxy/[\w.-]+", text))):  # maps, pages, the Lua file: into tmp
        name = path.rsplit("/", 1)[1]
        src = "roles/gateway/files/voltafleet-teams.lua" if name.endswith(".lua") else None
        (tmp_path / name).write_text(open(src).read() if src else gateway.busy_page(5) if name.endswith(".http") else "")
        text = text.replace(path, str(tmp_path / name))
    (tmp_path / "haproxy.cfg").write_text(text)
    r = subprocess.run(["haproxy", "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("flag", ["--tune", "--plan", "--no-gateway", "--record-probe"])
def test_gateways_only_runs_the_gateway_phase_alone(flag):
    from types import SimpleNamespace

    from rollout.main import parser, refusal

    a = parser().parse_args(["inventory/lab.py", "--gateways-only", flag])
    fleet = SimpleNamespace(servers=["h1"])
    assert "--gateways-only runs the gateway phase alone" in refusal(a, fleet, ["h1"])
    assert refusal(parser().parse_args(["inventory/lab.py", "--gateways-only"]), fleet, ["h1"]) is None


def test_the_counts_a_gateway_answers_and_how_another_adds_them():
    from voltafleet.front import budgets

    mine = budgets.spent_text("2026-12-05", "2026-12", {"web": 40}, {"web": 100, "batch": 7})
    assert budgets.parse_spent(mine) == ("2026-12-05", "2026-12", {"web": (40, 140), "batch": (0, 7)})
    yesterday = budgets.spent_text("2026-12-04", "2026-12", {"web": 9}, {})
    last_month = budgets.spent_text("2026-11-30", "2026-11", {"web": 1000}, {"web": 5000})
    got = budgets.used_across("web", "2026-12-05", "2026-12", {"day": 1, "month": 2}, [mine, yesterday, last_month])
    assert got == {"day": 1 + 40, "month": 2 + 140 + 9}  # another day's counts go to the month only; another month's to none
    with pytest.raises(ValueError):
        budgets.parse_spent("<html>")


def test_the_lua_answers_the_counts_in_the_specifications_format():
    lua = open("roles/gateway/files/voltafleet-teams.lua").read()
    assert 'local out = {"day " .. book.day, "month " .. book.month}' in lua
    assert 'string.format("%s %d %d", t, day, (book.base[t] or 0) + day)' in lua
    assert 'text:match("^day (%d%d%d%d%-%d%d%-%d%d)\\nmonth (%d%d%d%d%-%d%d)\\n")' in lua
    assert "if p.day == book.day then day = day + (p.today[team] or 0) end" in lua
    assert "if p.month == book.month then month = month + (p.month_total[team] or 0) end" in lua


def test_an_inventory_of_two_gateways_without_one_address_is_refused_at_load_naming_host_file_and_key():
    from voltafleet.inputs.config import ConfigError
    from voltafleet.inputs.groupvars import build_inventory

    groups = {"gateway": [("gw-a", {"ssh_hostname": "10.0.0.11"}), ("gw-b", {"ssh_hostname": "10.0.0.12"})]}
    with pytest.raises(ConfigError) as e:
        build_inventory(groups, origin="inventory/test.py", overrides={"gateway_allow_unauthenticated": True, "server_allow_unauthenticated": True, "model_sha256": "a" * 64})
    text = str(e.value)
    assert "gw-a: configuration refused, no host was touched" in text
    assert "group_vars/all.yml: gateway_vip: is null, but the gateway group holds 2 hosts (gw-a, gw-b)" in text
    ok = build_inventory(groups, origin="inventory/test.py", overrides={
        "gateway_allow_unauthenticated": True, "server_allow_unauthenticated": True, "model_sha256": "a" * 64, "gateway_vip": "10.0.0.10",
        "gateway_bind": "10.0.0.10:8000"})
    assert [h for h, _ in ok["gateway"]] == ["gw-a", "gw-b"]  # their ssh_hostname is each one's own address


def test_keepalived_starts_once_the_gateways_own_address_is_up(tmp_path):
    """A gateway booting after a power cut: keepalived 2.2.7 started before its unicast_src address is on an
    interface puts the VRRP instance in FAULT for good (the lab's host-kill test found it: the first gateway
    never took the address back). The drop-in waits for the address; the wait is what a shell runs."""
    p = pair.decide(typed(two()))
    text = p.keepalived_dropin("gw-a")
    assert "After=network-online.target" in text and "Restart=on-failure" in text
    line = next(l for l in text.splitlines() if l.startswith("ExecStartPre="))
    assert '" inet 10.0.0.11/"' in line and "$$i" in line  # systemd would expand a single $
    script = line.split("-c ", 1)[1].strip("'").replace("$$", "$").replace("ip -4 -o addr show", "cat addrs")
    (tmp_path / "addrs").write_text("2: host0    inet 10.0.0.111/24 brd 10.0.0.255 scope global host0\n")
    quick = script.replace("-ge 300", "-ge 3")
    assert subprocess.run(["sh", "-c", quick], cwd=tmp_path).returncode == 1  # 10.0.0.111 is not 10.0.0.11
    (tmp_path / "addrs").write_text("2: host0    inet 10.0.0.11/24 brd 10.0.0.255 scope global host0\n")
    assert subprocess.run(["sh", "-c", quick], cwd=tmp_path).returncode == 0
