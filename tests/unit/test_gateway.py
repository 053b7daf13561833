import pytest

from voltafleet.gateway import backend_name, backends, current_sessions, runtime, server_states, set_state

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
        "echo 'set server llama/vf-lab-1-0 state drain' | socat stdio UNIX-CONNECT:/run/haproxy/admin.sock"
    with pytest.raises(ValueError):
        runtime("set server x; rm -rf /")
    with pytest.raises(ValueError):
        set_state("h", 0, "up")


def test_sessions_and_states_from_show_stat():
    assert current_sessions(STAT, "vf-lab-1-0") == 2
    assert current_sessions(STAT, "vf-lab-1-1") == 0
    assert current_sessions(STAT, "nope") is None
    assert server_states(STAT) == {"vf-lab-1-0": "UP", "vf-lab-1-1": "DRAIN"}
