"""What `python -m rollout --plan` says a batch would change (voltafleet.state.dryrun), decided from
a host's facts the way the roles decide: release, flags, unit, model, driver, restarts."""
import json

import pytest

from voltafleet.state import dryrun
from voltafleet.state.dryrun import HostChange, Observed, flag_diff, fleet_report, host_change, sha1, table
from voltafleet.planning.hostplan import HostFacts, make_plan
from voltafleet.planning.unitfile import render_unit

COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
CXX = "12.2.0 x86_64-linux-gnu"
UP = {"active": "active", "enabled": "enabled"}


@pytest.fixture
def plan(cfg):
    cfg = cfg.replace(voltafleet_backend="cpu", server_instances=2, llama_cpp_targets=["llama-server"], server_threads=1)
    return make_plan("h1", cfg, HostFacts(os="debian-12", systemd=252), None, COMMIT)


def converged(plan, **over) -> Observed:
    """Every fact as a converged host answers it."""
    fp = plan.build.fingerprint(None, CXX)
    verified = {f.dest: {"size": 5, "mtime": 9, "sidecar": [f"{f.sha256} 5 9"]} for f in plan.model_files}
    env = {i.index: {"sha1": sha1(plan.env_file(i.index)), "text": plan.env_file(i.index)} for i in plan.instances}
    base = dict(compiler=True, fingerprint=fp, current=fp, releases=(fp,), env=env,
                unit_sha1=sha1(render_unit(plan.settings, 252)), models=verified, live={0: UP, 1: UP})
    return Observed(**{**base, **over})


def change(plan, **over) -> HostChange:
    return host_change(plan, converged(plan, **over), render_unit(plan.settings, 252))


def test_a_converged_host_would_change_nothing(plan):
    c = change(plan)
    assert (c.flags, c.unit, c.downloads, c.driver, c.restart, c.retire, c.toolchain) == ({}, False, [], None, [], [], [])
    assert c.present and c.current == c.fingerprint and c.instances == 2
    row = dryrun.row(c, 0, ("keep", ""), 3.0)
    assert (row["release"].split()[0], row["flags"], row["model"], row["driver"], row["restart"]) == \
        ("keep", "same", "present", "-", "no")


def test_one_changed_flag_restarts_only_that_instance(plan):
    old = plan.env_file(1).replace("-t 1 ", "-t 2 ")
    assert old != plan.env_file(1)
    c = change(plan, env={**converged(plan).env, 1: {"sha1": sha1(old), "text": old}})
    assert c.flags == {1: ["-t 2 -> 1"]} and c.restart == [1] and c.restart_why == ["flags"]
    assert dryrun.row(c, 0, ("keep", ""), 1.0)["restart"] == "1 of 2 (flags)"


def test_a_new_release_or_model_restarts_every_instance(plan):
    c = change(plan, current="old", releases=("old",))
    assert c.restart == [0, 1] and c.restart_why == ["release"] and not c.present
    c = change(plan, models={}, model_bytes={plan.model_files[0].url: 15_600_000_000})
    assert c.downloads == [{"dest": plan.model_files[0].dest, "bytes": 15_600_000_000}] and c.restart == [0, 1]
    assert dryrun.row(c, 0, ("keep", ""), 1.0)["model"] == "download 15.6 GB"
    # a file whose sidecar does not match its size is not verified: downloaded again
    stale = {plan.model_files[0].dest: {"size": 6, "mtime": 9, "sidecar": [f"{plan.model_files[0].sha256} 5 9"]}}
    assert change(plan, models=stale).downloads


def test_a_unit_change_or_a_stopped_instance(plan):
    assert change(plan, unit_sha1=None).restart == [0, 1]
    c = change(plan, live={0: UP, 1: {"active": "failed", "enabled": "enabled"}, 2: UP})
    assert c.restart == [1] and c.restart_why == ["not running"] and c.retire == [2]


