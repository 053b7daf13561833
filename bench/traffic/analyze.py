"""Issue 51's traffic records read back: each config's median of its 3 schedules, the host memory it
took against its plan, and what its server did (checkpoints, host-cache saves) from the server's log.
Pure: no pyinfra, no GPU, no network.

    .venv/bin/python -m bench.traffic.analyze bench/records/proof51/session1/call3/results.json [logs.tgz]

A config's repetitions replay three different schedules (seed 51, 52, 53): every config of one population
replays the same three, so two configs compare schedule by schedule (`paired`), and a figure is the median
of its three.

What a V100 would do with the same requests (`v100_prefill_s`): the records hold every request's prompt
tokens the server processed (`timings.prompt_n`) and found cached (`cache_n`), and every config of a
population generates the same tokens (greedy, same schedule, `ignore_eos`). So two configs differ in the
prompt tokens they reprocess and in the server's own host work (checkpoint copies, cache saves), not in
their decode. A reprocessed token costs a V100 1/363-1/384 s (llama.cpp #25139, bench/gpu/prefill51.py);
the host work is assumed to cost what it cost beside the H100 (a 149.6 MiB state copied to host memory:
`checkpoint_copy_ms`), which the V100 host's PCIe 3 and older memory would not make cheaper.
"""
from __future__ import annotations

import gzip
import json
import re
import statistics
import sys
import tarfile

from bench.gpu.prefill51 import V100_PP

# llama.cpp's log time: minutes.seconds.milliseconds.microseconds since the server started
STAMP = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) ")
CREATED = re.compile(r"slot create_check: id\s+(\d+) \| task (\d+) \| created context checkpoint .*size = ([\d.]+) MiB")
RESTORED = re.compile(r"restored context checkpoint")
SAVING = re.compile(r"prompt_save:\s+- saving prompt with length (\d+), total state size = ([\d.]+) MiB")
UPDATE_MS = re.compile(r"prompt cache update took ([\d.]+) ms")
SUMMARY = ("followup_cached_share", "followup_ttft_p50_ms", "followup_ttft_p99_ms", "opening_ttft_p50_ms",
           "opening_ttft_p99_ms", "aggregate_tps", "busy_share", "wall_s")
TOKEN_FIELDS = ("processed", "cached", "requests", "generated")  # tokens(rep)'s
COPY_GAP_S = 0.25  # two checkpoints of different slots this close: one batch's fill, no decode between


def stamp(line: str) -> float | None:
    """Seconds since the server started, from a log line's stamp (None: no stamp)."""
    m = STAMP.match(line)
    return int(m[1]) * 60 + int(m[2]) + int(m[3]) / 1e3 + int(m[4]) / 1e6 if m else None


SLOT_TASK = re.compile(r"id\s+(\d+) \| task (\d+) \|")
# a line a slot logs in the same batch fill just before its checkpoint's copy: its cached prefix dropped from
# memory or its sampler set up for the prompt's end (full logs), or a checkpoint at the same place superseded
# (create_checkpoint logs it before it copies)
FILL = re.compile(r"memory_seq_rm \[|superseding context checkpoint|init sampler")


def checkpoint_copy_ms(lines: list[str]) -> list[float]:
    """Each checkpoint's cost where the log shows it alone: a "created context checkpoint" line and the stamped
    line before it, under COPY_GAP_S apart, when that line is another slot's checkpoint or the same slot and
    task's own fill (FILL). llama-server fills one batch slot by slot and creates a slot's checkpoint
    (llama_state_seq_get_data_ext into a new host vector) before the batch is decoded, so the time between is
    the copy (and a few token pushes). On a log filtered to some lines (a record's 120 kept lines) a line
    between can be missing, which COPY_GAP_S bounds: a decode on the H100 takes longer."""
    stamped = [(t, line) for line in lines if (t := stamp(line)) is not None]
    out = []
    for (t0, a), (t1, b) in zip(stamped, stamped[1:]):
        if not CREATED.search(b) or t1 - t0 >= COPY_GAP_S:
            continue
        sa, sb = SLOT_TASK.search(a), SLOT_TASK.search(b)
        other_slot = CREATED.search(a) and sa and sa[1] != sb[1]
        own_fill = FILL.search(a) and sa and sa.groups() == sb.groups()
        if other_slot or own_fill:
            out.append(round((t1 - t0) * 1000, 1))
    return out


