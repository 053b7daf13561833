"""Roll a fleet out in batches that keep it serving.

    python -m rollout inventory/prod.py [--canary 1] [--batch 25%] [--fail-percent 10]

0. the fleet's lock (one rollout at a time: a second one refuses at once); the fleet plan,
   decided once: each llama.cpp ref's commit, each model's size, then (after preflight)
   every server host's instances and the builder of each release fingerprint;
1. preflight on every host (pyinfra, VOLTAFLEET_PHASE=preflight): any refusal stops the
   rollout before any host changes;
2. the gateway (HAProxy) gets every server host's backends and the model mirrors (nginx,
   hosts of the `mirror` group) their cache, before any server host changes
   (VOLTAFLEET_PHASE=gateway); server hosts then fetch the model through a mirror;
3. the canary, then the other hosts `--batch` at a time: each batch is one pyinfra run of
   deploy.py limited to its hosts (plus the gateway, which drains each instance before
   its restart, confirmed, and takes it back once its host's smoke test passed); a host
   that fails after its first change is rolled back, restarted and smoked again;
4. every instance's quality probe (greedy tokens and log-probabilities) is compared with
   the golden probe kept in probes/ (--record-probe records it from the canary, once);
5. each host's verdict is its own outcome record of that batch's run; no record is a
   failure. The rollout stops when the canary fails or the failed share exceeds
   --fail-percent; the fleet report (JSON and a table) names every host. Exit 0 only if
   every host passed.

With --plan nothing changes on any host: one pyinfra run reads every host's facts
(VOLTAFLEET_PHASE=plan: preflight and the plan role, no operation) and the driver prints what
each batch would change (release, flags, model, driver, restarts), the hosts preflight refuses
and why, and the estimated time of each batch and in total (voltafleet.timeline); plan.json
in the run directory. Exit 0 when the rollout would start and find every release, else 2.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from voltafleet import dryrun, fleetplan, metrics, mirror, outcome, refs, rolling, runctx  # noqa: E402
from voltafleet.lock import FleetLock, LockHeld  # noqa: E402
from voltafleet.modelmeta import remote_size  # noqa: E402
from voltafleet.screen import Condenser  # noqa: E402

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
GATEWAY_GROUP = "gateway"
MIRROR_GROUP = mirror.GROUP  # nginx caching the model: like a gateway, not a server host


def say(msg: str) -> None:
    print(f"[rollout {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load_inventory(path: str) -> tuple[dict[str, list[str]], dict[str, dict]]:
    """({host: [groups]}, {host: data}) in inventory order, from the inventory file as
    pyinfra reads it: every public list of hosts is a group (our loader validates and
    fills every host's variables)."""
    import runpy

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        attrs = runpy.run_path(str(REPO / path) if not os.path.isabs(path) else path)
    finally:
        os.chdir(cwd)
    hosts: dict[str, list[str]] = {}
    data: dict[str, dict] = {}
    for group, value in attrs.items():
        if group.startswith("_") or not isinstance(value, (list, tuple)):
            continue
        for entry in value:
            name = entry[0] if isinstance(entry, tuple) else entry
            if isinstance(name, str):
                hosts.setdefault(name, []).append(group)
                if isinstance(entry, tuple) and len(entry) > 1 and isinstance(entry[1], dict):
                    data.setdefault(name, {}).update(entry[1])
    return hosts, data


def first_plan(rollout_id: str, servers: list[str], data: dict[str, dict],
               mirrors: list[str] = ()) -> fleetplan.FleetPlan:
    """What is resolved once, before preflight: each (repo, ref)'s commit, each model's size,
    the model mirrors (where each server host fetches the model)."""
    commits, sizes = {}, {}
    for h in servers:
        d = data.get(h, {})
        repo, ref = d.get("llama_cpp_repo"), d.get("llama_cpp_ref")
        if repo and ref and fleetplan.commit_key(repo, ref) not in commits:
            commits[fleetplan.commit_key(repo, ref)] = refs.resolve(repo, ref)
        url = d.get("model_url")
        if url and url not in sizes:
            sizes[url] = remote_size(url)
    return fleetplan.FleetPlan(rollout=rollout_id, commits=commits, model_bytes=sizes,
                               mirrors=mirror.mirrors_of([(h, data.get(h, {})) for h in mirrors]))


class Interrupt:
    """SIGINT, SIGTERM and SIGHUP of the driver (Ctrl-C in a terminal reaches only the driver:
    each pyinfra run is its own process group). The first signal lets the pyinfra run in
    progress finish (every host of it drains, restarts, smokes and goes back into rotation
    or rolls back) for up to `grace` seconds, then no further run starts; a second signal, or
    the grace running out, stops the run (SIGTERM to its process group, SIGKILL 30 s later).
    The fleet report and the textfile then say `interrupted`; the exit code is 128 + signal."""

    NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}

    def __init__(self, grace: float):
        self.grace, self.signum, self.at, self.forced = grace, None, None, False
        self.child: subprocess.Popen | None = None

    def install(self) -> None:
        for sig in self.NAMES:
            signal.signal(sig, self.handle)

    def handle(self, signum, _frame) -> None:
        if self.signum is None:
            self.signum, self.at = signum, time.monotonic()
            say(f"{self.NAMES[signum]}: the pyinfra run in progress finishes its hosts (up to {self.grace:.0f} s), "
                "then the rollout stops; send it again to stop that run now")
        else:
            self.force("a second signal")

    def force(self, why: str) -> None:
        if self.forced or self.child is None or self.child.poll() is not None:
            return
        self.forced = True
        say(f"stopping the pyinfra run (pid {self.child.pid}) now: {why}")
        try:
            os.killpg(self.child.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def expired(self) -> bool:
        return self.at is not None and time.monotonic() - self.at > self.grace

    @property
    def name(self) -> str | None:
        return self.NAMES.get(self.signum)

    @property
    def code(self) -> int:
        return 128 + int(self.signum)


INTERRUPT = Interrupt(grace=float(os.environ.get("VOLTAFLEET_INTERRUPT_GRACE_S", "900")))
LOCK_FDS: tuple = ()  # the fleet lock's descriptor: every pyinfra run shares the driver's flock


VERBOSE = False  # -v: pyinfra's whole output on the terminal, not the condensed screen


def pyinfra(inventory: str, limit: list[str] | None, ctx: runctx.RunContext, log: Path, echo: bool = True,
            label: str = "") -> tuple[int, str]:
    """One pyinfra run of deploy.py in its own process group (a terminal's Ctrl-C reaches the
    driver only, see Interrupt); it inherits the fleet lock's descriptor, so the lock stays
    held while it runs even if the driver is killed. Its output goes to `log`, and to the
    terminal when `echo`."""
    cmd = [PYINFRA, "-y", inventory, "deploy.py"]
    for name in limit or []:
        cmd[1:1] = ["--limit", name]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **ctx.to_env()}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True,
                            pass_fds=LOCK_FDS)
    INTERRUPT.child = proc
    watch = threading.Thread(target=_watch, args=(proc,), daemon=True)
    watch.start()
    lines = []
    screen = Condenser(label or ctx.phase)
    with open(log, "w") as f:
        for line in proc.stdout:
            lines.append(line)
            f.write(line)
            f.flush()
            if echo and VERBOSE:
                sys.stdout.write("    " + line)
            elif echo:
                for shown in screen.feed(line):
                    print(shown, flush=True)
    rc = proc.wait()
    if echo and not VERBOSE:
        for shown in screen.close():
            print(shown, flush=True)
    INTERRUPT.child = None
    return rc, "".join(lines)


