"""The gateway drain, in process against a scripted HAProxy runtime API: no restart of a
served instance without a confirmed drain."""
from types import SimpleNamespace

import pytest

from roles.gateway_api import drain, drain_timeout, DrainError

HEADER = "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status"


def stat(rows, backend="llama"):
    return "\n".join([HEADER] + [f"{backend},{name},0,0,{scur},0,,0,0,0,0,0,0,0,0,0,0,{status}"
                                 for name, scur, status in rows] + [f"{backend},BACKEND,0,0,0,0,,0,0,0,0,0,0,0,0,0,0,UP"])


class Gateway:
    """A gateway host whose runtime API answers from a script: `show stat` outputs in turn."""

    def __init__(self, stats, fail_on=None):
        self.name, self.groups, self.data = "gw", ["gateway"], {}
        self.stats, self.fail_on, self.sent = list(stats), fail_on, []

    def run_shell_command(self, command, **kw):
        self.sent.append(command)
        if self.fail_on and self.fail_on in command:
            return False, SimpleNamespace(stdout="", stderr="socat: connect(/run/haproxy/admin.sock): No such file")
        out = self.stats.pop(0) if "show stat" in command else ""
        return True, SimpleNamespace(stdout=out, stderr="")


def state_with(gw):
    return SimpleNamespace(inventory=[gw], active_hosts={gw})


def test_drain_is_confirmed_and_waits_for_the_streams():
    gw = Gateway([stat([("h-0", 2, "UP")]), stat([("h-0", 2, "DRAIN")]), stat([("h-0", 1, "DRAIN")]),
                  stat([("h-0", 0, "DRAIN")])])
    assert drain(state_with(gw), "h", 0, timeout_s=30) == 0
    assert "show stat" in gw.sent[0] and "set server llama/h-0 state drain" in gw.sent[1]
    assert sum("show stat" in c for c in gw.sent) == 4  # found, confirmed, then waited until no stream was left


def test_an_instance_of_another_tier_is_drained_in_its_tiers_backend():
    """issue 41: a latency host's instance is in backend llama_latency; the throughput backend
    does not list it."""
    rows = stat([("t-0", 0, "UP")]) + "\n" + "\n".join(stat([("h-0", 1, "UP")], "llama_latency").splitlines()[1:])
    drained = rows.replace("h-0,0,0,1,0,,0,0,0,0,0,0,0,0,0,0,UP", "h-0,0,0,0,0,,0,0,0,0,0,0,0,0,0,0,DRAIN")
    gw = Gateway([rows, drained, drained])
    assert drain(state_with(gw), "h", 0, timeout_s=30) == 0
    assert "set server llama_latency/h-0 state drain" in gw.sent[1]


def test_streams_still_open_at_the_deadline_are_counted():
    gw = Gateway([stat([("h-0", 3, "DRAIN")])] * 50)
    assert drain(state_with(gw), "h", 0, timeout_s=0) == 3


def test_a_backend_the_gateway_does_not_list_is_not_drained():
    gw = Gateway([stat([("other-0", 0, "UP")])])
    with pytest.raises(DrainError, match="does not list backend h-0"):
        drain(state_with(gw), "h", 0, timeout_s=5)


def test_a_broken_admin_socket_is_an_error_not_nothing_to_drain():
    gw = Gateway([stat([("h-0", 0, "UP")])], fail_on="state drain")
    with pytest.raises(DrainError, match="No such file"):
        drain(state_with(gw), "h", 0, timeout_s=5)


def test_a_drain_that_does_not_take_is_an_error():
    gw = Gateway([stat([("h-0", 0, "UP")])] * 2)
    with pytest.raises(DrainError, match="is UP after `drain`"):
        drain(state_with(gw), "h", 0, timeout_s=5)


def test_the_drain_waits_as_long_as_the_gateway_keeps_a_stream():
    from tests.fixture_vars import all_yml_settings

    assert drain_timeout(all_yml_settings(gateway_drain_timeout_s=None, gateway_stream_timeout_s=600)) == 600
    assert drain_timeout(all_yml_settings(gateway_drain_timeout_s=30, gateway_stream_timeout_s=600)) == 30