def server_counts(lines: list[str]) -> dict:
    """What the server did in these log lines: checkpoints created (and their MiB), restored, prompts it
    set out to save to the host cache, and the host cache's updates with their own measured time."""
    created = [float(m[3]) for line in lines if (m := CREATED.search(line))]
    saves = [float(m[2]) for line in lines if (m := SAVING.search(line))]
    update_ms = [float(m[1]) for line in lines if (m := UPDATE_MS.search(line))]
    return {"created": len(created), "created_mib": round(sum(created), 1),
            "restored": sum(1 for line in lines if RESTORED.search(line)),
            "save_attempts": len(saves), "cache_updates": len(update_ms), "cache_update_ms": round(sum(update_ms), 1)}


def rep_lines(log_text: str, span: list[int]) -> list[str]:
    """The lines a repetition's server wrote: its log_span [bytes before, bytes after] of the whole log."""
    return log_text.encode()[span[0]:span[1]].decode(errors="replace").splitlines()


def logs_of(tgz: str) -> dict[str, str]:
    """The servers' whole logs gpu_proof.sh packs (logs.tgz: load-BUILD-NAME.log), by file name."""
    with tarfile.open(tgz) as t:
        return {m.name.rsplit("/", 1)[-1]: t.extractfile(m).read().decode(errors="replace")
                for m in t.getmembers() if m.isfile()}


def work(config: dict, logs: dict[str, str]) -> dict | None:
    """What the server did in each repetition (server_counts of its log span), the median of them, and the
    checkpoint copies the whole log shows alone; None when the logs lack the config's log or its spans. A config
    cut short (partial: its record names no log file yet) is read from the file the phase writes for it
    (runner.log_name)."""
    from bench.gpu.proof.runner import log_name

    text = logs.get(config.get("log_file") or log_name(config.get("build"), config.get("name")))
    spans = [r.get("log_span") for r in config["reps"]]
    if text is None or not all(spans):
        return None
    reps = [server_counts(rep_lines(text, span)) for span in spans]
    copies = checkpoint_copy_ms(text.splitlines())
    return {**{k: median([r[k] for r in reps]) for k in reps[0]}, "per_rep": reps,
            "copy_ms_median": median(copies), "copies_alone": len(copies)}


def tokens(rep: dict) -> dict:
    """A repetition's prompt tokens: processed by the server, found cached, and its requests."""
    recs = rep["records"]
    return {"requests": len(recs), "processed": sum(r.get("prompt_n") or 0 for r in recs),
            "cached": sum(r.get("cache_n") or 0 for r in recs),
            "generated": sum(r.get("tokens") or 0 for r in recs)}


def reprocessed(config: dict) -> list[tuple[int, int]]:
    """Per repetition: (follow-ups, follow-ups whose prompt found nothing cached): each of the latter reprocessed its
    whole history (its conversation lost its slot, or no checkpoint let the slot roll back past the dropped
    reasoning)."""
    out = []
    for rep in config["reps"]:
        follow = [r for r in rep["records"] if r["followup"]]
        out.append((len(follow), sum(1 for r in follow if r["cache_n"] == 0)))
    return out


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def row(config: dict) -> dict:
    """One config's figures: the median of its repetitions, the largest host memory any of them took."""
    reps = config["reps"]
    out = {"name": config["name"], "complete": bool(config.get("complete")), "reps": len(reps),
           "args": config.get("plan_args")}
    for k in SUMMARY:
        out[k] = median([r["summary"].get(k) for r in reps])
    for k in TOKEN_FIELDS:
        out[k] = median([tokens(r)[k] for r in reps])
    rss = [r["peak"].get("VmRSS") for r in reps if r.get("peak")]
    cg = [(r["peak"].get("cgroup") or {}).get("cg_unreclaimable") for r in reps if r.get("peak")]
    out.update(planned_mib=config.get("planned_mib"), memory_max_mib=config.get("memory_max_mib"),
               rss_peak_mib=max(rss) if rss else None, cgroup_peak_mib=max([c for c in cg if c], default=None),
               alive_at_end=config.get("alive_at_end"))
    return out


def configs(results: dict, key: str = "traffic51") -> list[dict]:
    """The traffic configs the results hold (item 3's rounds are not replays), one record a name: a session that
    resumed from an earlier one's results ran a partial config again from its start, and its complete record
    stands for it; in run order."""
    out: dict[str, dict] = {}
    for c in results.get(key, []):
        if c.get("kind", "traffic") == "traffic" and c["reps"]:
            if c.get("complete") or not (out.get(c["name"]) or {}).get("complete"):
                out.pop(c["name"], None)
                out[c["name"]] = c
    return list(out.values())


def rounds_configs(results: dict, key: str = "traffic51") -> list[dict]:
    """Item 3's complete rounds configs, in run order."""
    return [c for c in results.get(key, []) if c.get("kind") == "rounds" and c.get("complete")]


