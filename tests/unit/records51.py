"""The fixtures a test of one issue-51 GPU call's records takes: its results.json, its servers' whole logs
(logs.tgz) and item 3's rounds against a seed of the same run. `results, logs, rounds = call_fixtures(CALL)` at a
test module's top makes them that module's fixtures (and `plan_now = plan_fixture()` today's plan of them)."""
from pathlib import Path

import pytest

from bench.traffic import analyze

REPO = Path(__file__).resolve().parents[2]
RECORDS51 = REPO / "bench/records/proof51"


def results_of(call: Path) -> dict:
    """A call's results.json, its gzip'd copy, or as a later call's results hold it (analyze.raw)."""
    return analyze.call_results(call)


def config_named(results: dict, name: str) -> dict:
    """The traffic config's record that stands for `name`: a config run again from its start beside an earlier
    partial record of it is its complete one (analyze.configs keeps that)."""
    return next(c for c in analyze.configs(results) if c["name"] == name)


def heap51_configs(results: dict) -> list[dict]:
    """The traffic configs that ran with glibc's malloc kept to its heap (HEAP51, as server_malloc_heap ships it)."""
    from voltafleet.planning import flags

    return [c for c in analyze.configs(results) if c.get("kind") == "traffic" and c.get("env") == flags.MALLOC_HEAP]


def unreclaimable(c: dict) -> float:
    """The highest of the repetitions' peaks: the cgroup's charge less its page cache (what the plan's held counts)."""
    return max(r["peak"]["cgroup"]["cg_unreclaimable"] for r in c["reps"])


def call_fixtures(call: Path, seed: str = "thr-seed"):
    @pytest.fixture(scope="module")
    def results():
        return results_of(call)

    @pytest.fixture(scope="module")
    def logs():
        return analyze.logs_of(str(call / "logs.tgz"))

    @pytest.fixture(scope="module")
    def rounds(results):
        return analyze.rounds(results, seed=seed)

    return results, logs, rounds


def plan_fixture():
    @pytest.fixture(scope="module")
    def plan_now():
        """Issue 51's configs as the next session runs them (b11434), each with the host plan of today's code:
        {name: config}."""
        from bench.gpu import pin_proof

        return {c["name"]: c for c in pin_proof.plan51_new()["traffic51"]["configs"]}

    return plan_now


def matrix_left(plan_now: dict, left: list) -> tuple:
    """The matrix's cells (per-slot conversations, checkpoints, cache GiB) of today's plan: how many, and those no
    config outside `left` (the configs still to run) has run (a config added later, ADDED51, repeats a cell and is
    not counted)."""
    def cell(c):
        return c["per_slot"], c["ckpt"], c["cache_ram_mib"] // 1024
    traffic = {n: c for n, c in plan_now.items() if c["kind"] == "traffic"}
    cells = {cell(c) for c in traffic.values()}
    return len(cells), cells - {cell(c) for n, c in traffic.items() if n not in left and n not in ADDED51}


def assert_built(session: Path, gpu: str, build_s: int, volta_s: int, mmq_s: int,
                 calls: tuple = ("call1", "call2", "call3"), driver: str = "580.159.04") -> None:
    """One machine, one build, for every call of a session: the GPU and driver its facts name, the pin's build, Volta's
    kernel choice and FORCE_MMQ in the seconds each took."""
    for call in calls:
        facts = (session / call / "facts.txt").read_text()
        assert gpu in facts and driver in facts, call
        assert f"build rc=0 seconds={build_s}" in (session / call / "build.txt").read_text(), call
    last = session / calls[-1]
    assert f"volta rc=0 seconds={volta_s}" in (last / "build-volta.txt").read_text()
    assert f"mmq rc=0 seconds={mmq_s}" in (last / "build-mmq.txt").read_text()


