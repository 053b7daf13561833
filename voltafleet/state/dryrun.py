"""What a rollout would change, decided without changing anything (`python -m rollout --plan`):
the pure part. On each host the dry-run role (roles/dryrun) reads the facts a batch would read
(Observed) and `host_change` compares them with the host's plan, the way the roles decide:
release (llama_cpp, server), flags and unit (server's files.put), model (model's
is_verified), driver (voltafleet.gpu.nvidia.driver_plan), restarts (voltafleet.planning.restarts). The
rolling driver then reads every host's record, decides which host compiles each release
(voltafleet.planning.timeline.release_actions), estimates the time and prints `table(report)`.

    >>> change = host_change(plan, Observed(compiler=True, fingerprint=fp, current=fp, ...), unit_text)
    >>> change.restart, change.flags      # [], {} on a converged host
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from voltafleet.planning import timeline
from voltafleet.planning.hostplan import HostPlan
from voltafleet.models.modelstate import is_verified
from voltafleet.state.records import HostChange  # one host's plan record (plan-<host>.json)
from voltafleet.planning.restarts import restart_set
from voltafleet.state.runctx import RunDir

ARGS_KEY = "LLAMA_SERVER_ARGS"


def sha1(text: str) -> str:
    """What files.put compares: the sha1 of the file's content."""
    return hashlib.sha1(text.encode()).hexdigest()


@dataclass(frozen=True)
class Observed:
    """What a host has now, as the facts read it (roles/facts.py, roles/driver_facts.py)."""

    compiler: bool = False             # HostBasics: a C++ compiler
    toolkit: bool | None = None        # NvccVersion at the pinned toolkit (None: no CUDA)
    fingerprint: str | None = None     # roles.factcache.host_fingerprint (None: compiler or toolkit missing)
    current: str | None = None         # Releases: the release `current` points at
    releases: tuple = ()               # Releases: every release on the host
    env: dict = field(default_factory=dict)      # EnvFiles: {index: {"sha1", "text"}}
    unit_sha1: str | None = None       # Sha1File of the unit (None: absent)
    models: dict = field(default_factory=dict)   # {dest: FileState}
    model_bytes: dict = field(default_factory=dict)  # {url: Content-Length or None}
    live: dict = field(default_factory=dict)     # ServerInstances: {index: {"active", "enabled"}}
    driver: dict | None = None         # voltafleet.gpu.nvidia.driver_plan (None: cpu, or manage_driver false)


def refused(host: str, reasons: list[str], resources: list[str] = ()) -> HostChange:
    return HostChange(host=host, refusals=list(reasons), resources=list(resources))


def write(directory: Path, change: HostChange) -> Path:
    """Write a host's record atomically (the driver never reads half of one)."""
    return RunDir(directory).write(change)


def read(directory: Path, host: str, run: str | None = None) -> HostChange | None:
    """The host's record (of run `run`, when given), or None (missing, unreadable or malformed:
    the plan run did not reach it)."""
    return RunDir(directory).read(HostChange, host, run)


# ---------------------------------------------------------------- flags


def env_values(text: str) -> dict[str, str]:
    """KEY=VALUE lines of an environment file (comments skipped)."""
    out = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


def _is_flag(token: str) -> bool:
    if not token.startswith("-") or token == "-":
        return False
    try:
        float(token)
        return False  # a negative number is a value (--cache-ram -1)
    except ValueError:
        return True


def parse_args(args: str) -> dict[str, str]:
    """llama-server's argv as {flag: its value(s)}, in order ("" for a switch)."""
    out: dict[str, list] = {}
    flag = None
    for token in args.split():
        if _is_flag(token):
            flag = token
            out.setdefault(flag, [])
        elif flag is not None:
            out[flag].append(token)
    return {k: " ".join(v) for k, v in out.items()}


def flag_diff(old_text: str | None, new_text: str) -> list[str]:
    """What changes between two environment files, one short line each:
    "-t 1 -> 2", "added --metrics", "removed --no-slots", "CUDA_VISIBLE_DEVICES 0 -> 1"."""
    if old_text is None:
        return ["new instance"]
    old, new = env_values(old_text), env_values(new_text)
    out = []
    for key in dict.fromkeys([*new, *old]):
        if key != ARGS_KEY and old.get(key) != new.get(key):
            out.append(f"{key} {old.get(key, '(none)') or '(empty)'} -> {new.get(key, '(none)') or '(empty)'}")
    a, b = parse_args(old.get(ARGS_KEY, "")), parse_args(new.get(ARGS_KEY, ""))
    for flag in dict.fromkeys([*b, *a]):
        if flag not in a:
            out.append(f"added {flag} {b[flag]}".rstrip())
        elif flag not in b:
            out.append(f"removed {flag} {a[flag]}".rstrip())
        elif a[flag] != b[flag]:
            out.append(f"{flag} {a[flag]} -> {b[flag]}")
    return out or ["the file differs (whitespace or order)"]


# ---------------------------------------------------------------- one host


