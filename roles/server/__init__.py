"""Server: one hardened llama-server@<gpu>.service per GPU, flags from the plan.

Before anything restarts, every rendered flag is checked against the new binary's own
--help (a stale flag such as the seed's --draft-max is refused with its replacement);
then `current` is switched atomically. Which instances restart (those whose unit,
environment, binary or model changed) is returned to the activation role, which restarts them
drained, one at a time, smokes them and rolls the host back on any failure.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import OperationError, StringCommand, deploy, operation
from pyinfra.operations import files, server as server_ops

from roles.factcache import host_fact, host_fingerprint

from roles.run import sources

from roles.shell import bin_path
from roles.filesync import ChangeLog, FileChange, FilesState, Wanted, synced
from roles.facts import HelpText, Releases, ServerInstances, ServiceAccount
from voltafleet.planning import flags as flagmod
from voltafleet.ground.errors import format_errors
from voltafleet.planning.fingerprint import releases_to_prune
from voltafleet.planning.hostplan import API_KEY_PATH, ENV_DIR, UNIT_PATH, HostPlan
from voltafleet.planning.unitfile import (MEMORY_PLAN_PATH, MEMORY_UNIT, MEMORY_UNIT_PATHS, memory_plan_file, memory_units,
                                 plan_unit)


def _release(plan: HostPlan) -> str | None:
    """This host's release fingerprint; None in the prepare phase of a fresh host."""
    return host_fingerprint(host, plan.build)


NO_SHELL, NO_HOME = "/usr/sbin/nologin", "/nonexistent"


@operation()
def service_account(user: str):
    """The service's system group and its user (no shell, no home): what server.group(group=user,
    system=True) then server.user(user, group=user, system=True, shell=/usr/sbin/nologin,
    home=/nonexistent, create_home=False, ensure_home=False) do. Where both are as wanted, one
    fact read says so (those two operations read five facts, one of them every user's lastlog);
    anywhere else, their own code runs, with their own facts and commands.

    .. code:: python

        server.service_account(user="llama")
    """
    account = host.get_fact(ServiceAccount, user=user)
    if account["group"] and account["home"] == NO_HOME and account["shell"] == NO_SHELL \
            and account["primary"] == user:
        host.noop(f"group {user} and user {user} exist as wanted")
        return
    yield from server_ops.group._inner(group=user, system=True)
    yield from server_ops.user._inner(user=user, group=user, system=True, shell=NO_SHELL, home=NO_HOME,
                                      create_home=False, ensure_home=False)


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
        args, plan.settings.server.extra_flags, help_text, source=src)))
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
    releases = host_fact(host, Releases, root=plan.root)
    if fp is None:
        yield StringCommand("# switch current to this host's release once it is built")
        return
    if releases["current"] == fp:
        return
    q = shlex.quote
    yield f"{q(bin_path(plan, 'vf-atomic'))} link {q(plan.root + '/current')} {q('releases/' + fp)}"
    protect = {fp, releases["good"], releases["current"]} - {None}
    old = [(name, r["mtime"]) for name, r in releases["releases"].items()]
    prune = releases_to_prune(old + [(fp, float("inf"))], plan.settings.build.keep_releases, protect)
    if prune:
        yield " ".join(q(a) for a in (bin_path(plan, "vf-release"), "prune", plan.root, *prune))


@operation()
def retired(plan: HostPlan):
    """Stop and remove instances the plan no longer has (fewer GPUs, server_instances lowered).

    .. code:: python

        server.retired(plan)
    """
    live = host.get_fact(ServerInstances, env_dir=ENV_DIR)
    for i in sorted(set(live) - {inst.index for inst in plan.instances}):
        yield f"systemctl disable --now llama-server@{i}.service; rm -f {shlex.quote(f'{ENV_DIR}/{i}.env')}"


@dataclass(frozen=True)
class Changes:
    """The operations whose changes restart instances: an instance's environment file
    restarts that instance; the unit, the release switch or a model restarts every one."""
    env_ops: dict
    everything_ops: tuple


