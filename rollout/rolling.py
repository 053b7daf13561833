"""A rolling rollout: preflight on every server host, the gateways and mirrors, then the
canary and the batches, each one pyinfra run of deploy.py limited to its hosts (plus the
gateways, which drain each instance before its restart); each host's verdict is its own
outcome record of that batch's run. See rollout/__init__.py.

    Rollout(args, fleet, runner, batches, canary).run()   # the exit code
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from voltafleet.inputs.settings import Settings
from voltafleet.state import fleetplan, metrics, records, refs, rolling

from rollout.fleet import Fleet, Session
from rollout.runner import REPO, Runner, say


@dataclass
class Rollout:
    args: object                      # the parsed command line (rollout.main.parser)
    fleet: Fleet
    runner: Runner
    batches: list
    canary: list
    session: Session | None = None
    seconds: dict = field(default_factory=dict)   # each pyinfra run's wall time (python -m voltafleet.state.calibrate)
    results: dict = field(default_factory=dict)   # {host: voltafleet.state.rolling.HostResult}

    @property
    def gateways(self) -> list[str]:
        return [] if self.args.no_gateway else self.fleet.gateways

    @property
    def configured(self) -> list[str]:
        """The gateway phase's hosts: the gateways and the mirrors (without the gateway, the
        mirrors that are not also the unreachable gateway)."""
        if self.args.no_gateway:
            return [h for h in self.fleet.mirrors if h not in self.fleet.gateways]
        return [h for h in self.fleet.groups if h in self.fleet.gateways or h in self.fleet.mirrors]

    def log(self, name: str) -> Path:
        return self.session.run_dir / f"{name}.log"

    def timed(self, name: str, limit, ctx, label: str = "", serial: bool = False) -> int:
        t = time.time()
        rc = self.runner.run(limit, ctx, self.log(name), label=label, serial=serial)
        self.seconds[name] = round(time.time() - t, 1)
        return rc

    def run(self) -> int:
        try:
            self.session = Session.start(self.fleet, self.args.report_dir, self.args.no_gateway)
        except refs.RefError as e:
            say(f"refused before any host was touched: {e}")
            return 2
        self.announce()
        t0 = time.time()
        if not self.preflight() or not self.configure():
            return 2
        if self.args.gateways_only:
            say(f"gateways configured ({', '.join(self.configured)}"
                f"{', one at a time' if rolling.gateway_serial(self.gateways) else ''}) in {round(time.time() - t0, 1)} s; "
                "no server host was changed")
            return 0
        stopped = self.roll()
        return self.report(stopped, round(time.time() - t0, 1))

    def announce(self) -> None:
        fleet, s = self.fleet, self.session
        say(f"{len(fleet.servers)} server host(s), gateway: {', '.join(self.gateways) or 'none'}, "
            f"mirror: {', '.join(fleet.mirrors) or 'none'}; batches: "
            + " | ".join(", ".join(b) for b in self.batches)
            + f"; llama.cpp {', '.join(sorted(set(s.plan.commits.values())))[:60]}")
        longest = Settings.of(fleet.data[fleet.servers[0]]).gateway.rollout_max_minutes if fleet.servers else 45
        running = metrics.running_textfile(s.id, fleet.inventory, 60 * float(longest))
        for d in self.textfile_dirs():
            metrics.write_textfile(d, running)  # a drain now is a rollout's, for rollout_max_minutes

    def textfile_dirs(self) -> list[Path]:
        return [self.session.report_dir] + ([Path(self.args.textfile_dir)] if self.args.textfile_dir else [])

    def preflight(self) -> bool:
        """Every server host's preflight: any refusal stops the rollout before any host changes;
        the fleet plan then gets every server host's instances."""
        s, servers = self.session, self.fleet.servers
        ctx = s.ctx("preflight", record_probe=self.args.record_probe)
        if self.timed("preflight", servers if self.args.no_gateway else None, ctx) != 0:
            say("preflight refused the rollout: no host was changed")
            return False
        entries = [records.entry(s.records.read(records.Preflight, h, ctx.run)) for h in servers]
        if any(e is None for e in entries):
            say("preflight wrote no plan for " + ", ".join(h for h, e in zip(servers, entries) if e is None)
                + ": no host was changed")
            return False
        s.save_plan(fleetplan.with_servers(s.plan, entries))
        return True

    def configure(self) -> bool:
        """Every gateway and mirror, before the first batch (their hosts only); two gateways or more: host by
        host, the run stopped at the first that fails, the others serving the fleet's address meanwhile."""
        if not self.configured or self.runner.interrupt.asked:
            return True
        serial = rolling.gateway_serial(self.gateways)
        if self.timed("gateway", self.configured, self.session.ctx("gateway"), serial=serial) != 0:
            say(f"the {'gateway or mirror' if self.fleet.mirrors else 'gateway'} could not be configured "
                f"({', '.join(self.configured)}{', host by host: the ones after it untouched' if serial else ''}): "
                "no server host was changed")
            return False
        return True

    def roll(self) -> str | None:
        """The canary, then each batch; why the rollout stopped, or None."""
        it = self.runner.interrupt
        for n, batch in enumerate(self.batches):
            what = "canary" if n == 0 and self.canary else f"batch {n}"
            if it.asked:
                return self.stop(f"interrupted by {it.name} before {'the canary' if what == 'canary' else what}")
            say(f"{what}: {', '.join(batch)}")
            self.batch(n, batch, what)
            if it.asked:
                return self.stop(f"interrupted by {it.name} during {what}: the hosts after it were not touched")
            stopped = rolling.should_stop({h: r.status for h, r in self.results.items()},
                                          self.args.fail_percent, self.canary)
            if stopped:
                return self.stop(stopped)
        return None

    @staticmethod
    def stop(why: str) -> str:
        say(f"stopping: {why}")
        return why

    def batch(self, n: int, batch: list[str], what: str) -> None:
        """One batch's pyinfra run; each host's verdict from its own outcome record."""
        s, it = self.session, self.runner.interrupt
        ctx = s.ctx("batch", batch=str(n), record_probe=self.args.record_probe and n == 0)
        rc = self.timed(f"batch-{n}", batch + self.gateways, ctx, label=what)
        log = self.log(f"batch-{n}")
        got = {h: s.records.read(records.Outcome, h, ctx.run) for h in batch}
        for r in rolling.batch_results(n, batch, got, rc, str(log.relative_to(REPO) if log.is_relative_to(REPO)
                                                               else log)):
            if it.forced and r.status == "failed" and got.get(r.host) is None:
                r.status, r.detail = "interrupted", (f"its pyinfra run was stopped ({it.why_forced()}) before its "
                                                     "outcome: instances may be out of rotation until the next run")
            self.results[r.host] = r
            say(f"{r.host}: {r.status}" + (f" ({r.detail})" if r.detail else ""))

    def report(self, stopped: str | None, seconds: float) -> int:
        """The fleet report (JSON, the textfile, a table) naming every host; the exit code."""
        s, it = self.session, self.runner.interrupt
        every = [self.results.get(h) or rolling.HostResult(h, next(i for i, b in enumerate(self.batches) if h in b),
                                                           detail="not tried: the rollout stopped")
                 for h in self.fleet.servers]
        report = {"rollout": s.id, "inventory": self.fleet.inventory, "seconds": seconds, "runs": self.seconds,
                  "canary": self.canary, "batches": self.batches, "fail_percent": self.args.fail_percent,
                  "commits": s.plan.commits, **rolling.summary(every, stopped), "interrupted": it.name,
                  "hosts": [r.to_dict() for r in every]}
        path = s.report_dir / f"rollout-{s.id}.json"
        for p in (path, s.report_dir / "rollout-latest.json"):
            p.write_text(json.dumps(report, indent=2) + "\n")
        for d in self.textfile_dirs():
            metrics.write_rollout_textfile(d, report)  # voltafleet_rollout_passed and friends (monitoring/alerts.yml)
        print("\n" + rolling.table(every))
        if it.asked:
            say(f"INTERRUPTED ({it.name}) after {seconds} s; report: {path}")
            return it.code
        unmeasured = report["counts"]["unmeasured"]
        say(f"{'OK' if report['ok'] else 'FAILED'} in {seconds} s"
            + (f" ({unmeasured} host(s) unmeasured: smoke_enabled is false)" if unmeasured else "")
            + f"; report: {path}")
        return 0 if report["ok"] else 1
