"""What the controller resolves once per run, counted (bench/controller/scale.py measures the time):
the model's header, its size and a ref's commit are fetched once however many host greenlets
ask at once; the builder of each fingerprint is elected in one pass over the fleet; the
gateway's server states are read once for every server host, and again after a drain or ready."""
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import gevent
import pytest
from pyinfra.context import ctx_host, ctx_state

import roles.factcache as factcache
import roles.gateway_api as gateway_api
from roles import facts as F
from roles.llama_cpp import builder_of, run_builders
from tests.ops.fakes import FakeHost

REPO = Path(__file__).resolve().parents[2]
CXX = {1: "12.2.0 x86_64-linux-gnu", 2: "13.2.0 x86_64-linux-gnu"}
GPUS = [{"index": i, "name": "Tesla V100-SXM2-16GB", "compute_cap": "7.0", "memory_mib": 16160,
         "driver_version": "580.95.05"} for i in range(8)]


class State(SimpleNamespace):
    """pyinfra's State as the roles see it (hashable, as pyinfra's is)."""
    __hash__ = object.__hash__
    __eq__ = object.__eq__


class Host(FakeHost):
    """A fake host that counts the facts other hosts read from it, and the commands sent to it."""

    def __init__(self, *a, reads: list, **kw):
        super().__init__(*a, **kw)
        self.reads, self.sent = reads, []

    def get_fact(self, cls, *args, **kwargs):
        if ctx_host.isset() and ctx_host.get() is not self:
            self.reads.append((self.name, cls.__name__))
        return super().get_fact(cls, *args, **kwargs)

    def run_shell_command(self, command, **kw):
        self.sent.append(command)
        return True, SimpleNamespace(stdout="", stderr="")