def _watch(proc: subprocess.Popen) -> None:
    """Stop the run when an interrupt's grace runs out; SIGKILL 30 s after a SIGTERM."""
    while proc.poll() is None:
        if INTERRUPT.expired():
            INTERRUPT.force(f"the {INTERRUPT.grace:.0f} s grace ran out")
        if INTERRUPT.forced:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rollout", description=__doc__.split("\n\n")[0])
    p.add_argument("inventory", help="pyinfra inventory file, e.g. inventory/prod.py")
    p.add_argument("--canary", default="1",
                   help="the canary: a host count from the top of the inventory, a group, or comma-separated host names (default 1)")
    p.add_argument("--batch", default="25%", help="hosts per batch after the canary: a count or a percentage (default 25%%)")
    p.add_argument("--fail-percent", type=float, default=0.0,
                   help="stop when more than this share of the hosts tried failed (default 0: stop at the first failure)")
    p.add_argument("--report-dir", default="reports", help="where the fleet report goes (default reports/)")
    p.add_argument("--no-gateway", action="store_true",
                   help="roll without the gateway: instances restart without a drain (the gateway is down or absent)")
    p.add_argument("--textfile-dir", default=None,
                   help="also write voltafleet-rollout.prom here (node_exporter's textfile collector on the controller)")
    p.add_argument("--record-probe", action="store_true",
                   help="record the golden quality probe from the canary (once, when the model is pinned)")
    p.add_argument("--plan", action="store_true",
                   help="change nothing: print what each batch would change, the hosts preflight refuses and "
                        "the estimated time (plan.json in the run directory); exit 2 if the rollout would not start")
    p.add_argument("--tune", action="store_true",
                   help="measure server settings on one drained canary host (--canary HOST) and write the winner "
                        "to group_vars/<group>.tuned.yml for the next rollout; the canary is restored at the end")
    p.add_argument("--budget", type=float, default=None,
                   help="with --tune: minutes the tune may take (default tune_budget_minutes)")
    p.add_argument("--profile-hours", type=float, default=None,
                   help="with --tune: read the workload (prompt and answer tokens, clients, follow-up share) from the "
                        "last N hours of the gateway's and the canary's logs (default tune_profile_hours; 0: tune_*)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="stream pyinfra's whole output (it always goes to the run's logs in the report directory)")
    a = p.parse_args(argv)
    global VERBOSE
    VERBOSE = a.verbose
    from roles import speed  # what every pyinfra run of deploy.py applies: said here, on the controller, when not

    if speed.why_not():
        say(f"warning: {speed.why_not()}")

    inventory, data = load_inventory(a.inventory)
    gateways = [h for h, groups in inventory.items() if GATEWAY_GROUP in groups]
    mirrors = [h for h, groups in inventory.items() if MIRROR_GROUP in groups]
    servers = [h for h in inventory if h not in gateways and h not in mirrors]
    if a.canary.isdigit():
        canary = servers[:int(a.canary)]
    elif any(a.canary in groups for groups in inventory.values()):
        canary = [h for h, groups in inventory.items() if a.canary in groups and h in servers]
    else:
        canary = [c.strip() for c in a.canary.split(",") if c.strip()]
    try:
        batches = rolling.batches(servers, canary, a.batch)
    except rolling.RollingError as e:
        print(f"voltafleet: {e}", file=sys.stderr)
        return 2
    if a.tune and (len(canary) != 1 or canary[0] not in servers or a.plan or a.record_probe):
        print("voltafleet: --tune measures one server host: give it with --canary HOST (or --canary 1), "
              "without --plan or --record-probe", file=sys.stderr)
        return 2
    if a.record_probe and not canary:
        print("voltafleet: --record-probe records the canary's probe: give a canary", file=sys.stderr)
        return 2

    lock = FleetLock.for_hosts(list(inventory), "python -m rollout " + " ".join(sys.argv[1:] if argv is None else argv))
    try:
        lock.acquire()
    except LockHeld as e:
        print(f"voltafleet: {e}", file=sys.stderr)
        return 2
    if lock.warning:
        say(f"warning: {lock.warning}")
    global LOCK_FDS
    LOCK_FDS = (lock.fd,)
    INTERRUPT.install()
    try:
        if a.tune:
            return tune(a, inventory, data, gateways, servers, canary)
        return (dry_run if a.plan else rollout)(a, inventory, data, gateways, servers, canary, batches, mirrors)
    finally:
        lock.release()


