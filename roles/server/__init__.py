"""Server: one hardened llama-server@<gpu>.service per GPU, flags from the plan.

Before anything restarts, every rendered flag is checked against the new binary's own
--help (a stale flag such as the seed's --draft-max is refused with its replacement);
then `current` is switched atomically, and only the instances whose unit, environment,
binary or model changed restart, one at a time, each waiting for /health.
"""
from __future__ import annotations

import hashlib
from io import StringIO
from pathlib import Path

import jinja2
from pyinfra import host
from pyinfra.api import OperationError, deploy, operation
from pyinfra.facts.files import Sha1File
from pyinfra.operations import files, server as server_ops

from roles.facts import HelpText, Releases, ServerInstances
from roles.llama_cpp import host_fingerprint
from voltafleet import flags as flagmod
from voltafleet.fingerprint import releases_to_prune

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
ENV_DIR = "/etc/voltafleet/llama-server"
GOOD_DIR = "/etc/voltafleet/good"
UNIT_PATH = "/etc/systemd/system/llama-server@.service"
API_KEY_PATH = "/etc/voltafleet/api-key"
START_TIMEOUT = 900  # seconds to load ~15 GB from disk into VRAM, with margin

# What the last `configured` run decided, per host, for `restarted` and the smoke test.
RUNTIME: dict[str, dict] = {}


def render_unit(cfg: dict, systemd_version: int) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return env.get_template("llama-server@.service.j2").render(
        user=cfg["server_user"], root=cfg["voltafleet_root"], env_dir=ENV_DIR,
        model_dir=cfg["model_dir"], cuda=cfg["voltafleet_backend"] == "cuda",
        start_timeout=START_TIMEOUT, restart_backoff=systemd_version >= 254)


def health_url(cfg: dict, port: int) -> str:
    h = cfg["server_host"]
    return f"http://{'127.0.0.1' if h in ('0.0.0.0', '::', '') else h}:{port}/health"


def render_envs(ctx: dict) -> dict[int, tuple[list[str], str]]:
    """{instance: (llama-server argv, environment file text)}."""
    cfg = ctx["cfg"]
    key = API_KEY_PATH if cfg["server_api_key_file"] else None
    out = {}
    for inst in ctx["instances"]:
        args = flagmod.server_args(cfg, ctx["model_path"], inst.port, key, ctx["draft_path"])
        text = flagmod.env_file(inst.index, args, cfg["voltafleet_backend"] == "cuda")
        out[inst.index] = (args, text + f"LLAMA_HEALTH_URL={health_url(cfg, inst.port)}\n")
    return out


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


@operation()
def configured(ctx: dict, model_changed=None):
    """Check flags against the release's --help, then write unit and env files and switch
    `current`. Records which instances must restart.

    + ctx: the preflight context
    + model_changed: callable, true when the model operation replaced the file

    .. code:: python

        server.configured(ctx, model_changed=lambda: any(op.changed for op in model_ops))
    """
    cfg = ctx["cfg"]
    root = cfg["voltafleet_root"]
    fp = host_fingerprint(host, ctx)
    envs = render_envs(ctx)
    unit = render_unit(cfg, ctx["basics"]["systemd"])
    if fp is not None:
        help_text = host.get_fact(HelpText, binary=f"{root}/releases/{fp}/bin/llama-server")
        if help_text is not None:
            errors = [e for args, _ in envs.values() for e in flagmod.check_against_help(args, help_text)]
            if errors:
                raise OperationError("llama-server flags refused, nothing restarted:\n  "
                                     + "\n  ".join(sorted(set(errors))))
    releases = host.get_fact(Releases, root=root)
    switch = fp is None or releases["current"] != fp
    unit_changed = host.get_fact(Sha1File, path=UNIT_PATH) != _sha1(unit)
    env_changed = {i for i, (_, text) in envs.items()
                   if host.get_fact(Sha1File, path=f"{ENV_DIR}/{i}.env") != _sha1(text)}
    everything = switch or unit_changed or bool(model_changed and model_changed())
    restart = sorted(envs) if everything else sorted(env_changed)
    live = host.get_fact(ServerInstances, env_dir=ENV_DIR)
    RUNTIME[host.name] = {"restart": restart, "fingerprint": fp,
                          "retired": sorted(set(live) - set(envs)),
                          "not_running": sorted(i for i in envs if live.get(i, {}).get("active") != "active"
                                                or live.get(i, {}).get("enabled") != "enabled")}

    yield from files.directory._inner(path=ENV_DIR, mode="755")
    for i, (_, text) in envs.items():
        if i in env_changed:
            yield from files.put._inner(src=StringIO(text), dest=f"{ENV_DIR}/{i}.env", mode="644")
    if unit_changed:
        yield from files.put._inner(src=StringIO(unit), dest=UNIT_PATH, mode="644")
        yield "systemctl daemon-reload"
    if switch and fp is not None:
        yield f"ln -sfn releases/{fp} {root}/current.tmp && mv -T {root}/current.tmp {root}/current"
        protect = {fp, releases["good"], releases["current"]} - {None}
        old = [(name, r["mtime"]) for name, r in releases["releases"].items()]
        for name in releases_to_prune(old + [(fp, float("inf"))], cfg["llama_cpp_keep_releases"], protect):
            yield f"rm -rf {root}/releases/{name} {root}/releases/{name}.tar.gz {root}/build/{name} {root}/build/{name}.log {root}/build/{name}.seconds"


@operation()
def restarted(ctx: dict):
    """Start, restart (one at a time, each waiting for /health) or retire instances, as
    `configured` decided.

    .. code:: python

        server.restarted(ctx)
    """
    plan = RUNTIME.get(host.name, {})
    for i in plan.get("retired", []):
        yield f"systemctl disable --now llama-server@{i}.service; rm -f {ENV_DIR}/{i}.env"
    todo = sorted(set(plan.get("restart", [])) | set(plan.get("not_running", [])))
    RUNTIME.setdefault(host.name, {})["restarted"] = todo  # before any yield: prepare stops at the first
    for i in todo:
        yield f"systemctl enable llama-server@{i}.service && systemctl restart llama-server@{i}.service"


@deploy("Server")
def server(ctx: dict, model_ops=()) -> None:
    """Service user, API key file, unit, per-instance flags; restart what changed.

    .. code:: python

        server(ctx, model_ops)
    """
    cfg = ctx["cfg"]
    server_ops.group(name="Service group", group=cfg["server_user"], system=True)
    server_ops.user(name="Service user (no shell, no home)", user=cfg["server_user"],
                    group=cfg["server_user"], system=True, shell="/usr/sbin/nologin",
                    home="/nonexistent", create_home=False)
    if cfg["server_api_key_file"]:
        files.put(name="API key file (0600, service user only)", src=cfg["server_api_key_file"],
                  dest=API_KEY_PATH, user=cfg["server_user"], group=cfg["server_user"], mode="600")
    else:
        files.file(name="No API key file", path=API_KEY_PATH, present=False)
    configured(name="Check flags, write unit and instances, switch release", ctx=ctx,
               model_changed=lambda: any(op.changed for op in model_ops))
    restarted(name="Restart changed instances one at a time", ctx=ctx)
