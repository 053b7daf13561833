"""Which llama-server instances a rollout starts, restarts or retires: decided from what
changed (pyinfra's own change tracking of the earlier operations) and what runs now."""
from __future__ import annotations


def restart_set(wanted: list[int], env_changed: set[int], everything: bool,
                live: dict[int, dict]) -> tuple[list[int], list[int]]:
    """(instances to (re)start, instances to retire).

    wanted: the plan's instances; env_changed: those whose environment file changes;
    everything: the unit, the release or the model changes (every instance restarts);
    live: {index: {"active": ..., "enabled": ...}} as systemd reports them now.
    An instance that is not active and enabled is started whatever changed.
    """
    retire = sorted(set(live) - set(wanted))
    down = {i for i in wanted
            if live.get(i, {}).get("active") != "active" or live.get(i, {}).get("enabled") != "enabled"}
    restart = set(wanted) if everything else (set(env_changed) | down)
    return sorted(restart & set(wanted)), retire
