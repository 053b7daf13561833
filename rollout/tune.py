"""--tune: each setting of voltafleet.measure.tune.candidates rolled onto the drained canary and
measured (VOLTAFLEET_PHASE=tune), within the budget; the winner written to
group_vars/<group>.tuned.yml; the canary restored (its group's values, back in rotation).

    rc = Tune(args, fleet, runner, host="gpu-01").run()
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from voltafleet.inputs.settings import Settings
from voltafleet.measure import profile
from voltafleet.state import records, refs, runctx
from voltafleet.measure import tune as tunemod

from rollout.fleet import Fleet, run_directory
from rollout.runner import REPO, Runner, say


def tuned_group(groups: list[str]) -> str | None:
    """The group whose variables a tune of this host writes: its last group with a group_vars file."""
    found = [g for g in groups if (REPO / "group_vars" / f"{g}.yml").exists()]
    return found[-1] if found else None


@dataclass
class Tune:
    args: object                      # the parsed command line (rollout.main.parser)
    fleet: Fleet
    runner: Runner
    host: str
    cfg: Settings | None = None       # the canary's settings (the inventory's), the recorded workload over them
    recorded: dict = field(default_factory=dict)  # the workload read from the logs: {values, source}
    trials: list = field(default_factory=list)
    gpu: dict | None = None
    run_dir: Path | None = None
    base: runctx.RunContext | None = None

    def __post_init__(self):
        self.cfg = Settings.of(self.fleet.data[self.host])
        run_id = runctx.new_id()
        self.run_dir = run_directory(self.args.report_dir, run_id, "tune")[1]
        self.base = replace(runctx.RunContext.from_env(), rollout=run_id, report_dir=str(self.run_dir),
                            lock_owner=os.getpid(), smoke_always=True)

    @property
    def records(self) -> runctx.RunDir:
        return runctx.RunDir(self.run_dir)

    def pyinfra(self, ctx: runctx.RunContext, name: str, label: str) -> int:
        return self.runner.run([self.host] + self.fleet.gateways, ctx, self.run_dir / f"{name}.log", label=label)

    def run(self) -> int:
        group = tuned_group(self.fleet.groups[self.host])
        if group is None:
            say(f"--tune: {self.host} is in no group with a group_vars file: nothing to write the winner to")
            return 2
        hours = self.cfg.tune.profile_hours if self.args.profile_hours is None else self.args.profile_hours
        if hours and not self.profiled(hours):  # the workload from the fleet's own logs, before the canary is touched
            return 2
        settings = tunemod.candidates(Settings.of(self.fleet.data[self.host]))
        budget_s = 60 * (self.args.budget or self.cfg.tune.budget_minutes)
        cfg = self.cfg
        say(f"tune of group {group} on {self.host} (drained for the tune), gateway: "
            f"{', '.join(self.fleet.gateways) or 'none'}; {len(settings)} settings x {cfg.tune.repetitions} "
            f"repetitions of the workload ({cfg.tune.clients} clients, {cfg.tune.prompt_tokens}+"
            f"{cfg.tune.answer_tokens} tokens), budget {budget_s / 60:.0f} min; records in {self.run_dir}")
        try:
            self.try_all(settings, budget_s)
        finally:
            status = self.restore()
        return self.decide(group, status)

    def profiled(self, hours: float) -> bool:
        """The tune's workload from the last `hours` of the gateway's log and the canary's servers'
        journals (VOLTAFLEET_PHASE=profile reads them; voltafleet/measure/profile.py makes them tune_*)."""
        host, gateways = self.host, self.fleet.gateways
        if not gateways:
            say("--tune: --profile-hours reads the gateway's log: this inventory has no gateway "
                "(or use tune_* of group_vars)")
            return False
        over = self.run_dir / "profile.yml"
        over.write_text(yaml.safe_dump({"tune_profile_hours": hours}))
        ctx = replace(self.base, phase="profile", run=runctx.new_id(), vars_file=str(over))
        rc = self.pyinfra(ctx, "profile", "profile")
        got = {h: self.records.read(records.Profile, h, ctx.run) for h in [host] + gateways}
        missing = [h for h, r in got.items() if r is None or not r.ok]
        if missing:
            say(f"--tune: could not read the logs of {', '.join(missing)} (pyinfra exit {rc}; see "
                f"{self.run_dir / 'profile.log'}): no profile, nothing changed")
            return False
        try:
            values, source = profile.workload(profile.requests(got[host].lines),
                                              profile.in_flight([ln for g in gateways for ln in got[g].lines], host),
                                              hours)
        except profile.ProfileError as e:
            say(f"--tune: {host}: {e}")
            return False
        self.recorded = {"values": values, "source": source}
        self.cfg = self.cfg.replace(**values)
        say(f"workload recorded from the logs: {values} ({source})")
        return True

    def try_all(self, settings: list, budget_s: float) -> None:
        t0, it = time.time(), self.runner.interrupt
        for n, setting in enumerate(settings):
            self.trials.append(tunemod.Trial(setting))
            longest = max((t.seconds or 0 for t in self.trials), default=0)
            if it.asked:
                self.skip(f"interrupted by {it.name}")
            elif n and time.time() - t0 + longest > budget_s:
                self.skip(f"the budget ({budget_s / 60:.0f} min) would run out")
            else:
                say(f"trial {n + 1}/{len(settings)}: {setting.name} {setting.values or '(the shipped values)'}")
                self.trial(n, setting)

    def skip(self, why: str) -> None:
        self.trials[-1].status, self.trials[-1].reason = "skipped", why

    def trial(self, n: int, setting) -> None:
        """One setting rolled onto the drained canary and measured: its Trial from its tune record."""
        over = self.run_dir / f"trial-{n}.yml"
        over.write_text(yaml.safe_dump({**self.recorded.get("values", {}), **setting.values}))
        ctx = replace(self.base, phase="tune", run=runctx.new_id(), batch=f"trial-{n}", vars_file=str(over))
        t1 = time.time()
        rc = self.pyinfra(ctx, f"trial-{n}", setting.name)
        rec = self.records.read(records.Tune, self.host, ctx.run)
        trial = self.trials[-1] = tunemod.Trial.of(setting, rec, seconds=round(time.time() - t1, 1))
        if rec is not None:
            self.gpu = rec.gpu or self.gpu
        else:  # refused (its preflight record says why) or failed: never read from the run's output
            trial.status, trial.reason = tunemod.unmeasured(self.records.read(records.Preflight, self.host, ctx.run),
                                                            rc, over.with_suffix(".log"))
        f = trial.figures()
        say(f"trial {n + 1}: {trial.status}" + (f" ({trial.reason})" if trial.reason else "")
            + (f": {f['throughput_tps']} tok/s, TTFT p50 {f['ttft_p50_ms']} / p99 {f['ttft_p99_ms']} ms"
               if trial.status == "measured" else "") + f" in {trial.seconds} s")

    def restore(self) -> int:
        say(f"restoring {self.host}: its group's values, back in rotation")
        if self.pyinfra(replace(self.base, phase="batch", run=runctx.new_id()), "restore", "restore") != 0:
            say(f"the canary {self.host} could not be restored: see {self.run_dir / 'restore.log'}")
            return 1
        return 0

    def decide(self, group: str, status: int) -> int:
        """The winner, written to group_vars/<group>.tuned.yml (nothing when interrupted or unmeasured)."""
        cfg, it = self.cfg, self.runner.interrupt
        vram = float(self.gpu["memory_mib"]) if self.gpu and self.gpu.get("memory_mib") else None
        best = tunemod.winner(self.trials, cfg, vram)
        print("\n" + tunemod.table(self.trials, cfg, vram, best=best) + "\n")
        if it.asked:
            say(f"INTERRUPTED ({it.name}): {self.host} restored, nothing written; records in {self.run_dir}")
            return it.code
        if not any(t.status == "measured" for t in self.trials):
            say(f"no setting could be measured on {self.host} (each trial's log is in {self.run_dir}): nothing written")
            return 1
        target = REPO / "group_vars" / f"{group}{tunemod.SUFFIX}"
        target.write_text(tunemod.document(group, best, self.trials, cfg, self.meta(), vram))
        say((f"winner: {best.setting.name} {best.setting.values or '(the shipped values)'}" if best
             else "no setting passed: the shipped values stay") + f"; written to {target.relative_to(REPO)} "
            f"(review and commit it; `python -m rollout {self.fleet.inventory} --plan` shows what the next rollout "
            "changes)")
        return status

    def meta(self) -> dict:
        cfg = self.cfg
        return {"host": self.host, "inventory": self.fleet.inventory, "backend": cfg.preflight.backend,
                "llama_cpp": {"repo": cfg.build.repo, "ref": cfg.build.ref,
                              "commit": refs.resolve(cfg.build.repo, cfg.build.ref)},
                "model_sha256": cfg.model.sha256, "records": str(self.run_dir),
                "workload_from": self.recorded.get("source") or "tune_* of group_vars",
                "gpu": self.gpu or "none (the cpu backend)"}