def table(results: dict, key: str = "traffic51") -> list[dict]:
    """Every traffic config's row (`row`)."""
    return [row(c) for c in configs(results, key)]


def paired(results: dict, a: str, b: str, field: str, key: str = "traffic51") -> list[tuple]:
    """(schedule fingerprint, a's figure, b's figure) for each schedule both configs replayed."""
    by = {c["name"]: {r["fingerprint"]: r for r in c["reps"]} for c in configs(results, key)}

    def get(rep):
        return tokens(rep)[field] if field in TOKEN_FIELDS else rep["summary"][field]
    return [(fp, get(ra), get(by[b][fp])) for fp, ra in by[a].items() if fp in by[b]]


def rounds(results: dict, seed: str = "thr-seed", key: str = "traffic51") -> dict:
    """Item 3: each rounds config's wall tok/s (a round's tokens over first request to last token, as proof19b
    measured the seed's ratio) at each prompt/answer shape, its median of the repetitions and the ratio of
    that median to the seed's stage-3 flags' median in the same run: {name: {"PROMPT/TOKENS": {...}}}."""
    from bench.gpu.proof.runner import wall_rate

    out: dict = {}
    for c in rounds_configs(results, key):
        shapes = out.setdefault(c["name"], {})
        for rep in c["reps"]:
            f = shapes.setdefault(f"{rep['prompt']}/{rep['tokens']}", {"tps": [], "step_ms": []})
            f["tps"].append(wall_rate(rep["recs"]))
            f["step_ms"].append(median([decode_step_ms(r) for r in rep["recs"]]))
    for shapes in out.values():
        for f in shapes.values():
            f["median"] = median(f["tps"])
            f["step_median"] = median(f["step_ms"])
    for shapes in out.values():
        for shape, f in shapes.items():
            base = (out.get(seed) or {}).get(shape, {}).get("median")
            f["x_seed"] = round(f["median"] / base, 2) if base and f["median"] else None
    return out


def decode_step_ms(rec: dict) -> float | None:
    """One request's decode step: first token to last over the steps between (times_ms, from its start)."""
    t = rec.get("times_ms") or []
    return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None


def decode_ceiling(results: dict, ship: str, seed: str = "thr-seed", streams: tuple = (16, 4),
                   key: str = "traffic51") -> dict:
    """Item 3's bound as answers grow: the ratio of `ship`'s wall tok/s to the seed's tends to their decode
    rates, streams x step, since the seed's queued prefill waves weigh less and less: 16 / step16 over
    4 / step4 at each shape, from the same run's median steps."""
    got = rounds(results, seed, key)
    return {shape: round((streams[0] / f["step_median"]) / (streams[1] / got[seed][shape]["step_median"]), 2)
            for shape, f in got[ship].items()}


def v100_prefill_s(processed: float) -> tuple[float, float]:
    """Seconds a V100 takes to process these prompt tokens, at the field report's fastest and slowest rate."""
    lo, hi = V100_PP
    return processed / hi, processed / lo


def report(results: dict, logs: dict[str, str] | None = None) -> str:
    lines = [f"{'config':20} {'reps':>4} {'cached':>6} {'fu p50':>8} {'fu p99':>8} {'open p50':>8} {'tok/s':>6} "
             f"{'busy':>5} {'processed':>9} {'RSS':>7} {'cgroup':>7} {'plan':>7}"]
    for r in table(results):
        def f(v, fmt):
            return format(v, fmt) if v is not None else "-"
        lines.append(f"{r['name']:20} {r['reps']:>4} {f(r['followup_cached_share'], '.2f'):>6} "
                     f"{f(r['followup_ttft_p50_ms'], ',.0f'):>8} {f(r['followup_ttft_p99_ms'], ',.0f'):>8} "
                     f"{f(r['opening_ttft_p50_ms'], ',.0f'):>8} {f(r['aggregate_tps'], '.1f'):>6} "
                     f"{f(r['busy_share'], '.2f'):>5} {f(r['processed'], ',.0f'):>9} {f(r['rss_peak_mib'], ',.0f'):>7} "
                     f"{f(r['cgroup_peak_mib'], ',.0f'):>7} {f(r['planned_mib'], ',.0f'):>7}")
    gaps = [g for c in results.get("traffic51", []) for g in checkpoint_copy_ms(c.get("log") or [])]
    if gaps:
        lines.append(f"checkpoint copy (kept log lines, {len(gaps)} pairs): median {statistics.median(gaps):.1f} ms")
    for name, shapes in rounds(results).items():
        lines.append(f"{name:20} 16 clients: " + ", ".join(
            f"{shape} {f['median']:.1f} tok/s ({f['x_seed']}x the seed, step {f['step_median']:.1f} ms)"
            for shape, f in shapes.items()))
    for c in configs(results) + rounds_configs(results) if logs else []:
        w = work(c, logs)
        if w:
            lines.append(f"{c['name']:20} a repetition (median): {w['created']:.0f} checkpoints created, "
                         f"{w['restored']:.0f} restored, {w['save_attempts']:.0f} cache saves set out, "
                         f"{w['cache_update_ms']:,.0f} ms of cache updates; copies alone: {w['copies_alone']}, "
                         f"median {w['copy_ms_median'] or 0:.1f} ms")
    return "\n".join(lines)