def run_directory(a, rollout_id: str, what: str = "rollout") -> tuple[Path, Path]:
    """(the report directory, this run's directory in it: <what>-<id>), made."""
    report_dir = (REPO / a.report_dir) if not os.path.isabs(a.report_dir) else Path(a.report_dir)
    run_dir = report_dir / f"{what}-{rollout_id}"
    run_dir.mkdir(parents=True, exist_ok=True)
    return report_dir, run_dir


def start(a, servers, data, mirrors):
    """What a rollout and a plan both begin with: a run id and its directory, the fleet plan
    resolved once and written there, the run context every pyinfra run of it starts from.
    (rollout_id, report_dir, run_dir, fleet, plan_path, base), or None: a ref that does
    not resolve (said, nothing touched)."""
    rollout_id = runctx.new_id()
    report_dir, run_dir = run_directory(a, rollout_id)
    try:
        fleet = first_plan(rollout_id, servers, data, mirrors)
    except refs.RefError as e:
        say(f"refused before any host was touched: {e}")
        return None
    plan_path = run_dir / runctx.RunDir.FLEET_PLAN
    plan_path.write_text(fleet.to_json())
    own = runctx.RunContext.from_env()  # what the driver was started with (VOLTAFLEET_SMOKE=always, ...)
    base = replace(own, rollout=rollout_id, report_dir=str(run_dir), fleet_plan=str(plan_path),
                   lock_owner=os.getpid(), no_gateway=a.no_gateway or own.no_gateway)
    return rollout_id, report_dir, run_dir, fleet, plan_path, base