def figures(results: dict, names) -> dict:
    """{config: (complete, repetitions, follow-ups' cached share, follow-up TTFT p50 and p99 ms, opening TTFT p50 ms,
    tok/s, prompt tokens processed, host RSS peak MiB)}, rounded as bench/RESULTS.md quotes them."""
    rows = {r["name"]: r for r in analyze.table(results)}
    return {n: (rows[n]["complete"], rows[n]["reps"], rows[n]["followup_cached_share"],
                round(rows[n]["followup_ttft_p50_ms"]), round(rows[n]["followup_ttft_p99_ms"]),
                round(rows[n]["opening_ttft_p50_ms"]), round(rows[n]["aggregate_tps"], 1), rows[n]["processed"],
                round(rows[n]["rss_peak_mib"]))
            for n in names}


def assert_figures(results: dict, expected: dict, generated: tuple) -> None:
    """Each config of `expected` has its figures (figures()), and each after the first replayed the first's schedules
    and generated the same tokens on each (`generated`)."""
    names = tuple(expected)
    assert figures(results, names) == expected
    assert_same_schedules(results, names[0], names[1:], generated)


def assert_same_schedules(results: dict, base: str, names, generated: tuple) -> None:
    """Each config of `names` replayed `base`'s schedules (paired by fingerprint, in base's order) and generated the
    same tokens on each: `generated`, base's per schedule."""
    fps = [r["fingerprint"] for r in config_named(results, base)["reps"]]
    for n in names:
        assert analyze.paired(results, base, n, "generated") == [(fp, g, g) for fp, g in zip(fps, generated)], n


def beside(results: dict, a: str, b: str, field: str, nd: int = 0) -> list:
    """Config `a`'s and `b`'s `field`, schedule by schedule (paired by fingerprint, in a's order), each rounded to `nd`
    places (0: an int): two runs' figures set beside each other, not divided."""
    def r(x):
        return round(x, nd) if nd else round(x)
    return [(r(x), r(y)) for _, x, y in analyze.paired(results, a, b, field)]


def spared(results: dict, a: str, b: str) -> list:
    """Prompt tokens config `a` processed beyond config `b`, schedule by schedule (paired by fingerprint)."""
    return [x - y for _, x, y in analyze.paired(results, a, b, "processed")]


def v100_s(tokens) -> tuple:
    """The (least, most) seconds of a V100's prefill those per-schedule tokens take (analyze.v100_prefill_s, of each
    one's size), rounded."""
    secs = [analyze.v100_prefill_s(abs(d)) for d in tokens]
    return round(min(lo for lo, _ in secs)), round(max(hi for _, hi in secs))


def assert_rows_quoted(text: str, results: dict, names) -> None:
    """Each config's row of a RESULTS table (found by its `(`name`) |` cell, bold marks aside) holds its figures."""
    rows = {r["name"]: r for r in analyze.table(results)}
    for n in names:
        r = rows[n]
        row = text[text.index(f"(`{n}`) |"):].split(" | |")[0].replace("**", "")
        cells = (f"| {r['followup_cached_share']:.2f} |",
                 f"{r['followup_ttft_p50_ms']:,.0f} / {r['followup_ttft_p99_ms']:,.0f} |",
                 f"| {r['opening_ttft_p50_ms']:,.0f} |", f"| {r['aggregate_tps']:.1f} |", f"| {r['processed']:,} |",
                 f"| {r['rss_peak_mib']:,.0f}")
        assert all(c in row for c in cells), (n, row)


