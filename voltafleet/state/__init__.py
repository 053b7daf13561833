"""A rollout's state on the controller: the run contract and its records, the fleet plan decided once, what a --plan run says each host would change, batches and verdicts, rollback decisions, the fleet lock, values resolved once, the operator's screen and textfile, refs, calibration from a run's records, the pin gate's steps and verdict.

Modules: runctx, records, fleetplan, dryrun, rolling, rollback, lock, once, metrics, screen, refs, calibrate, pyinfra_version, pingate.
"""