def dry_run(a, inventory, data, gateways, servers, canary, batches, mirrors=()) -> int:
    """--plan: one read-only pyinfra run (VOLTAFLEET_PHASE=plan) records what each host would
    change; the batches, refusals and estimates are printed and written to plan.json."""
    started = start(a, servers, data, mirrors)
    if started is None:
        return 2
    rollout_id, _, run_dir, fleet, _, base = started
    ctx = replace(base, phase="plan", run=runctx.new_id(), record_probe=a.record_probe)
    if a.no_gateway:
        gateways = []
    log = run_dir / "plan.log"
    say(f"plan: {len(servers)} server host(s), gateway: {', '.join(gateways) or 'none'}; batches: "
        + " | ".join(", ".join(b) for b in batches) + "; reading facts (nothing changes)")
    pyinfra(a.inventory, servers if a.no_gateway else None, ctx, log, echo=False)
    changes = {h: dryrun.read(run_dir, h) or dryrun.refused(
        h, [f"no plan record: unreachable, or the plan run failed on it (see {log})"]) for h in servers}
    planned = [c for c in changes.values() if not c.refusals]
    cache = fleetplan.release_cache(REPO)
    cached = {c.fingerprint for c in planned if c.fingerprint and fleetplan.release_cached(cache, c.fingerprint)}
    report = dryrun.fleet_report(batches, changes, fleetplan.builders(planned), cached, gateway=bool(gateways))
    report = {"rollout": rollout_id, "inventory": a.inventory, "canary": canary, "commits": fleet.commits,
              "log": str(log), **report, "records": {h: c.to_dict() for h, c in changes.items()},
              "groups": {h: inventory.get(h, []) for h in servers}}  # the host resources' table, per group
    (run_dir / runctx.RunDir.PLAN).write_text(json.dumps(report, indent=2) + "\n")
    print("\n" + dryrun.table(report, canary) + "\n")
    say(f"plan {'OK' if report['ok'] else 'NOT OK'}: nothing was changed; {run_dir / runctx.RunDir.PLAN}")
    return 0 if report["ok"] else 2