def plan_at_share(config: dict, share: float, cache_share: float | None = None, floor: int = 0) -> dict:
    """The host plan today's code makes for a HEAP51 traffic config's argv (its checkpoints, host cache and idle-slot
    saves, at b11434) with hostmem_heap_share `share` of the checkpoints and hostmem_cache_heap_share `cache_share` of
    the prompt cache (None: `share`, one share of both as sessions 5-7 planned it), and hostmem_cache_heap_floor_mib
    `floor` (0: none, as the plans before session 12 had none): a session's decision was made on the shares of its day
    (0.06 for sessions 5-6, 0.07 for 7), which a later session's records may change.
    gpu_proof.plan_figures, as the config recorded it."""
    from bench.gpu import gpu_proof, pin_proof

    args = config["args"]
    ckpt = int(args[args.index("--ctx-checkpoints") + 1])
    cache = int(args[args.index("--cache-ram") + 1]) if "--cache-ram" in args else 0
    noidle = {"server_extra_flags": [gpu_proof.NO_IDLE_SAVES]} if gpu_proof.NO_IDLE_SAVES in args else {}
    cfg = gpu_proof.v32_traffic(ckpt, cache, pin_proof.NEW_COMMIT, server_malloc_heap=True, hostmem_heap_share=share,
                                hostmem_cache_heap_share=share if cache_share is None else cache_share,
                                hostmem_cache_heap_floor_mib=floor, **noidle)
    return gpu_proof.plan_figures(gpu_proof.host_plan_of(cfg))


def earlier_calls(session: Path, calls: tuple = ("call1", "call2"), last: str = "call3") -> dict:
    """A session whose machine stayed warm ran one phase across its calls: an earlier call's results.json and logs.tgz
    are kept as their sha256 only (the last call's hold them), and the last call's progress goes on from each
    earlier one's. Returns each earlier call's repetitions, [(config, repetition)], from its progress."""
    import re

    progress_last = (session / last / "progress.txt").read_text()
    reps = {}
    for call in calls:
        for name in ("results.json", "logs.tgz"):
            digest, kept = (session / call / f"{name}.sha256").read_text().split()
            assert kept == name and re.fullmatch(r"[0-9a-f]{64}", digest) and not (session / call / name).exists()
        progress = (session / call / "progress.txt").read_text()
        assert progress_last.startswith(progress.rstrip("\n").rsplit("\n", 1)[0]), call
        reps[call] = re.findall(r"\] traffic51 (\S+) (\d) ", progress)
    return reps


# Configs planned after a session's records were in (each: that session), run again beside the matrix's cells
ADDED51 = {"1x-ck4-cr0-heap-again": 9, "2x-ck4-cr0-heap-pair": 9, "2x-ck4-cr16-noidle-heap-pair": 9,
           "4x-ck4-cr4-noidle-heap-again": 12}


def todo(results: dict, plan_now: dict, session: int) -> list:
    """The configs of today's plan (plan_now: {name: config}) that `results` hold no complete record of, as the plan
    stood once session `session`'s records were in (a config added later, ADDED51, left out), in the phase's order."""
    from bench.gpu.proof.traffic import done

    return [n for n, c in plan_now.items() if not done(results["traffic51"], c) and ADDED51.get(n, 0) <= session]


def assert_under_plan(config: dict, now: dict, shares: tuple, floor: int | None = None) -> float:
    """A HEAP51 config against today's plan of it (`now`, a plan51_new config; or a plan of an earlier day, plan_then):
    the plan is the `shares`' (heap of the checkpoints, of the cache) with the cache's floor `floor` (None: today's,
    cache_floor_mib), its held above the config's peak held, the RSS peak under its total and MemoryMax above that.
    Returns how far above the peak the plan's held is (a share of the peak, 3 places)."""
    floor = cache_floor_mib() if floor is None else floor
    assert now == {**now, **plan_at_share(config, *shares, floor=floor)}  # the plan is the shares'
    assert unreclaimable(config) < now["planned_held_mib"], config["name"]
    assert max(r["peak"]["VmRSS"] for r in config["reps"]) < now["planned_mib"] < now["memory_max_mib"]
    return round(now["planned_held_mib"] / unreclaimable(config) - 1, 3)


def plan_then(config: dict, now: dict, shares: tuple) -> dict:
    """Today's plan of a HEAP51 config (`now`) as it stood before session 12 added the cache's floor: the `shares`'
    alone (sessions 8-11 planned 0.02 and 0.16 so)."""
    return {**now, **plan_at_share(config, *shares)}


