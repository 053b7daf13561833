"""voltafleet's own facts and operations, in process (tests/ops/fakes.py): the commands a
fact runs and how it parses their output; the commands an operation yields for given facts."""
import dataclasses
import pytest
from pyinfra.api import OperationError

from roles import facts as F
from roles.llama_cpp import compiled
from roles.model import fetched
from roles.server import flags_accepted, release_switched, retired
from roles.activation import activated
from roles.smoke import Judge
from pyinfra.context import ctx_host, ctx_inventory, ctx_state

from tests.ops.fakes import FakeHost, FakeInventory, FakeOp, commands
from voltafleet.planning.hostplan import HostFacts, make_plan

COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
CXX = "12.2.0 x86_64-linux-gnu"


# ---------------------------------------------------------------- facts


def test_paths_in_fact_commands_are_quoted():
    assert "p='/var/lib/my models'" in F.FreeDisk().command(path="/var/lib/my models")
    assert "'/x/a b.gguf'" in F.FileState().command(path="/x/a b.gguf", sidecar="/x/a b.gguf.verified")
    assert "if [ -x '/o p/llama-server' ]" in F.HelpText().command(binary="/o p/llama-server")
    assert "cd '/opt/$(id)'" in F.Releases().command(root="/opt/$(id)")


def test_releases_fact_parses_current_good_and_build_info():
    out = F.Releases().process(["current=aaa", "good=", 'release=aaa 1700000000 {"commit": "c1"}'])
    assert out == {"current": "aaa", "good": None,
                   "releases": {"aaa": {"mtime": 1700000000.0, "info": {"commit": "c1"}}}}


def test_file_state_and_server_instances_and_holds():
    assert F.FileState().process(["stat=10 100", "side=abc 10 100"]) == {"size": 10, "mtime": 100,
                                                                         "sidecar": ["abc 10 100"]}
    assert F.FileState().process([]) is None
    assert F.ServerInstances().process(["0 active enabled", "1 failed", "x"]) == {
        0: {"active": "active", "enabled": "enabled"}, 1: {"active": "failed", "enabled": "unknown"}}


def test_gpus_fall_back_to_the_pci_bus_without_a_driver():
    lines = ["pci: 0000:06:00.0 3D controller [0302]: NVIDIA Corporation GV100GL [Tesla V100 SXM2 32GB] [10de:1db5] (rev a1)"]
    gpus = F.Gpus().process(lines)
    assert gpus[0]["name"] == "Tesla V100-SXM2-32GB" and gpus[0]["memory_mib"] == 32768 and gpus[0]["pci_only"]
    assert F.Gpus().process(["0, Tesla V100-SXM2-16GB, 7.0, 16384, 580.95.05"])[0]["driver_version"] == "580.95.05"


def test_help_text_missing_binary():
    assert F.HelpText().process(["__voltafleet_missing__"]) is None


# ---------------------------------------------------------------- operations


@pytest.fixture
def plan(cfg):
    cfg = cfg.replace(voltafleet_backend="cpu", server_instances=2, llama_cpp_targets=["llama-server"], llama_cpp_keep_releases=3)
    return make_plan("gpu-01", cfg, HostFacts(os="debian-12", systemd=252), None, COMMIT)


def host_with(facts=None):
    base = {F.HostBasics: {"os": "debian-12", "cxx": CXX, "cpus": 2, "mem_mib": 1, "systemd": 252},
            F.Releases: {"current": None, "good": None, "releases": {}}, F.ServerInstances: {}}
    return FakeHost({**base, **(facts or {})})


def test_compile_runs_the_build_script_with_quoted_arguments(plan):
    cmds = commands(compiled, host_with(), plan, strategy="per_host")
    assert len(cmds) == 2 and cmds[1] == "<function _built>"  # then its record (build-<host>.json)
    assert cmds[0].startswith("/opt/voltafleet/bin/vf-build-release /opt/voltafleet ")
    assert " git://" not in cmds[0] and f" {COMMIT} auto - " in cmds[0]
    assert "'{\"fingerprint\"" in cmds[0]  # the JSON build info is one quoted argument
    assert cmds[0].endswith("-DGGML_NATIVE=OFF")


def test_compile_skips_a_release_the_host_has(plan):
    fp = plan.build.fingerprint(None, CXX)
    fake = host_with({F.Releases: {"current": fp, "good": fp, "releases": {fp: {"mtime": 1, "info": {}}}}})
    assert commands(compiled, fake, plan, strategy="per_host") == []


