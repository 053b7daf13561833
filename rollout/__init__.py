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
and why, and the estimated time of each batch and in total (voltafleet.planning.timeline); plan.json
in the run directory. Exit 0 when the rollout would start and find every release, else 2.

The driver's modules, one job each: main (the command line, the lock, which run), fleet (the
inventory, the canary, the run's session and first fleet plan), runner (pyinfra runs and the
signals), rolling (preflight, gateway, batches, the fleet report), plan (--plan), tune (--tune).
It imports no role: what deploy.py's runs leave for it are records (voltafleet.state.runctx.RunDir).
"""