def cache_floor_mib() -> int:
    """hostmem_cache_heap_floor_mib as v100_32gb's hosts get it today (group_vars)."""
    from bench.gpu import gpu_proof

    return gpu_proof.group_cfg("v100_32gb").server.hostmem_cache_heap_floor_mib


def share_needed(config: dict, ckpt_share: float) -> tuple:
    """What a HEAP51 config's heap share had to be for its plan to hold its peak: with a cache, the cache's beside
    `ckpt_share` of the checkpoints ("cache", share); without, the checkpoints' ("ckpt", share; below 0 where fewer
    checkpoints were live than planned); ("none", None) without either."""
    base = plan_at_share(config, 0, 0)["planned_held_mib"]
    per_ckpt = plan_at_share(config, 1, 0)["planned_held_mib"] - base  # the checkpoints and their page tables, MiB
    per_cache = plan_at_share(config, 0, 1)["planned_held_mib"] - base
    if per_cache:
        return "cache", round((unreclaimable(config) - base - ckpt_share * per_ckpt) / per_cache, 3)
    if per_ckpt:
        return "ckpt", round((unreclaimable(config) - base) / per_ckpt, 3)
    return "none", None


def doc_text(doc: str, after: str | None = None) -> str:
    """The repository's file `doc` (a path from the repository's root) with its runs of whitespace as one space, from
    the heading `after` on where one is named."""
    text = " ".join((REPO / doc).read_text().split())
    return text[text.index(after):] if after else text


def assert_quoted(doc: str, words, after: str | None = None) -> None:
    """Each of `words` is in the repository's file `doc` (doc_text: whitespace runs as one space, from `after` on)."""
    text = doc_text(doc, after)
    for w in words:
        assert w in text, (doc, w)


def assert_var_comment(yml: str, pattern: str) -> None:
    """A line of the repository's file `yml` (a group_vars file) matches `pattern` from its start: a variable, its value
    and the comment that quotes the records."""
    import re

    assert re.search(pattern, (REPO / yml).read_text(), re.M), (yml, pattern[:60])


def last_call(session: int) -> Path:
    """Issue 51's session `session`'s last call directory (bench/records/proof51/sessionN/callM, the highest M)."""
    return max((RECORDS51 / f"session{session}").glob("call*"), key=lambda p: int(p.name.removeprefix("call")))


def pre_phase_s(session: int) -> int:
    """Seconds from a session's facts to its phase (the build, Volta's choice, FORCE_MMQ, the models), from the
    progress of its last call."""
    import re
    from datetime import datetime

    progress = (last_call(session) / "progress.txt").read_text()

    def at(what):
        return datetime.strptime(re.search(rf"^\[(\d\d:\d\d:\d\d)\] {what}", progress, re.M).group(1), "%H:%M:%S")
    return (at("varying file written") - at("facts")).seconds


# Each session's device seconds from its machine's start to its give-back (the device tool's status; no record holds
# them): session 10 ran one call; 13 ended with 513 s of 1,800 left; 14 came with 1,529 s and ended with 191; 15 came
# with 1,334 and ended with 86; 16 came with 1,619 and ended with 536
DEVICE_USED51 = {10: 536, 11: 1214, 12: 1406, 13: 1800 - 513, 14: 1529 - 191, 15: 1334 - 86, 16: 1619 - 536}
# sessions whose phase did not end (no phase_seconds of their own): their calls' walls (the device tool's replies) stand
# for the wait and the phase
CUT51 = {15: (556.0, 585.7)}