def test_model_fetch_only_when_not_verified():
    args = dict(fetcher="/opt/voltafleet/bin/vf-fetch-model", url="http://m/a b.gguf", dest="/m/a.gguf", sha256="c" * 64)
    assert commands(fetched, FakeHost({F.FileState: None}), **args) == [
        f"/opt/voltafleet/bin/vf-fetch-model 'http://m/a b.gguf' /m/a.gguf {'c' * 64}", "<function _downloaded>"]
    ok = {"size": 5, "mtime": 9, "sidecar": [f"{'c' * 64} 5 9"]}
    assert commands(fetched, FakeHost({F.FileState: ok}), **args) == []


def test_switch_points_current_at_the_release_and_prunes_beyond_keep(plan):
    fp = plan.build.fingerprint(None, CXX)
    old = {f"old{i}": {"mtime": i, "info": {}} for i in range(7)}
    fake = host_with({F.Releases: {"current": "old6", "good": "old0", "releases": old}})
    cmds = commands(release_switched, fake, plan)
    assert cmds[0] == f"/opt/voltafleet/bin/vf-atomic link /opt/voltafleet/current releases/{fp}"
    # keep 3 besides the new one, current (old6) and good (old0): old5, old4, old3
    assert cmds[1] == "/opt/voltafleet/bin/vf-release prune /opt/voltafleet old2 old1"
    fake.facts[F.Releases]["current"] = fp
    assert commands(release_switched, fake, plan) == []


def test_flags_refused_before_any_restart(plan, help_text):
    fake = host_with({F.HelpText: help_text})
    assert commands(flags_accepted, fake, plan) == []
    plan.argv[0].append("--draft-max")
    with pytest.raises(OperationError, match="--draft-max: the pinned llama-server says"):
        commands(flags_accepted, fake, plan)


def test_missing_release_at_execution_is_an_error_not_a_switch(plan):
    fake = host_with({F.HelpText: None})
    with pytest.raises(OperationError, match="release .* is missing"):
        commands(flags_accepted, fake, plan)


UP = {"active": "active", "enabled": "enabled"}


def activation(fake, plan, envs, everything, monkeypatch):
    """The instances the activation role restarts (drained, judged, rolled back on failure), or
    None when it only probes a converged host (whose outcome record it writes)."""
    import roles.activation as act

    written = []
    monkeypatch.setattr(act, "record", lambda cfg, name, status, reason="", **kw: written.append(status))
    with ctx_host.use(fake), ctx_state.use(fake.state), ctx_inventory.use(FakeInventory()):
        cmds = list(activated._inner(plan, env_ops=envs, everything_ops=everything, judge=Judge(plan)))
    todo = [c.args[1] for c in cmds if getattr(c, "function", None) is act._activate]
    return todo[0] if todo else (None, written)


def test_restart_only_changed_instances(plan, monkeypatch):
    plan = dataclasses.replace(plan, settings=plan.settings.replace(smoke_probe=False))
    fake = host_with({F.ServerInstances: {0: UP, 1: UP}})
    envs = {0: FakeOp(False), 1: FakeOp(True)}
    assert activation(fake, plan, envs, [FakeOp(False)], monkeypatch) == [1]
    assert activation(fake, plan, envs, [FakeOp(True)], monkeypatch) == [0, 1]
    none = {0: FakeOp(False), 1: FakeOp(False)}
    # converged: nothing restarts, the host's record says passed (probed when smoke_probe is on)
    assert activation(fake, plan, none, [FakeOp(False)], monkeypatch) == (None, ["passed"])
    down = host_with({F.ServerInstances: {0: UP, 1: {"active": "failed", "enabled": "enabled"}}})
    assert activation(down, plan, none, [FakeOp(False)], monkeypatch) == [1]


def test_prepare_phase_uses_will_change(plan, monkeypatch):
    fake = host_with({F.ServerInstances: {0: UP, 1: UP}})
    envs = {0: FakeOp(True, complete=False), 1: FakeOp(False, complete=False)}
    assert activation(fake, plan, envs, [], monkeypatch) == [0]


def test_retired_instance_is_disabled_and_its_env_removed(plan):
    fake = host_with({F.ServerInstances: {0: UP, 1: UP, 2: UP}})
    assert commands(retired, fake, plan) == [
        "systemctl disable --now llama-server@2.service; rm -f /etc/voltafleet/llama-server/2.env"]


def test_default_keeps_only_current_and_last_good(cfg):
    """group_vars' default: nothing beyond what rollback needs."""
    cfg = cfg.replace(voltafleet_backend="cpu", server_instances=1, llama_cpp_targets=["llama-server"], llama_cpp_keep_releases=0)
    plan = make_plan("gpu-01", cfg, HostFacts(os="debian-12"), None, COMMIT)
    old = {f"old{i}": {"mtime": i, "info": {}} for i in range(4)}
    fake = host_with({F.Releases: {"current": "old3", "good": "old1", "releases": old}})
    assert commands(release_switched, fake, plan)[1] == "/opt/voltafleet/bin/vf-release prune /opt/voltafleet old2 old0"


