import json
import pytest

from voltafleet.front.gateway import backend_name, backends, current_sessions, runtime, server_states, set_state
from voltafleet.inputs.settings import Settings

STAT = """# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status,weight
llama,FRONTEND,,,0,1,4096,3,,,,,,,,,,OPEN,
llama,vf-lab-1-0,0,0,2,3,,10,,,,,,,,,,UP,1
llama,vf-lab-1-1,0,0,0,1,,4,,,,,,,,,,DRAIN,1
llama,BACKEND,0,0,2,3,,14,,,,,,,,,,UP,2
"""


def test_every_instance_of_every_server_host_is_a_backend():
    out = backends([("vf-lab-1", "127.0.0.1", [18010, 18011]), ("gpu-02.fleet", "10.0.0.2", [8080])])
    assert [(b.name, b.address, b.port) for b in out] == [
        ("vf-lab-1-0", "127.0.0.1", 18010), ("vf-lab-1-1", "127.0.0.1", 18011), ("gpu-02.fleet-0", "10.0.0.2", 8080)]
    assert backend_name("a b$c", 1) == "a_b_c-1"


def test_runtime_commands_go_to_the_admin_socket_and_refuse_odd_characters():
    assert set_state("vf-lab-1", 0, "drain") == \
        "echo 'set server llama/vf-lab-1-0 state drain' | socat -t 30 stdio UNIX-CONNECT:/run/haproxy/admin.sock"
    with pytest.raises(ValueError):
        runtime("set server x; rm -rf /")
    with pytest.raises(ValueError):
        set_state("h", 0, "up")


def test_sessions_and_states_from_show_stat():
    assert current_sessions(STAT, "vf-lab-1-0") == 2
    assert current_sessions(STAT, "vf-lab-1-1") == 0
    assert current_sessions(STAT, "nope") is None
    assert server_states(STAT) == {"vf-lab-1-0": "UP", "vf-lab-1-1": "DRAIN"}


# ---------------------------------------------------------------- issue 18: the configuration