def test_a_missing_env_file_is_a_new_instance(plan):
    c = change(plan, env={0: converged(plan).env[0]}, live={0: UP})
    assert c.flags == {1: ["new instance"]} and c.restart == [1]


def test_driver_changes_restart_everything(plan):
    up = {"reboot": True, "change": True, "current": "580.82.07", "why": "upgrade 580.82.07 -> 580.95.05"}
    c = change(plan, driver=up)
    assert c.driver == "upgrade" and "580.95.05" in c.driver_why and c.restart == [0, 1] and c.driver_managed
    assert change(plan, driver={**up, "current": None}).driver == "install"
    assert change(plan, driver={**up, "change": False}).driver == "reboot"
    same = change(plan, driver={"reboot": False, "change": False, "current": "580.95.05", "why": ""})
    assert same.driver is None and same.restart == [] and dryrun.row(same, 0, None, 1)["driver"] == "same"


def test_a_fresh_host_compiles_after_its_toolchain(plan):
    c = change(plan, compiler=False, fingerprint=None, current=None, releases=(), env={}, unit_sha1=None,
               models={}, live={})
    assert c.toolchain == ["build tools"] and c.fingerprint is None and c.release_key.startswith("pending-")
    assert c.restart == [0, 1] and c.flags == {0: ["new instance"], 1: ["new instance"]}


def test_flag_diff_reads_like_a_change_list():
    old = "# x\nCUDA_VISIBLE_DEVICES=0\nLLAMA_SERVER_ARGS=-m /m.gguf -c 8192 --no-slots -t 8 --cache-ram -1\n"
    new = "# x\nCUDA_VISIBLE_DEVICES=1\nLLAMA_SERVER_ARGS=-m /m.gguf -c 4096 -t 8 --metrics --cache-ram 0\n"
    assert flag_diff(old, new) == ["CUDA_VISIBLE_DEVICES 0 -> 1", "-c 8192 -> 4096", "added --metrics",
                                   "--cache-ram -1 -> 0", "removed --no-slots"]  # in the new argv's order
    assert flag_diff(None, new) == ["new instance"]


def test_records_round_trip_through_json(plan):
    c = change(plan, env={**converged(plan).env, 1: {"sha1": "x", "text": "LLAMA_SERVER_ARGS=-t 4\n"}})
    back = HostChange.from_dict(json.loads(json.dumps(c.to_dict())))
    assert back == c and 1 in back.flags


def test_fleet_report_refusals_problems_and_table(plan):
    base = change(plan)
    fresh = change(plan, current="old", releases=("old",))
    changes = {
        "a": HostChange(**{**base.__dict__, "host": "a"}),
        "b": HostChange(**{**fresh.__dict__, "host": "b"}),
        "c": dryrun.refused("c", ["c: OS debian-11 is not one of debian-12"]),
    }
    report = fleet_report([["a"], ["b", "c"]], changes, cached={fresh.fingerprint}, gateway=True)
    assert not report["ok"] and report["refused"] == {"c": ["c: OS debian-11 is not one of debian-12"]}
    rows = {r["host"]: r for r in report["hosts"]}
    assert rows["b"]["release"].startswith("install") and rows["b"]["restart"] == "2 of 2 (release)"
    assert rows["c"]["refused"] and rows["c"]["seconds"] is None
    text = table(report, canary=["a"])
    assert "REFUSED" in text and "c: refused: OS debian-11" in text and "canary: a:" in text and "total:" in text
    assert fleet_report([["a"], ["b"]], {k: changes[k] for k in "ab"}, cached={fresh.fingerprint})["ok"]
    assert fleet_report([["a", "b"]], {k: changes[k] for k in "ab"})["ok"]  # b packs a's release in the same run
    # a had the release already (it compiled nothing, filled no cache) and ran a batch before b
    late = fleet_report([["a"], ["b"]], {k: changes[k] for k in "ab"})
    assert not late["ok"] and "would be missing" in late["problems"][0] and "cache lacks it" in late["problems"][0]
