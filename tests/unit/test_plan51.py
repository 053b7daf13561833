"""Issue 51 items 2 and 3: the GPU plan (bench/gpu/gpu_proof.py plan51a/b/c) renders v100_32gb's shipped argv
with only the intended flags changed, each config's schedule is seeded and replayable, each carries its
host-memory plan, plan51a's estimated device time fits a session, and the phase resumes where it stopped; its records keep each
repetition's /metrics and span of the server's log."""
import functools
import json
import types

import pytest

from bench.gpu import gpu_proof as g
from bench.gpu.proof import traffic as phase
from bench.traffic.estimate import Server, config_seconds, replay_seconds
from bench.traffic.model import params_from, schedule


@functools.lru_cache(maxsize=None)
def plan():
    return g.plan51()["traffic51"]


def configs(part=None):
    return [c for c in plan()["configs"] if part is None or c["part"] == part]


def flag_diff(a: list, b: list) -> dict:
    """{flag: (value in a, value in b)} of two llama-server argvs (a flag's value: the next word, or True)."""
    def parse(argv):
        out, i = {}, 0
        while i < len(argv):
            if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                out[argv[i]] = argv[i + 1]
                i += 2
            else:
                out[argv[i]] = True
                i += 1
        return out
    pa, pb = parse(a), parse(b)
    return {k: (pa.get(k), pb.get(k)) for k in pa.keys() | pb.keys() if pa.get(k) != pb.get(k)}


def test_build_runs_and_phase():
    assert plan()["build"] == "mmq" and plan()["runs"] == 3
    parts = [c["part"] for c in configs()]  # 51a, 51b, then 51d (session 5, HEAP51 shipped), then 51c
    assert [p for i, p in enumerate(parts) if i == 0 or parts[i - 1] != p] == ["51a", "51b", "51d", "51c"]
    assert len({c["name"] for c in configs()}) == len(configs())


def test_shipped_argv_with_only_checkpoints_and_cache_changed():
    shipped = g.render("v100_32gb")
    assert "--ctx-checkpoints" in shipped and shipped[shipped.index("--ctx-checkpoints") + 1] == "4"
    assert shipped[shipped.index("--cache-ram") + 1] == "0"
    for c in configs():
        if c["kind"] != "traffic":
            continue
        want = {}
        if c["ckpt"] != 4:
            want["--ctx-checkpoints"] = ("4", str(c["ckpt"]))
        if c["cache_ram_mib"]:
            want["--cache-ram"] = ("0", str(c["cache_ram_mib"]))
        if not c["idle_slots"]:
            want[g.NO_IDLE_SAVES] = (None, True)
            assert "-noidle" in c["name"] and c["cache_ram_mib"]  # it changes nothing without a cache
        assert flag_diff(shipped, c["args"]) == want, c["name"]
    ship = next(c for c in configs() if c["name"] == "2x-ck4-cr0")
    assert ship["args"] == shipped and ship["part"] == "51a"


def test_item3_pairs_the_shipped_argv_and_the_seed_in_one_session():
    b = {c["name"]: c for c in configs("51b")}
    assert b["thr-ship"]["args"] == g.render("v100_32gb") and b["thr-seed"]["args"] == g.SEED_STAGE3
    assert b["thr-seed"]["args"] == g.run_plan()["serve"][1]["args"]  # the seed of every earlier ratio
    for c in (b["thr-ship"], b["thr-seed"]):
        assert c["kind"] == "rounds" and c["streams"] == 16 and c["shapes"] == [[128, 128], [160, 256]]
    assert flag_diff(g.render("v100_32gb"), b["thr-ship-ck0"]["args"]) == {"--ctx-checkpoints": ("4", "0")}
    c = {x["name"]: x for x in configs("51c")}
    ub = c["thr-ship-ub1024"]
    assert flag_diff(g.render("v100_32gb"), ub["args"]) == {"-ub": (None, "1024")}
    # -ub 1024 in one run with the seed before it and the shipped argv after it: both its ratios in one run
    names = [x["name"] for x in configs("51c")]
    assert names[names.index("thr-ship-ub1024") - 1:][:3] == ["thr-seed-51c", "thr-ship-ub1024", "thr-ship-51c"]
    assert c["thr-seed-51c"]["args"] == g.SEED_STAGE3 and c["thr-ship-51c"]["args"] == g.render("v100_32gb")
    assert ub["env"] == c["thr-ship-51c"]["env"] == g.HEAP51


