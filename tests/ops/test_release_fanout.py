"""One download per fleet, for llama.cpp releases too: a release compiled on one host (shared
strategy) leaves it once, into the controller's cache (roles/llama_cpp._archive_from), and every
other host of its fingerprint receives it from the controller, never from the builder: many
hosts at once fetch it from the builder once, and a cached release never touches the builder."""
import gevent
import pytest

import roles.llama_cpp as lc
from voltafleet.planning.hostplan import HostFacts, make_plan

COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


class Out:
    def __init__(self, stdout=""):
        self.stdout, self.stderr, self.stderr_lines = stdout, "", []


class Host:
    """A host that records what it is asked: shell commands, files sent to it and fetched from it."""

    def __init__(self, name):
        self.name, self.data, self.groups = name, {}, []
        self.commands, self.received, self.sent = [], [], []

    def run_shell_command(self, command, **kw):
        self.commands.append(command)
        gevent.sleep(0.01)  # a network round trip: the other hosts' greenlets run meanwhile
        return True, Out()

    def get_file(self, remote, local, **kw):
        self.sent.append(remote)
        gevent.sleep(0.05)
        with open(local, "wb") as f:
            f.write(b"release archive")
        return True

    def put_file(self, local, remote, **kw):
        self.received.append((local, remote))
        return True

    def log_styled(self, *a, **kw):
        raise AssertionError(a)


class State:
    def __init__(self, hosts):
        self.hosts = {h.name: h for h in hosts}
        self.inventory = self
        self.active_hosts = set(hosts)

    def get_host(self, name):
        return self.hosts[name]


@pytest.fixture
def plan(cfg):
    cfg = cfg.replace(voltafleet_backend="cpu", server_instances=1, llama_cpp_targets=["llama-server"])
    return make_plan("gpu-01", cfg, HostFacts(os="debian-12", systemd=252), None, COMMIT)


def test_many_hosts_receive_a_release_from_the_controller_and_the_builder_sends_it_once(plan, tmp_path, monkeypatch):
    monkeypatch.setattr(lc, "RELEASE_CACHE", tmp_path / "cache")
    monkeypatch.setattr(lc, "builder_of", lambda fp: "builder")
    builder = Host("builder")
    receivers = [Host(f"gpu-{i:02d}") for i in range(12)]
    state = State([builder, *receivers])
    jobs = [gevent.spawn(lc._ship, state, h, plan, "fp1") for h in receivers]
    gevent.joinall(jobs, raise_error=True)
    assert all(j.value for j in jobs)
    assert builder.sent == [f"{plan.root}/releases/fp1.tar.gz"]  # once, to the controller
    archive = str(tmp_path / "cache" / "fp1.tar.gz")
    for h in receivers:
        assert [local for local, _ in h.received] == [archive]  # from the controller's cache
        assert any(c.startswith(f"{plan.root}/bin/vf-release install ") for c in h.commands)
    # a later batch (or rollout): the cache has it, the builder is not asked again, even when gone
    state.active_hosts.discard(builder)
    late = Host("gpu-99")
    state.hosts["gpu-99"] = late
    assert lc._ship(state, late, plan, "fp1")
    assert builder.sent == [f"{plan.root}/releases/fp1.tar.gz"] and late.received[0][0] == archive


def _release_archive(path, fp, built_on):
    """A release archive as `vf-release pack` writes it: the release directory, BUILD_INFO.json in it."""
    import io
    import json
    import tarfile

    data = json.dumps({"fingerprint": fp, "built_on": built_on}).encode()
    with tarfile.open(path, "w:gz") as tar:
        member = tarfile.TarInfo(f"{fp}/BUILD_INFO.json")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))


