"""llama.cpp: a release per build fingerprint, compiled once per fingerprint (shared) or on
every host (per_host), never switched in here: the server role switches `current` only
after the new binary accepted every flag it will be started with.

Layout on a host (voltafleet_root, default /opt/voltafleet):
    src/llama.cpp         git work tree at the pinned commit (building hosts)
    build/<fp>/           CMake build tree (only where it was compiled)
    releases/<fp>/bin/    llama-server, llama-bench; BUILD_INFO.json
    current -> releases/<fp>   what the servers run
    good    -> releases/<fp>   the last release that passed the smoke test
"""
from __future__ import annotations

import hashlib
import shlex
import time
from pathlib import Path

from gevent.lock import Semaphore
from pyinfra import host, logger
from pyinfra.api import FunctionCommand, OperationError, StringCommand, deploy, operation

from roles.factcache import host_fact, host_fingerprint

from roles.gateway_api import is_server

from roles.run import fleet_plan, host_config, once_per_run, report_dir, run_context

from roles.shell import bin_path, connector_args, live, sh
from roles.facts import HostBasics, NvccVersion, Releases
from voltafleet.planning import hostplan
from voltafleet.state.fleetplan import archive_built_on, release_builder, release_cache, release_cached
from voltafleet.planning.hostplan import HostPlan
from voltafleet.state.records import Build
from voltafleet.state.runctx import RunDir

REPO = Path(__file__).resolve().parents[2]
RELEASE_CACHE = release_cache(REPO)


def builder_of(fp: str) -> str:
    """Shared strategy: of the hosts in this run, the first (inventory order) with this
    fingerprint compiles it; the others receive it."""
    plan = fleet_plan()
    if plan and fp in plan.builders:  # decided once per rollout, from every host's preflight
        return plan.builders[fp]
    key = (host.state, host.state.is_executing)
    if fp not in run_builders(*key):  # a fingerprint that appeared since (a compiler installed by now)
        run_builders.forget(lambda k: k != key)
    return run_builders(*key).get(fp, host.name)


def later_batches_need(fp: str) -> bool:
    """A rolling rollout (its fleet plan) has other server hosts of this fingerprint: batches that run
    without its builder and install the release from the controller's cache. A plain run has every host
    in it: they take the release from the builder itself."""
    plan = fleet_plan()
    return bool(plan) and sum(s.fingerprint == fp for s in plan.servers) > 1


@once_per_run
def run_builders(state, executing: bool) -> dict[str, str]:
    """{fingerprint: the first host (inventory order) of this run that has it}, over the hosts
    of the shared strategy, from their live facts: decided once per run stage (prepare,
    execute: the toolchain role may bring a host its compiler in between), one pass over the
    fleet, not one per host."""
    out: dict[str, str] = {}
    for other in state.inventory:
        if other not in state.active_hosts or not is_server(other) \
                or host_config(other).build.strategy != "shared":  # a gateway or a mirror builds nothing
            continue
        fp = host_fingerprint(other)
        if fp is not None:
            out.setdefault(fp, other.name)
    return out


def build_command(plan: HostPlan, fp: str, toolkit: str | None, cxx: str) -> str:
    """The command that compiles release `fp` on a host (also run as is on the GPU box)."""
    b = plan.build
    info = {"fingerprint": fp, "commit": b.commit, "flags": list(b.flags), "toolkit": toolkit,
            "compiler": cxx, "built_on": plan.host, "repo": b.repo}
    args = hostplan.build_argv(bin_path(plan, "vf-build-release"), plan.root, fp, b,
                               plan.settings.build.jobs, info)
    return " ".join(shlex.quote(a) for a in args)


@operation()
def compiled(plan: HostPlan, strategy: str):
    """Compile this host's release unless it has it (or, shared, another host compiles it).

    .. code:: python

        llama_cpp.compiled(plan, strategy="shared")
    """
    fp = host_fingerprint(host, plan.build)
    if fp is None:  # prepare phase on a fresh host: the compiler comes with the toolchain role
        yield StringCommand(f"# compile llama.cpp {plan.build.commit[:12]} once the compiler is installed")
        return
    if fp in host_fact(host, Releases, root=plan.root)["releases"]:
        if strategy == "shared" and later_batches_need(fp) and builder_of(fp) == host.name and not cached(fp):
            # here already (a run that compiled it stopped before its archive reached the controller): the
            # later batches install it from the controller's cache, so it goes there now
            yield FunctionCommand(lambda state, host: _archive_from(host, plan.root, fp), (), {})
        return
    if strategy == "shared" and (cached(fp) or builder_of(fp) != host.name):
        return  # shipped: from the controller's cache, or from the host that compiles it now
    toolkit = host_fact(host, NvccVersion, path=f"{plan.build.cuda_bin}/nvcc") if plan.build.cuda_bin else None
    yield live(build_command(plan, fp, toolkit, host_fact(host, HostBasics)["cxx"]))
    yield FunctionCommand(_built, (plan, fp), {})
    if strategy == "shared":  # later batches of a rolling rollout install it without compiling again
        yield FunctionCommand(lambda state, host: _archive_from(host, plan.root, fp), (), {})