def test_shared_release_in_the_controller_cache_is_shipped_not_compiled(plan, tmp_path, monkeypatch):
    """A later batch of a rolling rollout: no host of this run has the release, the cache does."""
    import roles.llama_cpp as lc
    from roles.llama_cpp import shipped

    fp = plan.build.fingerprint(None, CXX)
    monkeypatch.setattr(lc, "RELEASE_CACHE", tmp_path)
    monkeypatch.setattr(lc, "builder_of", lambda fp: "gpu-01")  # this host would be the builder
    fake = host_with()
    assert len(commands(compiled, fake, plan, strategy="shared")) == 3  # compile, its record, then cache the archive
    assert commands(shipped, fake, plan) == []
    (tmp_path / f"{fp}.tar.gz").write_bytes(b"x")
    (tmp_path / f"{fp}.tar.sha256").write_text("y\n")
    assert commands(compiled, fake, plan, strategy="shared") == []
    assert commands(shipped, fake, plan) == ["<function _installed>"]


def test_a_toolkit_upgrade_changes_the_fingerprint_and_a_driver_upgrade_does_not(cfg):
    """roles.factcache.host_fingerprint itself, from a CUDA host's live facts: the driver
    version is among them, and must not be an input."""
    from roles.factcache import host_fingerprint

    cfg = cfg.replace(voltafleet_backend="cuda", llama_cpp_ref=COMMIT, cuda_toolkit_version="12.8")

    def fp(driver, nvcc, cxx=CXX, name="gpu-01"):
        gpus = [{"index": i, "name": "Tesla V100-SXM2-16GB", "compute_cap": "7.0", "memory_mib": 16160,
                 "driver_version": driver} for i in range(8)]
        fake = FakeHost({F.HostBasics: {"cxx": cxx}, F.Gpus: gpus, F.NvccVersion: nvcc}, name=name, data=cfg.flat())
        with ctx_host.use(fake), ctx_state.use(fake.state), ctx_inventory.use(FakeInventory()):
            return host_fingerprint(fake)

    before = fp("580.82.07", "12.8.93")
    assert fp("580.95.05", "12.8.93") == before              # driver only: no rebuild
    assert fp("580.82.07", "12.8.61") != before              # the toolkit is an input
    assert fp("580.82.07", "12.8.93", cxx="13.2.0") != before  # so is the compiler
    assert len({fp("580.95.05", "12.8.93", name=f"gpu-{n:02d}") for n in range(8)}) == 1  # identical hosts share it


class Quiet(FakeHost):
    def noop(self, description):
        pass


@pytest.mark.parametrize("account,users,groups", [
    (None, {}, []),  # a fresh host: groupadd, then useradd
    ({"group": True, "home": "/nonexistent", "shell": "/bin/bash", "primary": "llama"},
     {"llama": {"home": "/nonexistent", "shell": "/bin/bash", "group": "llama", "groups": []}}, ["llama"]),
    ({"group": False, "home": "/nonexistent", "shell": "/usr/sbin/nologin", "primary": "nogroup"},
     {"llama": {"home": "/nonexistent", "shell": "/usr/sbin/nologin", "group": "nogroup", "groups": []}}, []),
], ids=["fresh", "another shell", "no group"])
def test_service_account_is_pyinfras_group_and_user_where_it_is_not_in_place(account, users, groups):
    """server.group then server.user (their own code, facts and commands) unless the one fact
    (ServiceAccount) shows both as wanted: then nothing, and nothing else read."""
    from pyinfra.facts.server import Groups, Os, Users, Which
    from pyinfra.operations import server as server_ops

    from roles.server import service_account

    facts = {F.ServiceAccount: account or F.ServiceAccount.default(), Groups: groups, Os: "Linux", Users: users,
             Which: "/usr/sbin/x"}
    theirs = commands(server_ops.group, Quiet(facts), group="llama", system=True) + commands(
        server_ops.user, Quiet(facts), user="llama", group="llama", system=True, shell="/usr/sbin/nologin",
        home="/nonexistent", create_home=False, ensure_home=False)
    assert theirs and commands(service_account, Quiet(facts), user="llama") == theirs
    in_place = Quiet({F.ServiceAccount: {"group": True, "home": "/nonexistent", "shell": "/usr/sbin/nologin",
                                         "primary": "llama"}})
    assert commands(service_account, in_place, user="llama") == []  # Groups, Users, Os never read: no such fact here