def device_time(results: dict, newest: int) -> tuple[dict, dict, dict, int]:
    """Where issue 51's sessions spent their device time, as it stood once session `newest`'s records (`results`) were
    in. Returns the seconds before the phase of sessions 1 to `newest` (pre_phase_s); the phases of DEVICE_USED51's
    sessions up to it, but those cut short (CUT51): each as the results it ended with hold it (a held file keeps its
    own phase_seconds only where the next session's differ); their starts and transfers (the device time used less
    wait and phase, or less the calls' walls for one cut short); and the margin a config needs beyond its estimate:
    the longest wait and the most starts, rounded up to 10 s."""
    import json

    def phase(s):
        for t in range(s, newest):
            held = json.loads((last_call(t) / "results.json.held").read_text())
            if "phase_seconds" in held:
                return round(held["phase_seconds"]["traffic51:mmq"])
        return round(results["phase_seconds"]["traffic51:mmq"])

    used = {s: u for s, u in DEVICE_USED51.items() if s <= newest}
    waits = {s: pre_phase_s(s) for s in range(1, newest + 1)}
    phases = {s: phase(s) for s in used if s not in CUT51}
    starts = {s: u - (round(sum(CUT51[s])) if s in CUT51 else waits[s] + phases[s]) for s, u in used.items()}
    return waits, phases, starts, -(-(max(waits.values()) + max(starts.values())) // 10) * 10


def assert_one_phase(session: int, skipped: list, earlier: str, reps: list, pre_s: int) -> None:
    """A session's last call ran its phase to the end: the configs TRAFFIC51_ONLY left out (`skipped`, each said so),
    `earlier` among those done in an earlier call, the repetitions its progress names ([(config, "i")]), and the
    seconds from its facts to the phase (pre_phase_s)."""
    import re

    progress = (last_call(session) / "progress.txt").read_text()
    assert re.findall(r"\] traffic51 (\S+) not in TRAFFIC51_ONLY: skipped", progress) == skipped
    assert f"traffic51 {earlier} done in an earlier call: skipped" in progress
    assert re.findall(r"\] traffic51 (\S+) (\d) ", progress) == reps
    assert pre_phase_s(session) == pre_s
    assert progress.rstrip().endswith("done")


def assert_goes_on(results: dict, session: int, sha256: str, configs: int, phase_seconds: float, new: list) -> None:
    """A session went on from session `session`'s last call, whose results.json this one's holds: its results.json.held
    names the next session's last call, keeps its own phase_seconds, its `configs` traffic configs and `sha256` (which
    analyze.load checks the rebuilt bytes against, and which the next session's call1 started from: a session of
    several calls whose first ended no config); the next session's results begin with them unchanged and add `new`
    ([(config, complete, repetitions)])."""
    import json

    call = last_call(session)
    earlier = analyze.load(str(call / "results.json"))
    held = json.loads((call / "results.json.held").read_text())
    later = last_call(session + 1)
    assert held["held_by"] == f"../../{later.parent.name}/{later.name}"
    assert held["phase_seconds"] == {"traffic51:mmq": phase_seconds}
    assert held["sha256"] == sha256 and held["traffic51"] == configs
    assert (later.parent / "call1/results.json.sha256").read_text().split()[0] == sha256
    assert results["traffic51"][:configs] == earlier["traffic51"]
    assert [(c["name"], c.get("complete"), len(c["reps"])) for c in results["traffic51"][configs:]] == new


def assert_one_server(results: dict, logs: dict, name: str, phase_seconds: float, gpu_total_mib: int = 81559) -> None:
    """A session's phase started one server, `name`'s: FORCE_MMQ's build with HEAP51, the GPU's memory its baseline
    records (81,559 MiB: an H100) and the phase's seconds."""
    from voltafleet.planning import flags

    assert "FORCE_MMQ = 1" in logs[f"load-mmq-{name}.log"] and config_named(results, name)["build"] == "mmq"
    assert config_named(results, name)["env"] == flags.MALLOC_HEAP
    assert results["baseline"]["gpu_total_mib"] == gpu_total_mib
    assert results["phase_seconds"] == {"traffic51:mmq": phase_seconds}
    assert sorted(logs) == [f"load-mmq-{name}.log"]
