"""The llama-server@.service unit as the server role installs it (templates/llama-server@.service.j2
with files.template's jinja2 settings): rendered here too for the plan (is the unit on the host
the one a rollout would install?), the tests and the benchmarks."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

from voltafleet.hostplan import ENV_DIR

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"
UNIT_TEMPLATE = TEMPLATES / "llama-server@.service.j2"
JINJA = {"trim_blocks": True, "lstrip_blocks": True}
START_TIMEOUT = 900  # seconds to load ~15 GB from disk into VRAM, with margin


def unit_vars(cfg: dict, systemd_version: int) -> dict:
    return dict(service_user=cfg["server_user"], root=cfg["voltafleet_root"], env_dir=ENV_DIR,
                model_dir=cfg["model_dir"], cuda=cfg["voltafleet_backend"] == "cuda",
                start_timeout=START_TIMEOUT, restart_backoff=systemd_version >= 254)


def render_unit(cfg: dict, systemd_version: int) -> str:
    """The unit as files.template renders it (same template, same jinja2 settings); rendered
    once per distinct set of inputs (a fleet's hosts mostly share one)."""
    return _render(tuple(sorted(unit_vars(cfg, systemd_version).items())))


@lru_cache(maxsize=64)
def _render(items: tuple) -> str:
    return _template().render(**dict(items))


@lru_cache(maxsize=1)
def _template() -> jinja2.Template:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, **JINJA)
    return env.get_template(UNIT_TEMPLATE.name)