def _built(state, host, plan: HostPlan, fp: str) -> bool:
    """build-<host>.json: release fp compiled here, in the seconds vf-build-release kept
    (build/<fp>.seconds: configure and build; None when it cannot be read)."""
    ok, out = sh(host, "cat -- " + shlex.quote(f"{plan.root}/build/{fp}.seconds"))
    try:
        seconds = float(out.stdout.strip()) if ok else None
    except ValueError:
        seconds = None
    RunDir(report_dir(plan.settings)).write(Build(host=host.name, run=run_context().run, fingerprint=fp, built=True,
                                             seconds=seconds))
    return True


def cached(fp: str) -> bool:
    """The controller holds release fp's archive (and its checksum) from an earlier build."""
    return release_cached(RELEASE_CACHE, fp)


_ARCHIVE_LOCKS: dict[str, Semaphore] = {}


def _archive_from(builder, root: str, fp: str) -> Path:
    """The release archive in the controller cache, fetched from the builder once even when
    many hosts ask for it at the same time."""
    with _ARCHIVE_LOCKS.setdefault(fp, Semaphore()):
        archive = RELEASE_CACHE / f"{fp}.tar.gz"
        if cached(fp):
            return archive
        RELEASE_CACHE.mkdir(parents=True, exist_ok=True)
        remote = f"{root}/releases/{fp}.tar.gz"
        ok, out = sh(builder,
            " ".join(shlex.quote(a) for a in (f"{root}/bin/vf-release", "pack", root, fp)))
        if not ok:
            raise OperationError(f"{builder.name} could not pack release {fp} to ship ({out.stderr.strip()}): "
                                 "its compiler or toolkit differs from this host's? Fix: align the hosts, or "
                                 "set llama_cpp_build_strategy: per_host for this group.")
        tmp = archive.with_suffix(".part")
        if not builder.get_file(remote, str(tmp), **connector_args(builder)):
            raise OperationError(f"could not fetch {remote} from {builder.name}")
        sha = hashlib.sha256(tmp.read_bytes()).hexdigest()
        # who compiled it (the host it came from may itself have received it), for the hosts it reaches
        archive.with_suffix(".builder").write_text((archive_built_on(tmp, fp) or builder.name) + "\n")
        tmp.rename(archive)
        archive.with_suffix(".sha256").write_text(sha + "\n")
        return archive


def _ship(state, host, plan: HostPlan, fp: str) -> bool:
    """Install release fp from its builder (through the controller's cache). A builder that
    failed or was lost fails this host in one line: nothing is switched or restarted."""
    builder_name = builder_of(fp)
    builder = state.inventory.get_host(builder_name)
    try:
        if not cached(fp) and builder not in state.active_hosts:
            raise OperationError("it is no longer in this run")
        archive = _archive_from(builder, plan.root, fp)
    except Exception as e:  # a lost builder (SSH gone, pack failed): one line, never a traceback
        host.log_styled(f"release {fp} is missing: its build host {builder_name} failed or was lost ({e}). Nothing "
                        "was switched or restarted. Fix: re-run the rollout; the release is then built again.",
                        fg="red", log_func=logger.error)
        return False
    sha = archive.with_suffix(".sha256").read_text().strip()
    incoming = f"{plan.root}/releases/.incoming-{fp}.tar.gz"
    sh(host, f"mkdir -p {shlex.quote(plan.root + '/releases')}")
    if not host.put_file(str(archive), incoming, **connector_args(host)):
        raise OperationError(f"could not upload the release archive to {host.name}")
    ok, out = sh(host,
        " ".join(shlex.quote(a) for a in (bin_path(plan, "vf-release"), "install", plan.root, fp, sha, incoming)))
    if not ok:
        raise OperationError(f"release {fp} from {builder_name} failed its checksum or self-check on "
                             f"{host.name}: {out.stderr}")
    logger.info(f"{host.name}: installed release {fp} from the controller's cache (built on "
                f"{release_builder(RELEASE_CACHE, fp) or 'a host of an earlier run'}; no compile)")
    return True


@operation()
def shipped(plan: HostPlan):
    """Shared strategy: install the release that another host of the same fingerprint
    compiled (a checksummed archive, through the controller's cache).

    .. code:: python

        llama_cpp.shipped(plan)
    """
    fp = host_fingerprint(host, plan.build)
    if fp is None:
        yield StringCommand("# install the release of this host's fingerprint")
        return
    if fp in host_fact(host, Releases, root=plan.root)["releases"]:
        return
    if builder_of(fp) == host.name and not cached(fp):
        return
    yield FunctionCommand(_installed, (plan, fp), {})


def _installed(state, host, plan: HostPlan, fp: str) -> bool:
    """_ship, then build-<host>.json: release fp installed here from its builder's archive (no compile)."""
    t0 = time.monotonic()
    if not _ship(state, host, plan, fp):
        return False
    RunDir(report_dir(plan.settings)).write(Build(host=host.name, run=run_context().run, fingerprint=fp, built=False,
                                             seconds=round(time.monotonic() - t0, 1),
                                             source=release_builder(RELEASE_CACHE, fp)))
    return True


@deploy("llama.cpp")
def llama_cpp(plan: HostPlan) -> None:
    """Make sure this host has the release for its fingerprint (compiling or receiving it).

    .. code:: python

        llama_cpp(plan)
    """
    strategy = plan.settings.build.strategy
    compiled(name="Compile llama.cpp release" + (" (one host per fingerprint)" if strategy == "shared" else ""),
             plan=plan, strategy=strategy)
    if strategy == "shared":
        shipped(name="Install the release compiled by a host of the same fingerprint", plan=plan)