def rollout(a, inventory, data, gateways, servers, canary, batches, mirrors=()) -> int:
    started = start(a, servers, data, mirrors)
    if started is None:
        return 2
    rollout_id, report_dir, run_dir, fleet, plan_path, base = started
    # the gateway phase's hosts: the gateways and the mirrors (without the gateway, the mirrors
    # that are not also the unreachable gateway)
    configure = [h for h in inventory if h in gateways or h in mirrors]
    if a.no_gateway:
        configure = [h for h in mirrors if h not in gateways]
        gateways = []
    say(f"{len(servers)} server host(s), gateway: {', '.join(gateways) or 'none'}, "
        f"mirror: {', '.join(mirrors) or 'none'}; batches: "
        + " | ".join(", ".join(b) for b in batches) + f"; llama.cpp {', '.join(sorted(set(fleet.commits.values())))[:60]}")

    t0 = time.time()
    max_s = 60 * float((data.get(servers[0], {}) if servers else {}).get("rollout_max_minutes") or 45)
    running = metrics.running_textfile(rollout_id, a.inventory, max_s)
    for d in [report_dir] + ([Path(a.textfile_dir)] if a.textfile_dir else []):
        metrics.write_textfile(d, running)  # a drain now is a rollout's, for rollout_max_minutes
    seconds = {}  # each pyinfra run's wall time, for the plan's calibration (python -m voltafleet.calibrate)
    pre = replace(base, phase="preflight", run=runctx.new_id(), record_probe=a.record_probe)
    rc, _ = pyinfra(a.inventory, servers if a.no_gateway else None, pre, run_dir / "preflight.log")
    seconds["preflight"] = round(time.time() - t0, 1)
    if rc != 0:
        say("preflight refused the rollout: no host was changed")
        return 2
    entries = [fleetplan.ServerEntry.of(runctx.RunDir(run_dir).read("preflight", h, run=pre.run)) for h in servers]
    if any(e is None for e in entries):
        say("preflight wrote no plan for " + ", ".join(h for h, e in zip(servers, entries) if e is None)
            + ": no host was changed")
        return 2
    fleet = fleetplan.with_servers(fleet, entries)
    plan_path.write_text(fleet.to_json())
    if configure and INTERRUPT.signum is None:  # every gateway and mirror before the first batch
        t1 = time.time()
        rc, _ = pyinfra(a.inventory, configure if a.no_gateway else None,
                        replace(base, phase="gateway", run=runctx.new_id()),
                        run_dir / "gateway.log")
        seconds["gateway"] = round(time.time() - t1, 1)
        if rc != 0:
            say(f"the {'gateway or mirror' if mirrors else 'gateway'} could not be configured "
                f"({', '.join(configure)}): no server host was changed")
            return 2

    results: dict[str, rolling.HostResult] = {}
    stopped = None
    for n, batch in enumerate(batches):
        what = "canary" if n == 0 and canary else f"batch {n}"
        if INTERRUPT.signum is not None:
            stopped = f"interrupted by {INTERRUPT.name} before {'the canary' if what == 'canary' else what}"
            say(f"stopping: {stopped}")
            break
        say(f"{what}: {', '.join(batch)}")
        run_id = runctx.new_id()
        ctx = replace(base, phase="batch", batch=str(n), run=run_id, record_probe=a.record_probe and n == 0)
        log = run_dir / f"batch-{n}.log"
        t1 = time.time()
        rc, _ = pyinfra(a.inventory, batch + gateways, ctx, log, label=what)
        seconds[f"batch-{n}"] = round(time.time() - t1, 1)
        records = {h: outcome.read(run_dir, h, run_id) for h in batch}
        for r in rolling.batch_results(n, batch, records, rc, str(log.relative_to(REPO) if log.is_relative_to(REPO)
                                                                   else log)):
            if INTERRUPT.forced and r.status == "failed" and records.get(r.host) is None:
                r.status, r.detail = "interrupted", (f"its pyinfra run was stopped ({INTERRUPT.name}, then "
                                                     f"{'a second signal' if not INTERRUPT.expired() else 'the grace ran out'}) "
                                                     "before its outcome: instances may be out of rotation until the next run")
            results[r.host] = r
            say(f"{r.host}: {r.status}" + (f" ({r.detail})" if r.detail else ""))
        if INTERRUPT.signum is not None:
            stopped = f"interrupted by {INTERRUPT.name} during {what}: the hosts after it were not touched"
            say(f"stopping: {stopped}")
            break
        stopped = rolling.should_stop({h: r.status for h, r in results.items()}, a.fail_percent, canary)
        if stopped:
            say(f"stopping: {stopped}")
            break

    every = [results.get(h) or rolling.HostResult(h, next(i for i, b in enumerate(batches) if h in b),
                                                  detail="not tried: the rollout stopped") for h in servers]
    report = {"rollout": rollout_id, "inventory": a.inventory, "seconds": round(time.time() - t0, 1), "runs": seconds,
              "canary": canary, "batches": batches, "fail_percent": a.fail_percent, "commits": fleet.commits,
              **rolling.summary(every, stopped), "interrupted": INTERRUPT.name, "hosts": [r.to_dict() for r in every]}
    (report_dir / f"rollout-{rollout_id}.json").write_text(json.dumps(report, indent=2) + "\n")
    (report_dir / "rollout-latest.json").write_text(json.dumps(report, indent=2) + "\n")
    for d in [report_dir] + ([Path(a.textfile_dir)] if a.textfile_dir else []):
        metrics.write_rollout_textfile(d, report)  # voltafleet_rollout_passed and friends (monitoring/alerts.yml)
    print("\n" + rolling.table(every))
    unmeasured = report["counts"]["unmeasured"]
    if INTERRUPT.signum is not None:
        say(f"INTERRUPTED ({INTERRUPT.name}) after {report['seconds']} s; report: "
            f"{report_dir / f'rollout-{rollout_id}.json'}")
        return INTERRUPT.code
    say(f"{'OK' if report['ok'] else 'FAILED'} in {report['seconds']} s"
        + (f" ({unmeasured} host(s) unmeasured: smoke_enabled is false)" if unmeasured else "")
        + f"; report: {report_dir / f'rollout-{rollout_id}.json'}")
    return 0 if report["ok"] else 1


