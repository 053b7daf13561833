"""The team maps in the running gateway (issue 39): a run changes the running HAProxy only where
its copy differs from the new file, then reads each changed map back; a mismatch fails the
host, naming the gateway and the map."""
from types import SimpleNamespace

from roles.gateway import RunningMap, maps_live, matches_running
from tests.ops.fakes import FakeHost, commands
from voltafleet.front import teams

LIMITS, KEYS = teams.LIMITS_MAP, teams.KEYS_MAP
NEW = "batch 6 100000\nslow 64 3\n"


def gateway(running: dict) -> FakeHost:
    return FakeHost({RunningMap: {(("path", p),): v for p, v in running.items()}}, name="gw-1")


def test_only_a_map_whose_running_copy_differs_is_changed_then_read_back():
    keys = "a" * 64 + " web\n"
    gw = gateway({LIMITS: "0x1 batch 6\n0x2 slow 64 3\n\n",  # cut by an earlier run: brought to the file
                  KEYS: f"0x3 {keys}\n"})  # equal: untouched
    assert commands(maps_live, gw, paths=[LIMITS, KEYS], texts=[NEW, keys]) == [
        teams.runtime_replace(LIMITS), "<function matches_running>"]


def test_a_map_the_running_gateway_does_not_use_is_left_to_the_reload():
    gw = gateway({LIMITS: None, KEYS: None})
    assert commands(maps_live, gw, paths=[LIMITS, KEYS], texts=[NEW, "a" * 64 + " web\n"]) == []


def test_the_fact_reads_the_running_copy_or_none():
    fact = RunningMap()
    assert fact.command(path=LIMITS) == teams.show_running(LIMITS)
    assert fact.process(["0x1 slow 64 3", ""]) == "0x1 slow 64 3\n\n"
    assert fact.process([teams.NOT_LOADED]) is None


class Gateway:
    """A gateway host whose readback answers from a script, logging what the run would print."""

    def __init__(self, stdout: str, ok: bool = True, stderr: str = ""):
        self.name, self.data, self.logged = "gw-1", {}, []
        self.answer = (ok, SimpleNamespace(stdout=stdout, stderr=stderr))
        self.sent = []

    def run_shell_command(self, command, **kw):
        self.sent.append(command)
        return self.answer

    def log_styled(self, text, **kw):
        self.logged.append(text)


def test_a_running_copy_equal_to_the_file_passes():
    gw = Gateway(f"0x1 slow 64 3\n0x2 batch 6 100000\n\n{teams.FILE_MARK}\n{NEW}")
    assert matches_running(None, gw, LIMITS) and gw.logged == [] and gw.sent == [teams.readback(LIMITS)]


def test_a_mismatch_fails_the_host_naming_the_gateway_and_the_map():
    gw = Gateway(f"0x1 slow 64\n0x2 batch 6 100000\n\n{teams.FILE_MARK}\n{NEW}")
    assert not matches_running(None, gw, LIMITS)
    assert gw.logged[0].startswith(f"gateway gw-1: the running HAProxy's map {LIMITS}") and "slow" in gw.logged[0]


def test_an_unanswered_readback_fails_the_host():
    gw = Gateway("", ok=False, stderr="socat: connect(/run/haproxy/admin.sock): Connection refused")
    assert not matches_running(None, gw, LIMITS)
    assert "gateway gw-1" in gw.logged[0] and "Connection refused" in gw.logged[0]
