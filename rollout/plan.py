"""--plan: nothing changes on any host. One read-only pyinfra run (VOLTAFLEET_PHASE=plan:
preflight and the plan role, no operation) records what each host would change; the
batches, the hosts preflight refuses and why, and the estimated time of each batch
(voltafleet.planning.timeline) are printed and written to plan.json in the run directory.

    rc = dry_run(args, fleet, runner, batches, canary)   # 0: the rollout would start, else 2
"""
from __future__ import annotations

import json
from pathlib import Path

from voltafleet.state import dryrun
from voltafleet.state import fleetplan, records, refs, runctx

from rollout.fleet import Fleet, Session
from rollout.runner import REPO, Runner, say


def dry_run(args, fleet: Fleet, runner: Runner, batches: list, canary: list) -> int:
    try:
        s = Session.start(fleet, args.report_dir, args.no_gateway)
    except refs.RefError as e:
        say(f"refused before any host was touched: {e}")
        return 2
    servers, gateways = fleet.servers, [] if args.no_gateway else fleet.gateways
    log = s.run_dir / "plan.log"
    say(f"plan: {len(servers)} server host(s), gateway: {', '.join(gateways) or 'none'}; batches: "
        + " | ".join(", ".join(b) for b in batches) + "; reading facts (nothing changes)")
    ctx = s.ctx("plan", record_probe=args.record_probe)
    runner.run(servers if args.no_gateway else None, ctx, log, echo=False)
    changes = {h: s.records.read(records.HostChange, h, ctx.run) or dryrun.refused(
        h, [f"no plan record: unreachable, or the plan run failed on it (see {log})"]) for h in servers}
    report = plan_report(s, fleet, changes, batches, canary, gateways, log)
    (s.run_dir / runctx.RunDir.PLAN).write_text(json.dumps(report, indent=2) + "\n")
    print("\n" + dryrun.table(report, canary) + "\n")
    say(f"plan {'OK' if report['ok'] else 'NOT OK'}: nothing was changed; {s.run_dir / runctx.RunDir.PLAN}")
    return 0 if report["ok"] else 2


def plan_report(s: Session, fleet: Fleet, changes: dict, batches: list, canary: list, gateways: list,
                log: Path) -> dict:
    """plan.json: each batch's changes and estimate, the builders, every host's record."""
    planned = [c for c in changes.values() if not c.refusals]
    cache = fleetplan.release_cache(REPO)
    cached = {c.fingerprint for c in planned if c.fingerprint and fleetplan.release_cached(cache, c.fingerprint)}
    report = dryrun.fleet_report(batches, changes, fleetplan.builders(planned), cached, gateway=bool(gateways))
    return {"rollout": s.id, "inventory": fleet.inventory, "canary": canary, "commits": s.plan.commits, "log": str(log),
            **report, "records": {h: c.to_dict() for h, c in changes.items()},
            "groups": {h: fleet.groups.get(h, []) for h in fleet.servers}}  # the host resources' table, per group
