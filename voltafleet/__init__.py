"""voltafleet's pure logic: no pyinfra import here, so every piece is unit-tested alone.

One subpackage a stage of the flow:

- inputs: The variables users set: their types, ranges and checks, the group_vars loader, the refusal format, the grammars of values that reach a shell, the model pin.
- planning: What one host will serve and what it takes, decided from data before any change: the host plan, VRAM, host memory, CPU and NUMA, server flags, the build fingerprint, the unit file, restarts, the --plan dry run and its timeline.
- state: A rollout's state on the controller: the run contract and its records, the fleet plan decided once, batches and verdicts, rollback decisions, the fleet lock, values resolved once, the operator's screen and textfile, refs, calibration from a run's records.
- front: The gateway in front of the servers (HAProxy): backends and runtime commands, teams and their limits, tiers, token budgets, the admin socket.
- gpu: The NVIDIA stack and the boards: driver and toolkit packages for Volta fleets, GPU health.
- models: The model: its GGUF header, its size and verified state, the golden probe, the download mirrors.
- measure: What is measured on the servers and judged on the controller: the smoke test's client and verdict, the tune's workload client, the workload profile from logs, the autotune's choices.
"""