def render(cfg_over: dict | None = None, **over):
    cfg_over = cfg_over or {}
    import jinja2

    from voltafleet.front.gateway import backends, template_vars
    from tests.fixture_vars import all_yml_vars

    cfg = all_yml_vars()
    env = jinja2.Environment(loader=jinja2.FileSystemLoader("templates"), trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    args = template_vars(Settings.of({**cfg, **cfg_over}), backends([("h1", "10.0.0.1", [8080, 8081], 4), ("h2", "10.0.0.2", [8080], None)]))
    args.update(state_file="/x")
    return env.get_template("haproxy.cfg.j2").render(**{**args, **over})


def test_an_instance_never_gets_more_requests_than_its_slots():
    text = render()
    assert "server h1-0 10.0.0.1:8080 check maxconn 4 weight 64\n" in text
    assert "server h1-1 10.0.0.1:8081 check maxconn 4 weight 64\n" in text
    assert "server h2-0 10.0.0.2:8080 check weight 64\n" in text  # slots unknown: no cap rather than a wrong one
    assert "timeout queue 30s" in text and "errorfile 503 /etc/haproxy/voltafleet-503.http" in text


def test_the_busy_answer_is_fast_and_says_when_to_retry():
    from voltafleet.front.gateway import busy_page

    page = busy_page(7)
    head, body = page.split("\r\n\r\n", 1)
    assert head.startswith("HTTP/1.1 503 ") and "\r\nRetry-After: 7" in head
    assert f"Content-Length: {len(body)}" in head
    err = json.loads(body)["error"]  # OpenAI's shape: the SDK raises InternalServerError with this code
    assert err["code"] == "fleet_busy" and err["type"] == "server_error" and "param" in err and "7 s" in err["message"]


def test_the_server_side_closes_after_each_response_the_client_side_stays_open():
    text = render()
    assert "option http-server-close" in text and "timeout http-keep-alive 75s" in text
    assert "option log-separate-errors" in text and "no option dontlognull" in text


def test_affinity_is_a_bounded_consistent_hash_and_switchable():
    text = render()
    assert "balance hash var(txn.affinity)" in text and "hash-type consistent" in text
    assert "hash-balance-factor 125" in text and "req.hdr(x-session-id)" in text
    assert text.count(" weight 64\n") == text.count("    server ")  # 1,024 ring points a server: even shares
    off = render(affinity=False)
    assert " weight " not in off
    assert "balance leastconn" in off and "balance hash" not in off


def test_stats_and_exporter_bind_to_loopback_by_default():
    assert "bind 127.0.0.1:8404\n" in render()


def test_a_listening_server_without_a_key_is_refused_unless_said(cfg):
    from voltafleet.inputs.config import ConfigError, validate_values

    base = cfg.replace(model_sha256="a" * 64, server_allow_unauthenticated=False, server_api_key_file=None)
    with pytest.raises(ConfigError, match=r"(?s)server_host: is 0.0.0.0 without an API key.*Fix: set server_api_key_file"):
        validate_values("h1", {**base.flat(), "server_host": "0.0.0.0"}, {})
    validate_values("h1", {**base.flat(), "server_host": "127.0.0.1"}, {})                              # loopback only
    validate_values("h1", {**base.flat(), "server_host": "0.0.0.0", "server_allow_unauthenticated": True}, {})


def test_a_public_gateway_in_front_of_keyless_servers_is_refused_unless_said(cfg):
    # issue 28: server_allow_unauthenticated with the default gateway_bind 0.0.0.0:8000 made the fleet's API public
    from voltafleet.inputs.config import ConfigError, validate_values

    base = cfg.replace(model_sha256="a" * 64, server_allow_unauthenticated=True, server_api_key_file=None, gateway_allow_unauthenticated=False)
    for bind in ("0.0.0.0:8000", "[::]:8000", "192.0.2.10:8000", "gw.example:8000"):
        with pytest.raises(ConfigError, match=r"(?s)gateway_bind: is .* neither the gateway nor the servers check a key.*Fix: give each team a key \(gateway_teams\), or set server_api_key_file"):
            validate_values("h1", {**base.flat(), "gateway_bind": bind}, {"gateway_bind": "group_vars/all.yml"})
    for bind in ("127.0.0.1:8000", "[::1]:8000", "localhost:8000"):
        validate_values("h1", {**base.flat(), "gateway_bind": bind}, {})
    validate_values("h1", {**base.flat(), "gateway_allow_unauthenticated": True}, {})           # said so
    validate_values("h1", {**base.flat(), "gateway_teams": [{"name": "web", "key_sha256": "b" * 64}]}, {})  # keys at the gateway
    key = base.replace(server_api_key_file=__file__)
    try:
        validate_values("h1", key, {})
    except ConfigError as e:  # whatever else the key file needs, never this refusal
        assert "gateway_bind" not in str(e)


@pytest.mark.parametrize("value", ["::%n&&id", "fe80::1%$(id)", "fe80::1%", "10.0.0.1%eth0", "fe80::1%{{x}}"])
def test_an_ipv6_scope_id_is_an_interface_name_and_nothing_else(cfg, value):
    from voltafleet.inputs.config import ConfigError, validate_values

    base = cfg.replace(model_sha256="a" * 64)
    for key in ("server_host", "mirror_listen"):
        with pytest.raises(ConfigError, match=rf"(?s){key}: .*scope id"):
            validate_values("h1", {**base.flat(), key: value}, {})
    validate_values("h1", {**base.flat(), "server_host": "fe80::1%eth0"}, {})


def test_slots_endpoint_is_off_and_props_writes_cannot_be_turned_on(cfg):
    from voltafleet.planning.flags import extra_flag_errors, server_args

    args = server_args(cfg.replace(server_ctx=4096, server_parallel=2), "/m.gguf", 8080, None)
    assert "--no-slots" in args
    assert "--no-slots" not in server_args(cfg.replace(server_ctx=4096, server_parallel=2, server_slots_endpoint=True), "/m.gguf", 8080, None)
    assert any("server_slots_endpoint" in fix for _, fix in extra_flag_errors(["--slots"], cfg.build.ref))
    assert extra_flag_errors(["--props"], cfg.build.ref)


def test_a_streams_token_events_go_out_as_they_come():
    text = render()
    defaults = text[text.index("\ndefaults"):text.index("\nfrontend llama")]
    assert "    option http-no-delay\n" in defaults  # measured: +200 ms to the first token without it


def test_the_gateway_runs_one_thread_so_runtime_map_changes_never_race_a_lookup():
    """A worker aborted (malloc heap corruption) during a `set map` under load with 2 threads in the
    lab: one thread serializes map changes, lookups and the teams' Lua state."""
    glob = render().split("\ndefaults")[0]
    assert "\n    nbthread 1\n" in glob