def test_the_full_matrix_is_planned_once_or_pruned_with_a_reason():
    """Every cell of 0/4/8 checkpoints x 0/4/8/16 GiB x 1x/2x/4x is planned or pruned (gpu_proof.PRUNED51, each
    reason checked against the records by tests/unit/test_records51f.py), never both."""
    cells = {(c["per_slot"], c["ckpt"], c["cache_ram_mib"] // 1024) for c in configs() if c["kind"] == "traffic"}
    full = {(n, ck, gib) for n in (1, 2, 4) for ck in (0, 4, 8) for gib in (0, 4, 8, 16)}
    assert cells | set(g.PRUNED51) == full and not cells & set(g.PRUNED51)
    assert len(cells) == 16 and len(g.PRUNED51) == 20 and all(why.strip() for why in g.PRUNED51.values())
    assert not any(gib == 0 for _, _, gib in g.PRUNED51)  # every checkpoint count runs without a cache somewhere
    assert {(n, ck) for n, ck, gib in cells if gib == 0} == {(n, ck) for n in (1, 2, 4) for ck in (0, 4, 8)}
    traffic = [c for c in configs() if c["kind"] == "traffic"]
    assert len(traffic) == 16 + 6 + 4
    # cells run again (51c): 1x shipped (-again: the checkpoints' heap share's second run), the shipped config and the
    # 16 GiB cache at 2x paired in one run (-pair), and 4x with the 4 GiB cache (-again: the cache's heap floor's second
    # run, last), each with its first run's argv and environment
    again = {c["name"]: c for c in traffic if c["name"].endswith(("-again", "-pair")) and c["part"] == "51c"}
    assert list(again) == ["2x-ck4-cr0-heap-pair", "2x-ck4-cr16-noidle-heap-pair", "1x-ck4-cr0-heap-again",
                           "4x-ck4-cr4-noidle-heap-again"]
    assert traffic[-1]["name"] == "4x-ck4-cr4-noidle-heap-again"
    first = {c["name"]: c for c in traffic}
    for name, c in again.items():
        twin = first[name.rsplit("-", 1)[0]]
        assert (c["args"], c["env"], c["traffic"]) == (twin["args"], twin["env"], twin["traffic"]), name
    noidle = [c for c in traffic if not c["idle_slots"]]
    assert [c["name"] for c in noidle][:2] == ["2x-ck4-cr8-noidle", "2x-ck4-cr8-noidle-heap"]
    # from session 6 (51c) every cache runs without its idle-slot saves, and no config without a cache is -noidle
    assert all(c["cache_ram_mib"] for c in noidle)
    assert all(not c["idle_slots"] for c in configs("51c") if c["kind"] == "traffic" and c["cache_ram_mib"])
    assert [c["name"] for c in configs("51c")][:6] == ["4x-ck4-cr0-heap", "4x-ck4-cr8-noidle-heap", "thr-seed-51c",
                                                       "thr-ship-ub1024", "thr-ship-51c", "2x-ck0-cr8-noidle-heap"]
    # 2x shipped again beside it with HEAP51 (heap51): one run holds both sides of that pair
    assert [(c["name"], c.get("env")) for c in traffic if c["name"].startswith("2x-ck4-cr0-")] == \
        [("2x-ck4-cr0-again", None), ("2x-ck4-cr0-heap", g.HEAP51), ("2x-ck4-cr0-base4", None),
         ("2x-ck4-cr0-ship", g.HEAP51), ("2x-ck4-cr0-heap-pair", g.HEAP51)]
    # session 4's baseline beside the heap config that session 3 cut short (heap51b): the same argv
    pair = [c for c in traffic if c["name"] in ("2x-ck4-cr0-heap", "2x-ck4-cr0-base4")]
    assert pair[0]["args"] == pair[1]["args"] and [c["name"] for c in g.heap51b()] == ["2x-ck4-cr0-base4"]
    # session 5 (heap51d): HEAP51 ships (server_malloc_heap), so the shipped config runs again with it beside the
    # rest of item 2, every later config with it too; the argv is the shipped one, only the environment differs
    d = [c["name"] for c in configs("51d")]
    assert d == ["2x-ck4-cr0-ship", "2x-ck4-cr8-noidle-heap", "2x-ck8-cr0-heap", "1x-ck4-cr0-heap"]
    ship = configs("51d")[0]
    assert ship["args"] == g.render("v100_32gb") and ship["env"] == g.HEAP51
    assert all(c.get("env") == g.HEAP51 for c in configs("51c") if c["name"] != "thr-seed-51c")
    assert "env" not in next(c for c in configs("51c") if c["name"] == "thr-seed-51c")  # the seed's, as it ran before
    assert all(c["name"].endswith(("-heap", "-heap-again", "-heap-pair")) for c in configs("51c") if c["kind"] == "traffic")
    a = [(c["per_slot"], c["ckpt"], c["cache_ram_mib"]) for c in configs("51a")]
    assert a == [(2, 4, 0), (2, 4, 8192)]  # session 1 as it ran: 2x, cache 0 vs 8 GiB
    b = [c["name"] for c in configs("51b")]  # session 2: item 3 first, then 2x without checkpoints
    assert b[:4] == ["thr-ship", "thr-seed", "thr-ship-ck0", "2x-ck0-cr0"]


@pytest.mark.parametrize("per_slot, population", [(1, 16), (2, 32), (4, 64)])
def test_conversations_are_16_32_64(per_slot, population):
    for c in configs():
        if c["kind"] == "traffic" and c["per_slot"] == per_slot:
            p = params_from(c["traffic"])
            assert p.slots == 16 and p.population == population and p.total == population
            assert len(schedule(p).conversations) == population


def test_each_schedule_is_seeded_and_replayable():
    seen = {}
    for c in configs():
        if c["kind"] != "traffic":
            continue
        p = params_from(json.loads(json.dumps(c["traffic"])))  # as plan.json carries it
        a, b = schedule(p), schedule(params_from(c["traffic"]))
        assert a.fingerprint() == b.fingerprint() and p.seed == 51 and p.turn_s == g.TURN51_S and p.busy == 0.8
        # every config of one population replays the same traffic: the flags are all that differ
        assert seen.setdefault(c["per_slot"], a.fingerprint()) == a.fingerprint()
    assert len(set(seen.values())) == 3


def test_each_config_carries_its_host_memory_plan():
    for c in configs():
        if c["name"].startswith("thr-seed"):
            assert "memory_max_mib" not in c  # not a voltafleet argv: no plan to hold it to
            continue
        cfg = g.v32_traffic(c.get("ckpt", 4), c.get("cache_ram_mib", 0), server_malloc_heap=c.get("env") == g.HEAP51)
        if c["kind"] == "traffic":
            hp = g.host_plan_of(cfg)
            assert c["planned_mib"] == round(hp.instance.total / 2**20, 1)
            assert c["memory_max_mib"] == -(-hp.memory_max // 2**20)
        assert c["planned_mib"] < c["memory_max_mib"]
    by = {c["name"]: c for c in configs()}
    # the cache is planned whole: 8 GiB over the same checkpoints
    assert by["2x-ck4-cr8"]["planned_held_mib"] - by["2x-ck4-cr0"]["planned_held_mib"] == pytest.approx(8192 * 1.002, abs=2)


def test_plan51a_fits_a_session_and_the_estimates_are_the_simulations():
    a = configs("51a")
    assert sum(c["estimate_s"] for c in a) <= g.SESSION51_S == 22 * 60
    b = configs("51b")
    upto = [c["name"] for c in b].index("2x-ck0-cr0") + 1  # what session 2 held (it ran them): the rest waits
    assert sum(c["estimate_s"] for c in b[:upto]) <= g.SESSION51_S < sum(c["estimate_s"] for c in b)
    heap = g.heap51()  # session 3's first: both sides of each heap pair in one session
    assert [c["name"] for c in b[upto:upto + len(heap)]] == [c["name"] for c in heap]
    assert sum(c["estimate_s"] for c in heap) <= g.SESSION51_S
    for c in a:
        server = Server(16, c["ckpt"], c["cache_ram_mib"])
        assert c["estimate_s"] == round(config_seconds(params_from(c["traffic"]), server, 3))
    # the docstring's figures are these
    for c in a:
        assert f"{c['name']}" in g.plan51a.__doc__ and f"{c['estimate_s']} s" in g.plan51a.__doc__
    assert f"{sum(c['estimate_s'] for c in a):,} s" in g.plan51a.__doc__


def test_estimate_reuses_with_checkpoints_and_reprocesses_without():
    p = params_from(configs("51a")[0]["traffic"])
    s = schedule(p)
    ck4, ck0 = replay_seconds(s, Server(16, 4, 0)), replay_seconds(s, Server(16, 0, 0))
    assert ck0["followup_cached_share"] == 0 and ck4["followup_cached_share"] > 0.1
    assert ck4["requests"] == ck0["requests"] == sum(len(c.turns) for c in s.conversations)


class FakeRun:
    def __init__(self, plan, results):
        self.plan, self.results, self.saved = plan, results, 0
        self.a = types.SimpleNamespace(models="/m")

    def save(self):
        self.saved += 1


def test_phase_skips_configs_already_complete(monkeypatch):
    monkeypatch.delenv("TRAFFIC51_ONLY", raising=False)
    items = [{"name": "x", "args": ["-a"], "traffic": {}}, {"name": "y", "args": ["-b"], "traffic": {}}]
    results = {"traffic51": [{"name": "x", "plan_args": ["-a"], "complete": True},
                             {"name": "y", "plan_args": ["-b"], "complete": False}]}
    run = FakeRun({"traffic51": {"build": "mmq", "runs": 3, "configs": items}}, results)
    started = []

    class Boom(Exception):
        pass

    def server(build, name, args, model=None, cgroup=None, env=None):
        started.append(name)
        raise Boom
    run.server = server
    with pytest.raises(Boom):
        phase.traffic(run, "mmq")
    assert started == ["y"]  # x was complete; y's partial record does not count
    assert phase.done(results["traffic51"], items[0]) and not phase.done(results["traffic51"], items[1])
    assert not phase.done(results["traffic51"], {**items[0], "args": ["-c"]})  # another argv: run again


def test_phase_runs_only_the_configs_named(monkeypatch, capsys):
    """TRAFFIC51_ONLY: the named configs alone (blanks aside), in the plan's order, one already complete still
    skipped as done; a name the plan lacks stops the phase before any server starts."""
    items = [{"name": n, "args": [f"-{n}"], "traffic": {}} for n in ("w", "x", "y", "z")]
    results = {"traffic51": [{"name": "w", "plan_args": ["-w"], "complete": True}]}
    run = FakeRun({"traffic51": {"build": "mmq", "runs": 3, "configs": items}}, results)
    started = []

    def server(build, name, args, model=None, cgroup=None, env=None):  # a server that failed its start
        started.append(name)
        return types.SimpleNamespace(ok=False, args=args, load_s=0, logf=f"/tmp/{name}.log", stop=lambda: None,
                                     p=types.SimpleNamespace(poll=lambda: 1))
    run.server, run.loglines = server, lambda s: []
    monkeypatch.setenv("TRAFFIC51_ONLY", " z, x,w ")
    phase.traffic(run, "mmq")
    assert started == ["x", "z"] and [r["name"] for r in run.results["traffic51"]] == ["w", "x", "z"]
    said = capsys.readouterr().out
    assert "w done in an earlier call: skipped" in said and "y not in TRAFFIC51_ONLY: skipped" in said
    monkeypatch.setenv("TRAFFIC51_ONLY", "x,v")
    with pytest.raises(SystemExit, match="TRAFFIC51_ONLY names no config of the plan: v"):
        phase.traffic(run, "mmq")
    assert started == ["x", "z"]


def test_gpu_proof_sh_checks_traffic51_only_before_the_build(tmp_path):
    """gpu_proof.sh's check (before the build, so a misspelt name costs no device time): its own python3 line, on a
    plan, with the names set and not."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    sh = (repo / "bench/gpu/gpu_proof.sh").read_text()
    code = re.search(r"TRAFFIC51_ONLY:-.*\n\s*why=\$\(PYTHONPATH=\$W python3 -c '([^']+)'", sh).group(1)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"traffic51": {"configs": [{"name": "a"}, {"name": "b"}]}}))

    def check(names):
        env = {**os.environ, "PYTHONPATH": str(repo), "TRAFFIC51_ONLY": names}
        return subprocess.run([sys.executable, "-c", code, str(plan)], env=env, capture_output=True, text=True)
    assert check("b,a").returncode == 0
    bad = check("a,c")
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1] == "TRAFFIC51_ONLY names no config of the plan: c"