@deploy("Server")
def server(plan: HostPlan, model_ops=()):
    """Service user, API key file, unit, per-instance flags, the release switch. Returns the
    Changes that decide which instances the activation role restarts (drained, one at a time).

    .. code:: python

        changes = server(plan, model_ops)
    """
    cfg = plan.settings
    user = cfg.server.user
    service_account(name="Service group and user (no shell, no home)", user=user)
    if cfg.server.api_key_file:
        files.put(name="API key file (0600, service user only)", src=cfg.server.api_key_file,
                  dest=API_KEY_PATH, user=user, group=user, mode="600")
    else:
        files.file(name="No API key file", path=API_KEY_PATH, present=False)
    flags_accepted(name="The release's llama-server accepts every flag", plan=plan)
    envs, directories = env_files(plan)
    log = ChangeLog()
    ports = [i.port for i in plan.instances]
    env_op = synced(name=f"Instance flags ({len(envs)} instances, ports {min(ports, default=0)}-{max(ports, default=0)})",
                    files=list(envs.values()), directories=directories, log=log)
    env_ops = {index: FileChange(env_op, log, f.dest) for index, f in envs.items()}
    unit = synced(name="llama-server@.service (systemd reloaded when it changed)", files=[unit_file(plan)],
                  then=["systemctl daemon-reload"])
    if cfg.smoke.textfile_dir:  # not among the changes that restart: a new plan file restarts nothing
        synced(name=f"{MEMORY_UNIT}.timer: each instance's memory beside its plan, for node_exporter",
               files=memory_files(plan), then=memory_timer_started())
    else:
        memory_timer_removed(name=f"No {MEMORY_UNIT}.timer (smoke_textfile_dir is null)")
    switch = release_switched(name="Switch `current` to this release", plan=plan)
    retired(name="Retire instances the plan no longer has", plan=plan)
    return Changes(env_ops, (unit, switch, *(op for op in model_ops if op is not None)))


def env_files(plan: HostPlan) -> tuple[dict[int, Wanted], list[tuple[str, str]]]:
    """({instance: its environment file}, the directory): what the flags operation puts in place."""
    return ({i.index: Wanted(f"{ENV_DIR}/{i.index}.env", "644", text=plan.env_file(i.index)) for i in plan.instances},
            [(ENV_DIR, "755")])


def unit_file(plan: HostPlan) -> Wanted:
    """llama-server@.service as files.template rendered it (voltafleet.planning.unitfile, once per distinct
    input), with the host-memory plan's MemoryMax and server_oom_score_adjust."""
    return Wanted(UNIT_PATH, "644", text=plan_unit(plan))


def memory_files(plan: HostPlan) -> list[Wanted]:
    """The memory textfile's plan file (each instance's planned bytes), its service and timer;
    the script itself is a helper (roles/server/files/vf-memory-textfile.sh, roles/helpers)."""
    units = [Wanted(path, "644", text=text) for path, text in memory_units(plan.settings).items()]
    return [Wanted(MEMORY_PLAN_PATH, "644", text=memory_plan_file(plan)), *units]


def memory_timer_started() -> list[str]:
    """After any change: systemd reloaded, the timer enabled and (re)started with its new text."""
    return ["systemctl daemon-reload", f"systemctl enable {MEMORY_UNIT}.timer",
            f"systemctl restart {MEMORY_UNIT}.timer"]


@operation()
def memory_timer_removed():
    """Without a textfile directory: the memory timer, its service and plan file gone, where a
    run with one installed them (one fact read; nothing where they are absent).

    .. code:: python

        server.memory_timer_removed()
    """
    paths = [MEMORY_PLAN_PATH, *MEMORY_UNIT_PATHS.values()]
    if all(s["type"] == "none" for s in host.get_fact(FilesState, paths=paths)):
        host.noop(f"no {MEMORY_UNIT}.timer")
        return
    yield (f"systemctl disable --now {MEMORY_UNIT}.timer 2>/dev/null; rm -f {' '.join(map(shlex.quote, paths))} "
           "&& systemctl daemon-reload")