HELD = "results.json.held"  # beside a call's results.json once a later call's holds it (raw)
_KEYS = ["baseline", "traffic51"]  # a results.json's keys before sessions wrote phase_seconds (a held file's default)
_OWN = {"held_by", "keys", "sha256"}  # a held file's own fields, which no results key may take


def raw(path: str) -> bytes:
    """A call's results.json, byte for byte: the file, its gzip'd copy (results.json.gz), or, where a later call's
    results hold it (each call's results.json begins with every earlier call's configs), rebuilt from those. A
    rebuilt file's directory keeps `results.json.held`: {"held_by": the later call's directory, relative to this
    one, "traffic51": how many of its configs, "keys": the file's keys in order where they are not ["baseline",
    "traffic51"], each other key ("baseline", "phase_seconds") with this call's own value where the later call's
    differs or lacks it (compared as json writes them: 143 and 143.0 differ), "sha256": the file's}. The phase
    writes its results with json's indent 1, so the first configs and those values give the same bytes, which the
    sha256 checks; a mismatch raises, naming both files."""
    from pathlib import Path

    p = Path(path)
    if p.exists():
        return gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
    held = p.parent / HELD
    if not held.exists():
        raise FileNotFoundError(f"{p}: no such results, nor {HELD} beside it naming the later call that holds them")
    return _rebuilt(held)


def call_results(call) -> dict:
    """A call directory's results: its results.json, else its gzip'd copy, else as a later call holds it."""
    plain = call / "results.json"
    return json.loads(raw(str(plain if plain.exists() else call / "results.json.gz")))


def _rebuilt(held) -> bytes:
    """The results.json a `results.json.held` stands for, rebuilt from the later call's and checked (raw)."""
    import hashlib

    h = json.loads(held.read_text())
    later = held.parent / h["held_by"]
    newer = call_results(later)
    keys = h.get("keys", _KEYS)
    out = json.dumps({k: newer["traffic51"][:h["traffic51"]] if k == "traffic51" else h[k] if k in h else newer[k]
                      for k in keys}, indent=1).encode()
    if hashlib.sha256(out).hexdigest() != h["sha256"]:
        raise ValueError(f"{held}: the first {h['traffic51']} configs of {later}'s results, with the values {HELD} "
                         f"keeps, are not this call's (sha256 differs): the later call's results changed, or {HELD} is wrong")
    return out


def hold(call: str, later: str) -> dict:
    """Replace a call's results.json (or .gz) by `results.json.held`, once `later`'s results hold it byte for byte
    (raw's rebuild checked before anything is removed). Returns what was written."""
    import hashlib
    import os
    from pathlib import Path

    c, lt = Path(call), Path(later)
    (src,) = [f for f in (c / "results.json", c / "results.json.gz") if f.exists()]
    data = raw(str(src))
    own = json.loads(data)
    newer = call_results(lt)
    if clash := sorted(set(own) & _OWN):
        raise ValueError(f"{src}: {clash} are keys {HELD} keeps for itself; rename them in the results")
    h = {"held_by": os.path.relpath(lt, c), "traffic51": len(own["traffic51"]),
         **({"keys": list(own)} if list(own) != _KEYS else {}),
         **{k: v for k, v in own.items() if k != "traffic51" and (k not in newer or json.dumps(newer[k]) != json.dumps(v))},
         "sha256": hashlib.sha256(data).hexdigest()}
    (c / HELD).write_text(json.dumps(h, indent=1) + "\n")
    try:
        if _rebuilt(c / HELD) != data:
            raise ValueError(f"{c}: rebuilt from {lt}, not the same bytes")
    except Exception:
        (c / HELD).unlink()
        raise
    src.unlink()
    return h


def load(path: str) -> dict:
    """A call's results.json (raw: the file, its gzip'd copy, or rebuilt from a later call's results)."""
    return json.loads(raw(path))


if __name__ == "__main__":
    print(report(load(sys.argv[1]), logs_of(sys.argv[2]) if len(sys.argv) > 2 else None))
