"""The llama-server@.service unit as the server role installs it (templates/llama-server@.service.j2
with files.template's jinja2 settings): rendered here too for the plan (is the unit on the host
the one a rollout would install?), the tests and the benchmarks. Beside it, the memory textfile's
timer and service (templates/voltafleet-memory.*.j2), the plan file its script reads and the
folder where each instance's stop folds its cgroup's memory events (MEMORY_EVENTS_DIR).

    >>> plan_unit(plan)                # the unit with the host-memory plan's ceiling (plan.hostmem)
    >>> memory_plan_file(plan)         # '# voltafleet ...\\nhost gpu-01\\ninstance 0 41234567890\\n...'
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

from voltafleet.inputs.settings import Settings
from voltafleet.planning import hostmem
from voltafleet.planning.hostplan import ENV_DIR, HostPlan

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
UNIT_TEMPLATE = TEMPLATES / "llama-server@.service.j2"
JINJA = {"trim_blocks": True, "lstrip_blocks": True}
START_TIMEOUT = 900  # seconds to load ~15 GB from disk into VRAM, with margin

# The memory textfile (roles/server/files/vf-memory-textfile.sh, every MEMORY_PERIOD_S seconds)
MEMORY_PLAN_PATH = "/etc/voltafleet/memory-plan"  # each instance's planned bytes, as the script reads them
MEMORY_UNIT = "voltafleet-memory"
MEMORY_UNIT_PATHS = {kind: f"/etc/systemd/system/{MEMORY_UNIT}.{kind}" for kind in ("service", "timer")}
MEMORY_TEXTFILE = "voltafleet-memory.prom"
MEMORY_PERIOD_S = 30
# Each instance's memory.events (v1: failcnt, oom_kill) summed over its runs: the unit's ExecStopPost
# (`vf-memory-textfile --fold N`) adds its ending cgroup's counts there, the textfile adds the running
# one's. On /run: counts since boot, as the kernel's are. The script's own default (VF_EVENTS).
MEMORY_EVENTS_DIR = "/run/voltafleet/memory-events"


def ceiling(memory: hostmem.HostMemoryPlan | None) -> hostmem.HostMemoryPlan | None:
    """The host-memory plan (voltafleet.planning.hostmem.HostMemoryPlan) whose numbers the unit and the alert may
    use, or None: no plan, a plan that leaves terms out (no GGUF header: model and checkpoints
    count 0, a ceiling there would kill a healthy server) or an unbounded host cache (no number
    bounds it)."""
    if memory is None or memory.unplanned or memory.cache_unbounded:
        return None
    return memory


def unit_vars(cfg: Settings, systemd_version: int, memory: hostmem.HostMemoryPlan | None = None) -> dict:
    """The template's inputs; `memory`: the host-memory plan (voltafleet.planning.hostmem.HostMemoryPlan) or None,
    whose per-instance MemoryMax= the unit carries (the same for every instance; no MemoryHigh:
    voltafleet.planning.hostmem)."""
    memory = ceiling(memory)
    return dict(service_user=cfg.server.user, root=cfg.preflight.root, env_dir=ENV_DIR,
                model_dir=cfg.model.dir, cuda=cfg.preflight.backend == "cuda",
                start_timeout=START_TIMEOUT, restart_backoff=systemd_version >= 254,
                oom_score_adjust=cfg.server.oom_score_adjust,
                memory_max=None if memory is None else int(memory.memory_max))


def render_unit(cfg: Settings, systemd_version: int, memory: hostmem.HostMemoryPlan | None = None) -> str:
    """The unit as files.template renders it (same template, same jinja2 settings); rendered
    once per distinct set of inputs (a fleet's hosts mostly share one)."""
    return _render(UNIT_TEMPLATE.name, tuple(sorted(unit_vars(cfg, systemd_version, memory).items())))


def plan_unit(plan: HostPlan) -> str:
    """The unit of this host's plan: what the server role installs and the dry run compares
    with the host's."""
    return render_unit(plan.settings, plan.facts.systemd, plan.hostmem)


def memory_plan_file(plan: HostPlan) -> str:
    """The plan file the memory textfile's script reads: the host's name (its `host` label, as
    in voltafleet.prom) and each instance's planned bytes (voltafleet.planning.hostmem's per-instance
    total, then its `held`: what the kernel cannot reclaim; "- -" without a usable host-memory plan: `ceiling`). Not read back from the unit (`systemctl show`): its
    directives say what was asked, not what the kernel enforces (nothing in the lab's containers)."""
    memory = ceiling(plan.hostmem)
    planned = "- -" if memory is None else f"{int(memory.instance.total)} {int(memory.instance.held)}"
    lines = ["# voltafleet (roles/server): this host's memory plan (voltafleet.planning.hostmem), read by vf-memory-textfile",
             f"host {plan.host}"]
    return "\n".join(lines + [f"instance {i.index} {planned}" for i in plan.instances]) + "\n"


def memory_units(cfg: Settings) -> dict[str, str]:
    """{path: text} of voltafleet-memory.service (the script, once, hardened) and its timer
    (every MEMORY_PERIOD_S seconds)."""
    values = tuple(sorted(dict(root=cfg.preflight.root, textfile_dir=cfg.smoke.textfile_dir,
                               plan=MEMORY_PLAN_PATH, period=MEMORY_PERIOD_S, unit=MEMORY_UNIT).items()))
    return {path: _render(f"{MEMORY_UNIT}.{kind}.j2", values) for kind, path in MEMORY_UNIT_PATHS.items()}


@lru_cache(maxsize=64)
def _render(name: str, items: tuple) -> str:
    return _template(name).render(**dict(items))


@lru_cache(maxsize=4)
def _template(name: str) -> jinja2.Template:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, **JINJA)
    return env.get_template(name)