def release_key(plan: HostPlan, obs: Observed) -> str | None:
    """The fingerprint; while the compiler or toolkit is missing, a stand-in made of the build
    inputs (hosts with the same inputs will most likely share the fingerprint)."""
    if obs.fingerprint:
        return obs.fingerprint
    if plan.build is None:
        return None
    b = plan.build
    return "pending-" + sha1(json.dumps([b.commit, list(b.flags), list(b.targets), b.cuda_bin]))[:12]


def toolchain_needs(plan: HostPlan, obs: Observed) -> list[str]:
    needs = [] if obs.compiler else ["build tools"]
    if plan.cuda and not obs.toolkit:
        needs.append(f"CUDA toolkit {plan.settings.toolchain.cuda_toolkit_version}")
    return needs


def driver_change(driver: dict | None) -> tuple[str | None, str]:
    """(None, "") when the driver stays; else ("install" | "upgrade" | "reboot", why)."""
    if not driver or not driver.get("reboot"):
        return None, ""
    if not driver.get("change"):
        return "reboot", driver.get("why", "")
    return ("upgrade" if driver.get("current") else "install"), driver.get("why", "")


def host_change(plan: HostPlan, obs: Observed, unit_text: str) -> HostChange:
    """What one batch run would change on this host, from its facts (nothing is changed)."""
    cfg = plan.settings
    want = {i.index: plan.env_file(i.index) for i in plan.instances}
    env_changed = {i for i, text in want.items() if (obs.env.get(i) or {}).get("sha1") != sha1(text)}
    flags = {i: flag_diff((obs.env.get(i) or {}).get("text"), want[i]) for i in sorted(env_changed)}
    unit = obs.unit_sha1 != sha1(unit_text)
    switch = obs.fingerprint is None or obs.current != obs.fingerprint
    downloads = [{"dest": f.dest, "bytes": obs.model_bytes.get(f.url)} for f in plan.model_files
                 if not is_verified(obs.models.get(f.dest), f.sha256)]
    driver, driver_why = driver_change(obs.driver)
    why = [w for w, on in (("release", switch), ("model", downloads), ("unit", unit), ("driver", driver)) if on]
    restart, retire = restart_set(sorted(want), env_changed, bool(why), obs.live)
    if not why:
        why = (["flags"] if env_changed & set(restart) else []) + \
              (["not running"] if set(restart) - env_changed else [])
    return HostChange(
        host=plan.host, warnings=list(plan.warnings), fingerprint=obs.fingerprint, release_key=release_key(plan, obs),
        current=obs.current, present=bool(obs.fingerprint) and obs.fingerprint in obs.releases,
        shared=cfg.build.strategy == "shared", toolchain=toolchain_needs(plan, obs), flags=flags,
        unit=unit, downloads=downloads, driver=driver, driver_why=driver_why, driver_managed=obs.driver is not None,
        restart=restart,
        restart_why=why if restart else [], retire=retire, instances=len(want), smoke=cfg.smoke.enabled,
        probe=cfg.smoke.probe, constants=asdict(timeline.Constants.from_cfg(cfg)), resources=plan.resource_lines())


# ---------------------------------------------------------------- the fleet


def release_of(c: HostChange) -> timeline.Release:
    return timeline.Release(c.release_key or f"unknown-{c.host}", current=bool(c.fingerprint) and c.current == c.fingerprint,
                            present=c.present, shared=c.shared, pending=c.fingerprint is None)


def work_of(c: HostChange, release: str) -> timeline.Work:
    return timeline.Work(c.host, toolchain=bool(c.toolchain), driver=c.driver is not None, release=release,
                         model_bytes=sum(d["bytes"] or 0 for d in c.downloads), restarts=len(c.restart),
                         instances=c.instances, smoke=c.smoke, probe=c.probe,
                         consts=timeline.Constants.from_dict(c.constants))


def fleet_report(batches: list[list[str]], changes: dict[str, HostChange], builders: dict | None = None,
                 cached: set | frozenset = frozenset(), gateway: bool = True) -> dict:
    """plan.json: every host's row (in batch order), the refusals, the releases that would be
    missing, the estimate per batch and in total; ok when the rollout would start and find
    every release."""
    refused = {h: c.refusals for h, c in changes.items() if c.refusals}
    hosts = [h for b in batches for h in b if h in changes and h not in refused]
    actions = timeline.release_actions(batches, {h: release_of(changes[h]) for h in hosts}, builders, cached)
    work = {h: work_of(changes[h], actions[h][0]) for h in hosts}
    est = timeline.estimate(batches, work, gateway)
    where = timeline.batch_of(batches)
    rows = [row(changes[h], where[h], actions.get(h), est.hosts.get(h)) for b in batches for h in b if h in changes]
    problems = [f"{h}: release {(changes[h].release_key or '')[:16]} would be missing (the batch fails): {why}"
                for h, (a, why) in actions.items() if a == timeline.MISSING]
    return {"batches": batches, "gateway": gateway, "hosts": rows, "refused": refused, "problems": problems,
            "estimate": est.to_dict(), "ok": not refused and not problems}


