"""Server: one hardened llama-server@<gpu>.service per GPU, flags from the plan.

Before anything restarts, every rendered flag is checked against the new binary's own
--help (a stale flag such as the seed's --draft-max is refused with its replacement);
then `current` is switched atomically, and only the instances whose unit, environment,
binary or model changed restart, one at a time, each waiting for /health.
"""
from __future__ import annotations

import shlex
from io import StringIO
from pathlib import Path

import jinja2
from pyinfra import host
from pyinfra.api import FunctionCommand, OperationError, StringCommand, deploy, operation
from pyinfra.operations import files, server as server_ops, systemd

from roles import gateway
from roles.common import changes, sh, sources
from roles.facts import HelpText, Releases, ServerInstances
from roles.helpers import bin_path
from roles.llama_cpp import host_fingerprint
from voltafleet import flags as flagmod
from voltafleet.errors import format_errors
from voltafleet.fingerprint import releases_to_prune
from voltafleet.hostplan import API_KEY_PATH, ENV_DIR, UNIT_PATH, HostPlan
from voltafleet.restarts import restart_set

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
UNIT_TEMPLATE = TEMPLATES / "llama-server@.service.j2"
JINJA = {"trim_blocks": True, "lstrip_blocks": True}
START_TIMEOUT = 900  # seconds to load ~15 GB from disk into VRAM, with margin


def unit_vars(cfg: dict, systemd_version: int) -> dict:
    return dict(service_user=cfg["server_user"], root=cfg["voltafleet_root"], env_dir=ENV_DIR,
                model_dir=cfg["model_dir"], cuda=cfg["voltafleet_backend"] == "cuda",
                start_timeout=START_TIMEOUT, restart_backoff=systemd_version >= 254)


def render_unit(cfg: dict, systemd_version: int) -> str:
    """The unit as files.template renders it (same template, same jinja2 settings)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, **JINJA)
    return env.get_template(UNIT_TEMPLATE.name).render(**unit_vars(cfg, systemd_version))


def _release(plan: HostPlan) -> str | None:
    """This host's release fingerprint; None in the prepare phase of a fresh host."""
    return host_fingerprint(host, plan.build)


@operation()
def flags_accepted(plan: HostPlan):
    """Fail the host, before anything restarts, unless the release's own llama-server
    accepts every rendered flag.

    .. code:: python

        server.flags_accepted(plan)
    """
    fp = _release(plan)
    binary = f"{plan.root}/releases/{fp}/bin/llama-server"
    help_text = host.get_fact(HelpText, binary=binary) if fp else None
    if help_text is None:
        if host.state.is_executing:
            raise OperationError(f"{host.name}: release {fp} is missing ({binary} not found): its build "
                                 "host failed or was lost. Nothing was switched or restarted. Fix: re-run "
                                 "the rollout; the release is then built again.")
        return
    src = sources().get("server_extra_flags")
    problems = list(dict.fromkeys(p for args in plan.argv.values() for p in flagmod.binary_flag_problems(
        args, plan.cfg["server_extra_flags"], help_text, source=src)))
    if problems:
        raise OperationError(format_errors(host.name, problems, "llama-server flags refused, nothing restarted"))
    return
    yield  # an operation is a generator; this one only checks


@operation()
def release_switched(plan: HostPlan):
    """Point `current` at this host's release (atomically) and prune old releases, keeping
    llama_cpp_keep_releases plus current and the last good.

    .. code:: python

        server.release_switched(plan)
    """
    fp = _release(plan)
    releases = host.get_fact(Releases, root=plan.root)
    if fp is None:
        yield StringCommand("# switch current to this host's release once it is built")
        return
    if releases["current"] == fp:
        return
    q = shlex.quote
    yield f"{q(bin_path(plan, 'vf-atomic'))} link {q(plan.root + '/current')} {q('releases/' + fp)}"
    protect = {fp, releases["good"], releases["current"]} - {None}
    old = [(name, r["mtime"]) for name, r in releases["releases"].items()]
    prune = releases_to_prune(old + [(fp, float("inf"))], plan.cfg["llama_cpp_keep_releases"], protect)
    if prune:
        yield " ".join(q(a) for a in (bin_path(plan, "vf-release"), "prune", plan.root, *prune))


