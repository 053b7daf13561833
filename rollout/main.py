"""The driver's command line: which run (a rollout, --plan or --tune), under the fleet's lock.

    sys.exit(main(["inventory/prod.py", "--canary", "1", "--batch", "25%"]))
"""
from __future__ import annotations

import argparse
import os
import sys

import rollout
from voltafleet.state import pyinfra_version, rolling
from voltafleet.state.lock import FleetLock, LockHeld

from rollout.fleet import Fleet
from rollout.plan import dry_run
from rollout.rolling import Rollout
from rollout.runner import Interrupt, Runner, say
from rollout.tune import Tune


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rollout", description=rollout.__doc__.split("\n\n")[0])
    p.add_argument("inventory", help="pyinfra inventory file, e.g. inventory/prod.py")
    p.add_argument("--canary", default="1",
                   help="the canary: a host count from the top of the inventory, a group, or comma-separated host names (default 1)")
    p.add_argument("--batch", default="25%", help="hosts per batch after the canary: a count or a percentage (default 25%%)")
    p.add_argument("--fail-percent", type=float, default=0.0,
                   help="stop when more than this share of the hosts tried failed (default 0: stop at the first failure)")
    p.add_argument("--report-dir", default="reports", help="where the fleet report goes (default reports/)")
    p.add_argument("--no-gateway", action="store_true",
                   help="roll without the gateway: instances restart without a drain (the gateway is down or absent)")
    p.add_argument("--gateways-only", action="store_true",
                   help="configure the gateways (and mirrors) only, one gateway at a time while the others serve the "
                        "fleet's address; no server host changes (preflight still reads them for the backends)")
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
    p.add_argument("--pin-check", metavar="REF", default=None,
                   help="the pin gate for another llama.cpp ref on the lab fleet (inventory/lab.py): resolve, sm_70 compile "
                        "evidence, flags against its --help, the H200 proof's evidence, a rolling move to it and back under "
                        "load; exit 0 only when every step passed (python -m rollout.pingate)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="stream pyinfra's whole output (it always goes to the run's logs in the report directory)")
    return p


def refusal(a, fleet: Fleet, canary: list[str]) -> str | None:
    """Why this command line cannot run, in one line (before the lock and any host)."""
    if a.tune and (len(canary) != 1 or canary[0] not in fleet.servers or a.plan or a.record_probe):
        return ("--tune measures one server host: give it with --canary HOST (or --canary 1), "
                "without --plan or --record-probe")
    if a.gateways_only and (a.tune or a.plan or a.no_gateway or a.record_probe):
        return "--gateways-only runs the gateway phase alone: without --tune, --plan, --no-gateway or --record-probe"
    if a.record_probe and not canary:
        return "--record-probe records the canary's probe: give a canary"
    return None


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.pin_check:  # its rollouts take the fleet's lock themselves
        if os.path.basename(a.inventory) != "lab.py":
            print("voltafleet: --pin-check rolls the lab fleet (inventory/lab.py); the fleet's canary comes after it",
                  file=sys.stderr)
            return 2
        from rollout import pingate
        return pingate.main([a.pin_check])
    if pyinfra_version.mismatch():  # what every pyinfra run of deploy.py applies (roles/speed.py), said here
        say(f"warning: {pyinfra_version.mismatch()}")
    fleet = Fleet.load(a.inventory)
    canary = fleet.canary(a.canary)
    try:
        batches = rolling.batches(fleet.servers, canary, a.batch)
    except rolling.RollingError as e:
        print(f"voltafleet: {e}", file=sys.stderr)
        return 2
    if refusal(a, fleet, canary):
        print(f"voltafleet: {refusal(a, fleet, canary)}", file=sys.stderr)
        return 2
    lock = FleetLock.for_hosts(list(fleet.groups), "python -m rollout " + " ".join(sys.argv[1:] if argv is None else argv))
    try:
        lock.acquire()
    except LockHeld as e:
        print(f"voltafleet: {e}", file=sys.stderr)
        return 2
    if lock.warning:
        say(f"warning: {lock.warning}")
    runner = Runner(a.inventory, Interrupt(grace=float(os.environ.get("VOLTAFLEET_INTERRUPT_GRACE_S", "900"))),
                    verbose=a.verbose, lock_fds=(lock.fd,))
    runner.interrupt.install()
    try:
        if a.tune:
            return Tune(a, fleet, runner, canary[0]).run()
        if a.plan:
            return dry_run(a, fleet, runner, batches, canary)
        return Rollout(a, fleet, runner, batches, canary).run()
    finally:
        lock.release()