def _size(n: int | None) -> str:
    if n is None:
        return "size unknown"
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"


def row(c: HostChange, batch: int, action: tuple | None, seconds: float | None) -> dict:
    """One host's line of the table, and the lines that explain it."""
    if c.refusals:
        return {"host": c.host, "batch": batch, "refused": True, "release": "-", "flags": "-", "model": "-",
                "driver": "-", "restart": "-", "seconds": None,
                "details": [f"refused: {r.removeprefix(c.host + ': ')}" for r in c.refusals]}
    act, why = action or ("keep", "")
    fp = (c.fingerprint or "")[:12]
    release = f"{act} {fp}".strip() + (" (toolchain first)" if c.toolchain else "")
    details = [f"instance {i}: {'; '.join(d)}" for i, d in sorted(c.flags.items())]
    details += [f"release: {why}"] if why and act not in ("keep", timeline.MISSING) else []  # MISSING: a problem line
    details += [f"toolchain: install {', '.join(c.toolchain)}"] if c.toolchain else []
    details += [f"driver: {c.driver_why}"] if c.driver else []
    details += ["unit: llama-server@.service changes"] if c.unit else []
    details += [f"retire: instance {', '.join(map(str, c.retire))}"] if c.retire else []
    details += [f"warning: {w}" for w in c.warnings]
    total = sum(d["bytes"] or 0 for d in c.downloads)
    model = "present" if not c.downloads else \
        f"download {_size(total if all(d['bytes'] is not None for d in c.downloads) else None)}"
    restart = f"{len(c.restart)} of {c.instances} ({', '.join(c.restart_why)})" if c.restart else "no"
    return {"host": c.host, "batch": batch, "refused": False, "release": release,
            "flags": "change" if c.flags else "same", "model": model,
            "driver": c.driver or ("same" if c.driver_managed else "-"),
            "restart": restart, "seconds": seconds, "details": details}


def resource_table(report: dict) -> list[str]:
    """The host plans per group (hosts of the same groups and the same per-instance plan together):
    the instance's memory once, then each host's memory against its MemTotal and its CPU plan; a host
    refused for them says so in the table above and its notes."""
    records, groups = report.get("records") or {}, report.get("groups") or {}
    blocks: dict[tuple, list[str]] = {}
    for r in report["hosts"]:
        lines = (records.get(r["host"]) or {}).get("resources") or []
        if lines:
            per_instance = next((x for x in lines if x.startswith("per instance: ")), "")
            blocks.setdefault((tuple(groups.get(r["host"], [])), per_instance), []).append(r["host"])
    if not blocks:
        return []
    out = ["", "host resources (voltafleet/planning/hostmem.py, voltafleet/planning/hostcpu.py; docs/host.md):"]
    for (names, per_instance), hosts in blocks.items():
        out.append(f"  {'group ' + ', '.join(names) if names else 'hosts'} ({', '.join(hosts)}): {per_instance}".rstrip(": "))
        for h in hosts:
            rest = [x for x in records[h]["resources"] if not x.startswith("per instance: ")]
            out.append(f"    {h}{' (REFUSED)' if h in report['refused'] else ''}: {'; '.join(rest)}")
    return out


def table(report: dict, canary: list[str] | None = None) -> str:
    """The plan as an operator reads it: one row per host, what explains it, every batch's
    estimate and the total."""
    dur = timeline.duration
    cols = ("host", "batch", "release", "flags", "model", "driver", "restart", "estimate")
    rows = [[r["host"], str(r["batch"]), "REFUSED" if r["refused"] else r["release"], r["flags"], r["model"],
             r["driver"], r["restart"], dur(r["seconds"])] for r in report["hosts"]]
    width = [max(len(x) for x in col) for col in zip(cols, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in width)
    lines = [fmt.format(*r).rstrip() for r in [cols, *rows]]
    notes = [f"  {r['host']}: {d}" for r in report["hosts"] for d in r["details"]]
    lines += ([""] + notes) if notes else []
    lines += resource_table(report)
    lines += ["", "estimate (timeline model, plan_* constants of group_vars):"]
    est = report["estimate"]
    lines.append(f"  preflight run: {dur(est['preflight_s'])}" + (f", gateway run: {dur(est['gateway_s'])}"
                                                                     if report["gateway"] else ""))
    for b in est["batches"]:
        what = "canary" if b["index"] == 0 and canary else f"batch {b['index']}"
        hosts = ", ".join(h + (" (refused)" if h in report["refused"] else "") for h in b["hosts"])
        steps = ", ".join(f"{k} {dur(v)}" for k, v in b["steps"].items() if v)
        lines.append(f"  {what}: {hosts}: {dur(b['seconds'])}" + (f" ({steps})" if steps else ""))
    lines.append(f"  total: {dur(est['total_s'])}")
    for p in report["problems"]:
        lines.append(f"problem: {p}")
    if report["refused"]:
        lines.append(f"REFUSED: {len(report['refused'])} host(s) refused by preflight: the rollout would stop "
                     "before any change (fix them first)")
    return "\n".join(lines)