def fleet(n: int, cfg: dict, reads: list):
    """n shared-strategy hosts, the second half with another compiler (another fingerprint)."""
    state = State(is_executing=True, inventory=[], active_hosts=set())
    for i in range(n):
        facts = {F.HostBasics: {"cxx": CXX[1 if i < n // 2 else 2]}, F.Gpus: GPUS, F.NvccVersion: "12.9.86"}
        h = Host(facts, name=f"gpu-{i:03d}", data=cfg.replace(llama_cpp_build_strategy="shared").flat(), reads=reads)
        h.state = state
        state.inventory.append(h)
    state.active_hosts = set(state.inventory)
    return state


def elect(state) -> dict[str, str]:
    out = {}
    for h in state.inventory:
        with ctx_host.use(h), ctx_state.use(state):
            out[h.name] = builder_of(factcache.host_fingerprint(h))
    return out


@pytest.mark.parametrize("n", [10, 100])
def test_builder_election_reads_each_host_once(cfg, n):
    reads = []
    state = fleet(n, cfg, reads)
    builders = elect(state)
    first, second = "gpu-000", f"gpu-{n // 2:03d}"
    assert set(builders.values()) == {first, second}
    assert all(b == (first if i < n // 2 else second) for i, b in enumerate(builders.values()))
    # one pass over the fleet: HostBasics, Gpus and the toolkit of every other host, once (was ~1.5 N^2)
    assert len(reads) <= 3 * (n - 1)
    run_builders.forget()


def test_a_fingerprint_that_appears_later_is_elected_again(cfg):
    reads = []
    state = fleet(4, cfg, reads)
    late = state.inventory[3]
    late.facts[F.HostBasics] = {"cxx": None}  # no compiler yet when the first host asks
    assert elect(state)["gpu-000"] == "gpu-000"
    late.facts[F.HostBasics] = {"cxx": CXX[1]}  # the toolchain role installed it: same fingerprint as gpu-000
    with ctx_host.use(late), ctx_state.use(state):
        assert builder_of(factcache.host_fingerprint(late)) == "gpu-000"
    late.facts[F.HostBasics] = {"cxx": "14.1.0 x86_64-linux-gnu"}  # a new one: it builds it
    with ctx_host.use(late), ctx_state.use(state):
        assert builder_of(factcache.host_fingerprint(late)) == "gpu-003"
    run_builders.forget()


def test_gateway_states_read_once_for_every_server_and_again_after_a_write():
    reads = []
    gw = Host({F.HAProxyServers: {"gpu-001-0": "DRAIN 0/0"}}, name="gw", reads=reads)
    gw.groups = ["gateway"]
    servers = [Host({}, name=f"gpu-{i:03d}", reads=reads) for i in range(50)]
    state = State(is_executing=False, inventory=[gw, *servers], active_hosts={gw, *servers})
    gw.state = state
    drained = []
    for h in servers:
        with ctx_host.use(h), ctx_state.use(state):
            if gateway_api.out_of_rotation(state, h.name, range(8)):
                drained.append(h.name)
    assert drained == ["gpu-001"]
    assert reads == [("gw", "HAProxyServers")]  # once for 50 hosts (was once per host)
    with ctx_host.use(servers[1]), ctx_state.use(state):
        gateway_api.ready(state, "gpu-001", [0])
        gw.facts[F.HAProxyServers] = {"gpu-001-0": "UP 1/3"}
        assert not gateway_api.out_of_rotation(state, "gpu-001", [0])  # our own write: read again
    # the instance's backend read from `show stat` (its tier's; none listed here: llama), then set ready there
    assert len(reads) == 2 and "show stat" in gw.sent[0] and "set server llama/gpu-001-0 state ready" in gw.sent[1]
    gateway_api._gateway_states.forget()


def concurrently(fn, n=50):
    return [g.value for g in gevent.joinall([gevent.spawn(fn) for _ in range(n)], raise_error=True)]


def test_header_size_and_ref_fetched_once_per_run_not_per_greenlet(monkeypatch):
    calls = {"header": 0, "size": 0, "ref": 0}

    def slow(kind, value):
        def fetch(*a):
            calls[kind] += 1
            gevent.sleep(0.01)  # on the network: every other greenlet asks meanwhile
            return value
        return fetch

    monkeypatch.setattr(factcache.gguf_header, "read_url", slow("header", "HEADER"))
    monkeypatch.setattr(factcache, "remote_size", slow("size", 15 << 30))
    monkeypatch.setattr(factcache._resolve, "fn", slow("ref", "ab" * 20))
    for once in (factcache.model_header, factcache.model_size, factcache._resolve):
        once.forget()
    url = "http://m/Qwen3.6-27B-Q4_K_S.gguf"
    assert set(concurrently(lambda: factcache.model_header(url))) == {"HEADER"}
    assert set(concurrently(lambda: factcache.model_size(url))) == {15 << 30}
    assert set(concurrently(lambda: factcache.resolve_ref("https://github.com/ggml-org/llama.cpp.git", "master"))) \
        == {"ab" * 20}
    assert calls == {"header": 1, "size": 1, "ref": 1}
    for once in (factcache.model_header, factcache.model_size, factcache._resolve):
        once.forget()


# ---------------------------------------------------------------- facts read once until a change


class RunHost(FakeHost):
    """A host of a run (its state lists its operations) that counts its fact reads."""

    def __init__(self, facts: dict, executing: bool = False):
        super().__init__(facts)
        self.state = SimpleNamespace(is_executing=executing, ops={self: {}})
        self.read = []

    def get_fact(self, cls, *args, **kwargs):
        self.read.append(cls.__name__)
        return super().get_fact(cls, *args, **kwargs)

    def operation(self, ran_commands: bool):
        """An operation of this host that ran (or did not run) commands on it."""
        meta = SimpleNamespace(executed=ran_commands)
        self.state.ops[self][f"op{len(self.state.ops[self])}"] = SimpleNamespace(operation_meta=meta)


def test_a_fact_is_read_once_until_an_operation_changes_the_host():
    h = RunHost({F.HostBasics: {"cxx": CXX[1]}, F.Releases: {"current": "a", "good": None, "releases": {}}})
    for _ in range(3):
        assert factcache.host_fact(h, F.HostBasics) == {"cxx": CXX[1]}
    assert h.read == ["HostBasics"]  # prepare: once
    h.state.is_executing = True
    factcache.host_fact(h, F.HostBasics)
    h.operation(ran_commands=False)  # a no-op changes nothing
    factcache.host_fact(h, F.HostBasics)
    assert h.read == ["HostBasics"] * 2  # execute: once more (a stage is never read from another)
    h.operation(ran_commands=True)
    h.facts[F.HostBasics] = {"cxx": CXX[2]}  # the operation installed another compiler
    assert factcache.host_fact(h, F.HostBasics) == {"cxx": CXX[2]}
    assert factcache.host_fact(h, F.Releases, root="/opt/voltafleet")["current"] == "a"  # each (fact, arguments) apart
    assert h.read == ["HostBasics"] * 3 + ["Releases"]


def test_a_read_fact_is_a_copy_and_a_fake_host_is_always_read():
    h = RunHost({F.Releases: {"current": "a", "good": None, "releases": {}}})
    factcache.host_fact(h, F.Releases, root="/r")["releases"]["x"] = {}
    assert factcache.host_fact(h, F.Releases, root="/r")["releases"] == {}
    plain = Host({F.HostBasics: {"cxx": None}}, reads=[])  # no run: nothing kept
    plain.get_fact = lambda cls, **kw: plain.reads.append(cls) or {"cxx": None}
    factcache.host_fact(plain, F.HostBasics), factcache.host_fact(plain, F.HostBasics)
    assert len(plain.reads) == 2


# ---------------------------------------------------------------- the cost of a converged host


# bench/controller/scale.py's converged 8-GPU host, per host of a no-op `pyinfra -y deploy.py` (was 42 and 108):
# every operation and every remote command costs the controller CPU on each host of the fleet;
# 26th operation: the memory textfile's plan, service and timer (roles/server, issue 38), one fact read
OPERATIONS, COMMANDS = 26, 41


def test_a_converged_host_costs_at_most_so_many_operations_and_commands(tmp_path):
    """The real deploy.py, inventory loader and group_vars on 3 simulated hosts and a gateway
    (bench/controller/scale.py): nothing changes, every host passes, and the operations and remote
    commands per host stay within the bounds (issue 20: they may not grow back unnoticed)."""
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, "-m", "bench.controller.scale", "--hosts", "3", "--json", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert out.exists(), proc.stdout + proc.stderr
    row = json.loads(out.read_text())[0]
    assert row["rc"] == 0 and row["changed_ops"] == 0 and row["passed"] == 3, proc.stdout + proc.stderr
    assert row["ops_per_host"] <= OPERATIONS, row
    assert row["commands_per_host"] <= COMMANDS, row
    assert row["cross_host_reads"] <= 3 + 1 and row["header_gets"] <= 2, row  # the gateway reads each host's GPUs once