def test_an_installed_release_names_the_host_that_compiled_it(plan, tmp_path, monkeypatch):
    """The canary (gpu-01) compiled the release; the next batch's first host (gpu-02) is that run's
    "builder" but compiled nothing. Every host that installs it, the first through gpu-02's archive and
    the next from the cache, names gpu-01: in its log line and its build record's `source`."""
    from voltafleet.state.fleetplan import archive_built_on, release_builder

    monkeypatch.setattr(lc, "RELEASE_CACHE", tmp_path / "cache")
    monkeypatch.setattr(lc, "builder_of", lambda fp: "gpu-02")
    lines = []
    monkeypatch.setattr(lc.logger, "info", lambda line, *a, **kw: lines.append(line))

    class Received(Host):
        def get_file(self, remote, local, **kw):
            self.sent.append(remote)
            _release_archive(local, "fp1", "gpu-01")
            return True

    first_of_batch, other = Received("gpu-02"), Host("gpu-03")
    state = State([first_of_batch, other])
    assert lc._ship(state, other, plan, "fp1") and lc._ship(state, first_of_batch, plan, "fp1")
    assert archive_built_on(tmp_path / "cache" / "fp1.tar.gz", "fp1") == "gpu-01"
    assert release_builder(tmp_path / "cache", "fp1") == "gpu-01"
    assert lines == [f"{h}: installed release fp1 from the controller's cache (built on gpu-01; no compile)"
                     for h in ("gpu-03", "gpu-02")]
    # an archive without BUILD_INFO.json, a cache without the note: nothing to name
    (tmp_path / "old.tar.gz").write_bytes(b"release archive")
    assert archive_built_on(tmp_path / "old.tar.gz", "fp1") == "" and release_builder(tmp_path, "fp2") == ""


def test_a_builder_that_has_the_release_already_sends_it_to_the_cache_when_the_cache_lacks_it(plan, tmp_path, monkeypatch):
    """A run that compiled the release on its builder stopped before the archive reached the controller (the
    controller was killed): the next run finds the release on the builder and nothing in the cache. The builder
    sends it now, so the later batches install it (seen on the lab: they refused "its build host ... is no
    longer in this run" on every re-run before). Once the cache has it, nothing more is done."""
    monkeypatch.setattr(lc, "RELEASE_CACHE", tmp_path / "cache")
    monkeypatch.setattr(lc, "host_fingerprint", lambda host, build: "fp1")
    monkeypatch.setattr(lc, "host_fact", lambda host, fact, **kw: {"releases": ["fp1"]})
    monkeypatch.setattr(lc, "builder_of", lambda fp: "builder")
    builder, other = Host("builder"), Host("gpu-02")
    monkeypatch.setattr(lc, "host", builder)
    monkeypatch.setattr(lc, "later_batches_need", lambda fp: False)
    assert list(lc.compiled._inner(plan, "shared")) == []  # a plain run: the others take it from the builder
    monkeypatch.setattr(lc, "later_batches_need", lambda fp: True)
    commands = list(lc.compiled._inner(plan, "shared"))
    assert len(commands) == 1 and builder.sent == []
    commands[0].execute(State([builder]), builder, {})
    assert builder.sent == [f"{plan.root}/releases/fp1.tar.gz"] and lc.cached("fp1")
    assert list(lc.compiled._inner(plan, "shared")) == []  # cached: nothing to do (a converged fleet)
    monkeypatch.setattr(lc, "host", other)
    monkeypatch.setattr(lc, "builder_of", lambda fp: "elsewhere")
    (tmp_path / "cache" / "fp1.tar.gz").unlink()
    assert list(lc.compiled._inner(plan, "shared")) == []  # not its builder: not its to send


def test_only_a_rolling_rollout_with_other_hosts_of_the_fingerprint_needs_the_cache(monkeypatch):
    from voltafleet.state.fleetplan import FleetPlan, ServerEntry

    def plan_of(*fps):
        return FleetPlan(rollout="r", servers=tuple(ServerEntry(host=f"h{i}", address="10.0.0.1", fingerprint=fp, ports=(8080,))
                                                    for i, fp in enumerate(fps)))

    for fleet, need in [(None, False), (plan_of("fp1"), False), (plan_of("fp1", "fp2"), False),
                        (plan_of("fp1", "fp1"), True)]:
        monkeypatch.setattr(lc, "fleet_plan", lambda fleet=fleet: fleet)
        assert lc.later_batches_need("fp1") is need, fleet