def tuned_group(groups: list[str]) -> str | None:
    """The group whose variables a tune of this host writes: its last group with a group_vars file."""
    found = [g for g in groups if (REPO / "group_vars" / f"{g}.yml").exists()]
    return found[-1] if found else None


def profiled(a, host: str, gateways: list[str], base, run_dir: Path, hours: float) -> tuple[dict, str | None]:
    """The tune's workload from the last `hours` of the gateway's log and the canary's servers'
    journals (VOLTAFLEET_PHASE=profile reads them; voltafleet/profile.py makes them tune_*):
    ({values, source}, None), or ({}, why not)."""
    import yaml

    from voltafleet import profile

    if not gateways:
        return {}, "--profile-hours reads the gateway's log: this inventory has no gateway (or use tune_* of group_vars)"
    over = run_dir / "profile.yml"
    over.write_text(yaml.safe_dump({"tune_profile_hours": hours}))
    run_id = runctx.new_id()
    rc, _ = pyinfra(a.inventory, [host] + gateways, replace(base, phase="profile", run=run_id, vars_file=str(over)),
                    run_dir / "profile.log", label="profile")
    records = runctx.RunDir(run_dir)
    got = {h: records.read("profile", h, run=run_id) for h in [host] + gateways}
    missing = [h for h, r in got.items() if r is None or not r["ok"]]
    if missing:
        return {}, (f"could not read the logs of {', '.join(missing)} (pyinfra exit {rc}; see {run_dir / 'profile.log'}): "
                    "no profile, nothing changed")
    try:
        values, source = profile.workload(profile.requests(got[host]["lines"]),
                                          profile.in_flight([ln for g in gateways for ln in got[g]["lines"]], host),
                                          hours)
    except profile.ProfileError as e:
        return {}, f"{host}: {e}"
    return {"values": values, "source": source}, None