@operation()
def restarted(plan: HostPlan, env_ops: dict, everything_ops: list):
    """Start, restart (one at a time, each waiting for /health) or retire instances: every
    instance when one of `everything_ops` (unit, release, model) changes the host, else
    those whose environment file changes, plus any that is not running.

    .. code:: python

        server.restarted(plan, env_ops={0: env0, 1: env1}, everything_ops=[unit, switch, *model_ops])
    """
    live = host.get_fact(ServerInstances, env_dir=ENV_DIR)
    todo, retire = restart_set(sorted(env_ops), {i for i, op in env_ops.items() if changes(op)},
                               any(changes(op) for op in everything_ops), live)
    for i in retire:
        yield f"systemctl disable --now llama-server@{i}.service; rm -f {shlex.quote(f'{ENV_DIR}/{i}.env')}"
    for i in todo:
        if gateway.gateway_hosts(host.state):  # out of the gateway's rotation first, streams finished
            yield FunctionCommand(_drained_restart, (plan, i), {})
        else:
            yield restart_command(i)


def restart_command(index: int) -> str:
    """Enable and restart one instance; `active` only once /health answers (ExecStartPost)."""
    unit = f"llama-server@{index}.service"
    # reset-failed: a unit that crash-looped into its start limit would refuse the restart
    return f"systemctl reset-failed {unit} 2>/dev/null; systemctl enable {unit} && systemctl restart {unit}"


def _drained_restart(state, host, plan: HostPlan, index: int) -> None:
    """Drain the instance on every gateway (waiting for its streams), restart it, and, when
    no smoke test will judge it, put it straight back."""
    gateway.drain(state, host.name, index, plan.cfg["gateway_drain_timeout_s"])
    ok, out = sh(host, restart_command(index))
    if not ok:
        raise OperationError(f"{host.name}: llama-server@{index} did not come back: {out.stderr.strip()}")
    if not plan.cfg["smoke_enabled"]:
        gateway.ready(state, host.name, [index])


@deploy("Server")
def server(plan: HostPlan, model_ops=()):
    """Service user, API key file, unit, per-instance flags; restart what changed. Returns
    the restart operation (the smoke test runs when it changed the host).

    .. code:: python

        restart_op = server(plan, model_ops)
    """
    cfg = plan.cfg
    user = cfg["server_user"]
    server_ops.group(name="Service group", group=user, system=True)
    server_ops.user(name="Service user (no shell, no home)", user=user, group=user, system=True,
                    shell="/usr/sbin/nologin", home="/nonexistent", create_home=False, ensure_home=False)
    if cfg["server_api_key_file"]:
        files.put(name="API key file (0600, service user only)", src=cfg["server_api_key_file"],
                  dest=API_KEY_PATH, user=user, group=user, mode="600")
    else:
        files.file(name="No API key file", path=API_KEY_PATH, present=False)
    flags_accepted(name="The release's llama-server accepts every flag", plan=plan)
    files.directory(name="Instance directory", path=ENV_DIR, mode="755")
    env_ops = {i.index: files.put(name=f"Instance {i.index} flags (port {i.port})", src=StringIO(plan.env_file(i.index)),
                                  dest=f"{ENV_DIR}/{i.index}.env", mode="644")
               for i in plan.instances}
    unit = files.template(name="llama-server@.service", src=str(UNIT_TEMPLATE), dest=UNIT_PATH, mode="644",
                          jinja_env_kwargs=JINJA, **unit_vars(cfg, plan.facts.systemd))
    systemd.daemon_reload(name="Reload systemd after a unit change", _if=unit.did_change)
    switch = release_switched(name="Switch `current` to this release", plan=plan)
    return restarted(name="Restart changed instances one at a time", plan=plan, env_ops=env_ops,
                     everything_ops=[unit, switch, *(op for op in model_ops if op is not None)])
