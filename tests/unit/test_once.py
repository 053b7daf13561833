"""voltafleet.state.once: a value resolved once per run however many greenlets ask at once, and
the other per-process caches of the controller (--help parsed once per text, group_vars
files parsed once per process)."""
import gevent
import pytest
from gevent.lock import Semaphore

from voltafleet.planning import flags
from voltafleet.inputs import groupvars
from voltafleet.state.once import Once


def test_fifty_concurrent_greenlets_call_once():
    calls = []

    def slow(url):
        calls.append(url)
        gevent.sleep(0.01)  # the first caller waits on the network: the others must not call too
        return len(url)

    once = Once(slow, Semaphore)
    values = [g.value for g in gevent.joinall([gevent.spawn(once, "http://m/a.gguf") for _ in range(50)])]
    assert values == [len("http://m/a.gguf")] * 50
    assert once.calls == 1 and calls == ["http://m/a.gguf"]
    once("http://m/b.gguf")
    assert once.calls == 2  # one per key


def test_an_error_is_not_kept_and_forget_reads_again():
    n = []

    def flaky(key):
        n.append(key)
        if len(n) == 1:
            raise OSError("down")
        return len(n)

    once = Once(flaky)
    with pytest.raises(OSError):
        once("k")
    assert once("k") == 2 and once("k") == 2
    once.forget(lambda key: key != ("k",))
    assert once("k") == 3


def test_help_text_parsed_once_per_text(help_text):
    flags.parse_help.cache_clear()
    for _ in range(10):
        assert flags.check_against_help(["-c", "8192", "--draft-max", "3"], help_text)
    assert flags.parse_help.cache_info().misses == 1
    known, removed = flags.parse_help(help_text)
    with pytest.raises(AttributeError):
        known.add("--x")  # shared by every caller: read-only
    with pytest.raises(TypeError):
        removed["--x"] = "y"


def test_group_vars_files_parsed_once_per_process(monkeypatch):
    parsed = []
    real = groupvars._parse_yaml
    monkeypatch.setattr(groupvars, "_parse_yaml", lambda path: parsed.append(path.name) or real(path))
    monkeypatch.setattr(groupvars, "_PARSED", {})
    hosts = [(f"gpu-{i:03d}", {}) for i in range(50)]
    out = groupvars.build_inventory({"v100_16gb": hosts}, origin="test", overrides={"model_sha256": "a" * 64, "server_allow_unauthenticated": True,
                                 "gateway_allow_unauthenticated": True})
    assert len(out["v100_16gb"]) == 50
    assert sorted(parsed) == ["all.yml", "v100_16gb.yml"]
    a, b = out["v100_16gb"][0][1], out["v100_16gb"][1][1]
    assert a["preflight_supported_os"] == b["preflight_supported_os"]
    assert a["preflight_supported_os"] is not b["preflight_supported_os"]  # each host its own copy