def tune(a, inventory, data, gateways, servers, canary) -> int:
    """--tune: each setting of voltafleet.tune.candidates rolled onto the drained canary and
    measured (VOLTAFLEET_PHASE=tune), within the budget; the winner written to
    group_vars/<group>.tuned.yml; the canary restored (its group's values, back in rotation)."""
    import yaml

    from voltafleet import tune as tunemod

    host = canary[0]
    cfg = data[host]
    group = tuned_group(inventory[host])
    if group is None:
        say(f"--tune: {host} is in no group with a group_vars file: nothing to write the winner to")
        return 2
    budget_s = 60 * (a.budget or cfg["tune_budget_minutes"])
    rollout_id = runctx.new_id()
    report_dir, run_dir = run_directory(a, rollout_id, "tune")
    settings = tunemod.candidates(cfg)
    base = replace(runctx.RunContext.from_env(), rollout=rollout_id, report_dir=str(run_dir),
                   lock_owner=os.getpid(), smoke_always=True)
    records = runctx.RunDir(run_dir)
    hours = cfg["tune_profile_hours"] if a.profile_hours is None else a.profile_hours
    recorded: dict = {}
    if hours:  # the workload from the fleet's own logs, before the canary is touched
        recorded, why = profiled(a, host, gateways, base, run_dir, hours)
        if why:
            say(f"--tune: {why}")
            return 2
        say(f"workload recorded from the logs: {recorded['values']} ({recorded['source']})")
        cfg = {**cfg, **recorded["values"]}
    say(f"tune of group {group} on {host} (drained for the tune), gateway: {', '.join(gateways) or 'none'}; "
        f"{len(settings)} settings x {cfg['tune_repetitions']} repetitions of the workload "
        f"({cfg['tune_clients']} clients, {cfg['tune_prompt_tokens']}+{cfg['tune_answer_tokens']} tokens), "
        f"budget {budget_s / 60:.0f} min; records in {run_dir}")
    trials, t0, status, gpu = [], time.time(), 0, None
    try:
        for n, setting in enumerate(settings):
            trial = tunemod.Trial(setting)
            trials.append(trial)
            spent = time.time() - t0
            longest = max((t.seconds or 0 for t in trials), default=0)
            if INTERRUPT.signum is not None:
                trial.status, trial.reason = "skipped", f"interrupted by {INTERRUPT.name}"
                continue
            if n and spent + longest > budget_s:
                trial.status, trial.reason = "skipped", f"the budget ({budget_s / 60:.0f} min) would run out"
                continue
            say(f"trial {n + 1}/{len(settings)}: {setting.name} {setting.values or '(the shipped values)'}")
            over = run_dir / f"trial-{n}.yml"
            over.write_text(yaml.safe_dump({**recorded.get("values", {}), **setting.values}))
            run_id = runctx.new_id()
            trial_ctx = replace(base, phase="tune", run=run_id, batch=f"trial-{n}", vars_file=str(over))
            t1 = time.time()
            rc, out = pyinfra(a.inventory, [host] + gateways, trial_ctx, run_dir / f"trial-{n}.log", label=setting.name)
            seconds = round(time.time() - t1, 1)
            rec = records.read("tune", host, run=run_id)
            trial = trials[-1] = tunemod.Trial.of(setting, rec or {}, seconds=seconds)
            if rec is not None:
                gpu = rec.get("gpu") or gpu
            elif "preflight refused" in out:
                trial.status = "refused"
                trial.reason = next((ln.strip() for ln in out.splitlines() if host + ":" in ln and "Fix" not in ln),
                                    "preflight refused it")[:200]
            else:
                trial.status, trial.reason = "failed", f"no tune record (pyinfra exit {rc}; see {over.with_suffix('.log')})"
            f = trial.figures()
            say(f"trial {n + 1}: {trial.status}" + (f" ({trial.reason})" if trial.reason else "")
                + (f": {f['throughput_tps']} tok/s, TTFT p50 {f['ttft_p50_ms']} / p99 {f['ttft_p99_ms']} ms"
                   if trial.status == "measured" else "") + f" in {trial.seconds} s")
    finally:
        say(f"restoring {host}: its group's values, back in rotation")
        rc, _ = pyinfra(a.inventory, [host] + gateways, replace(base, phase="batch", run=runctx.new_id()),
                        run_dir / "restore.log", label="restore")
        if rc != 0:
            say(f"the canary {host} could not be restored: see {run_dir / 'restore.log'}")
            status = 1
    vram = float(gpu["memory_mib"]) if gpu and gpu.get("memory_mib") else None
    best = tunemod.winner(trials, cfg, vram)
    print("\n" + tunemod.table(trials, cfg, vram, best=best) + "\n")
    if INTERRUPT.signum is not None:
        say(f"INTERRUPTED ({INTERRUPT.name}): {host} restored, nothing written; records in {run_dir}")
        return INTERRUPT.code
    if not any(t.status == "measured" for t in trials):
        say(f"no setting could be measured on {host} (each trial's log is in {run_dir}): nothing written")
        return 1
    meta = {"host": host, "inventory": a.inventory, "backend": cfg["voltafleet_backend"],
            "llama_cpp": {"repo": cfg["llama_cpp_repo"], "ref": cfg["llama_cpp_ref"],
                          "commit": refs.resolve(cfg["llama_cpp_repo"], cfg["llama_cpp_ref"])},
            "model_sha256": cfg["model_sha256"], "records": str(run_dir),
            "workload_from": recorded.get("source") or "tune_* of group_vars"}
    meta["gpu"] = gpu or "none (the cpu backend)"
    target = REPO / "group_vars" / f"{group}{tunemod.SUFFIX}"
    target.write_text(tunemod.document(group, best, trials, cfg, meta, vram))
    say((f"winner: {best.setting.name} {best.setting.values or '(the shipped values)'}" if best
         else "no setting passed: the shipped values stay") + f"; written to {target.relative_to(REPO)} "
        f"(review and commit it; `python -m rollout {a.inventory} --plan` shows what the next rollout changes)")
    return status


if __name__ == "__main__":
    sys.exit(main())
