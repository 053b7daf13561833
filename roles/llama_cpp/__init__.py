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
import json
import os
import re
import shlex
import subprocess
import time
from functools import lru_cache
from pathlib import Path

from gevent.lock import Semaphore
from pyinfra import host, inventory, logger
from pyinfra.api import FunctionCommand, OperationError, deploy, operation
from pyinfra.api.exceptions import PyinfraError

from roles.facts import HostBasics, NvccVersion, Releases
from voltafleet import fingerprint as fpmod
from voltafleet.nvidia import toolkit_nvcc

CCACHE_DIR = "/var/cache/voltafleet/ccache"
REPO = Path(__file__).resolve().parents[2]
RELEASE_CACHE = Path(os.environ.get("VOLTAFLEET_RELEASE_CACHE", REPO / ".voltafleet" / "releases"))
SHA40 = re.compile(r"^[0-9a-f]{40}$")


class RefError(PyinfraError):
    pass


@lru_cache(maxsize=None)
def resolve_ref(repo: str, ref: str) -> str:
    """A 40-hex commit stays as it is; a tag or branch is resolved once, on the controller,
    so every host of the rollout builds the same commit."""
    if SHA40.match(ref):
        return ref
    try:
        out = subprocess.run(["git", "ls-remote", repo, ref, f"{ref}^{{}}"], capture_output=True,
                             text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise RefError(f"llama_cpp_ref: `git ls-remote {repo}` timed out. Fix: check the "
                       "llama_cpp_repo URL and the controller's network.")
    if out.returncode != 0:
        raise RefError(f"llama_cpp_repo: `git ls-remote {repo}` failed: {out.stderr.strip()}. "
                       "Fix: check the URL in group_vars.")
    refs = dict(reversed(line.split("\t")) for line in out.stdout.splitlines() if "\t" in line)
    for name in (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}", ref):
        if name in refs:
            return refs[name]
    raise RefError(f"llama_cpp_ref: {ref!r} is not a tag, branch or commit of {repo}. "
                   "Fix: set llama_cpp_ref to an existing tag or a full 40-hex commit.")


def build_inputs(ctx: dict) -> dict:
    """Commit and CMake flags of this host's build (known in the prepare phase)."""
    cfg = ctx["cfg"]
    commit = resolve_ref(cfg["llama_cpp_repo"], cfg["llama_cpp_ref"])
    cuda = cfg["voltafleet_backend"] == "cuda"
    flags = fpmod.cmake_flags(cfg["voltafleet_backend"], ctx["cuda_archs"], cfg["llama_cpp_cmake_extra"],
                              (cfg["server_cache_type_k"], cfg["server_cache_type_v"]),
                              nvcc=toolkit_nvcc(cfg["cuda_toolkit_version"]) if cuda else None)
    return {"commit": commit, "flags": flags}


def host_fingerprint(h, ctx: dict) -> str | None:
    """The fingerprint for host h from its live facts; None while it has no compiler."""
    basics = h.get_fact(HostBasics)
    if not basics["cxx"]:
        return None
    toolkit = pinned_toolkit(h, ctx)
    b = build_inputs(ctx)
    return fpmod.fingerprint(b["commit"], b["flags"], toolkit, basics["cxx"], ctx["cfg"]["llama_cpp_targets"])


def pinned_toolkit(h, ctx: dict) -> str | None:
    """The version of the configured CUDA toolkit's nvcc on host h (None on the CPU backend)."""
    cfg = ctx["cfg"]
    if cfg["voltafleet_backend"] != "cuda":
        return None
    return h.get_fact(NvccVersion, path=toolkit_nvcc(cfg["cuda_toolkit_version"]))


def choose_builder(ctx: dict) -> str:
    """Shared strategy: the first host of the inventory with the same build key compiles."""
    mine = _key(host)
    for other in inventory:
        if other.data.get("llama_cpp_build_strategy") == "shared" and _key(other) == mine:
            return other.name
    return host.name


def _key(h) -> str:
    data = {k: h.data.get(k) for k in ("llama_cpp_repo", "llama_cpp_ref", "llama_cpp_cmake_extra",
                                       "llama_cpp_cuda_archs", "voltafleet_backend", "cuda_toolkit_version",
                                       "server_cache_type_k", "server_cache_type_v")}
    return json.dumps({**data, "os": h.get_fact(HostBasics)["os"]}, sort_keys=True)


def build_script(ctx: dict, fp: str, cxx: str, toolkit: str | None, built_on: str) -> str:
    """The shell script that compiles release `fp` on a host (also run as is on the GPU box)."""
    cfg, b = ctx["cfg"], build_inputs(ctx)
    root = cfg["voltafleet_root"]
    jobs = cfg["llama_cpp_build_jobs"] or "$(nproc)"
    flags = " ".join(shlex.quote(f) for f in b["flags"])
    targets = " ".join(shlex.quote(t) for t in cfg["llama_cpp_targets"])
    info = json.dumps({"fingerprint": fp, "commit": b["commit"], "flags": b["flags"], "toolkit": toolkit,
                       "compiler": cxx, "built_on": built_on, "repo": cfg["llama_cpp_repo"]})
    cuda_path = (f"export PATH=/usr/local/cuda-{cfg['cuda_toolkit_version']}/bin:$PATH; "
                 if cfg["voltafleet_backend"] == "cuda" else "")
    # ccache through CMake's environment variables: the cache is not part of the fingerprint
    return f"""set -eu; {cuda_path}export CCACHE_DIR={CCACHE_DIR}
if command -v ccache >/dev/null; then for l in C CXX CUDA; do export CMAKE_${{l}}_COMPILER_LAUNCHER=ccache; done; fi
mkdir -p {root}/src {root}/build {root}/releases {CCACHE_DIR}
[ -d {root}/src/llama.cpp/.git ] || git init -q {root}/src/llama.cpp
cd {root}/src/llama.cpp
git fetch -q --depth 1 {shlex.quote(cfg['llama_cpp_repo'])} {b['commit']}
git checkout -q --force --detach {b['commit']}
log={root}/build/{fp}.log; t0=$(date +%s)
echo "voltafleet: compiling llama.cpp {b['commit'][:12]} as release {fp} on $(hostname)" >&2
if ! {{ cmake -S . -B {root}/build/{fp} {flags} && cmake --build {root}/build/{fp} --target {targets} -j {jobs}; }} >$log 2>&1; then
  tail -n 40 $log >&2; echo "voltafleet: build failed, log in $log; current release untouched" >&2; exit 1
fi
echo $(( $(date +%s) - t0 )) > {root}/build/{fp}.seconds
rm -rf {root}/releases/{fp}.tmp; mkdir -p {root}/releases/{fp}.tmp/bin
for t in {targets}; do cp {root}/build/{fp}/bin/$t {root}/releases/{fp}.tmp/bin/; done
{root}/releases/{fp}.tmp/bin/llama-server --version >/dev/null 2>&1 || {{ echo "voltafleet: new llama-server fails --version" >&2; exit 1; }}
printf '%s\\n' {shlex.quote(info)} > {root}/releases/{fp}.tmp/BUILD_INFO.json
mv -T {root}/releases/{fp}.tmp {root}/releases/{fp}"""


@operation()
def compiled(ctx: dict, builder: str | None = None):
    """Compile the release for this host's fingerprint if it is missing and this host builds.

    + ctx: the preflight context
    + builder: with the shared strategy, the one host of the build group that compiles

    .. code:: python

        llama_cpp.compiled(ctx, builder="gpu-01")
    """
    if builder not in (None, host.name):
        return
    fp = host_fingerprint(host, ctx)
    if fp is None:  # prepare phase on a fresh host: the compiler comes with the toolchain role
        yield f"# compile llama.cpp {build_inputs(ctx)['commit'][:12]} (fingerprint once the compiler is installed)"
        return
    if fp in host.get_fact(Releases, root=ctx["cfg"]["voltafleet_root"])["releases"]:
        return
    yield build_script(ctx, fp, host.get_fact(HostBasics)["cxx"], pinned_toolkit(host, ctx), host.name)


_ARCHIVE_LOCKS: dict[str, Semaphore] = {}


def _archive_from(builder, ctx: dict, fp: str) -> Path:
    """The release archive in the controller cache, fetched from the builder once even when
    many hosts ask for it at the same time."""
    with _ARCHIVE_LOCKS.setdefault(fp, Semaphore()):
        archive = RELEASE_CACHE / f"{fp}.tar.gz"
        if archive.exists() and archive.with_suffix(".sha256").exists():
            return archive
        root = ctx["cfg"]["voltafleet_root"]
        RELEASE_CACHE.mkdir(parents=True, exist_ok=True)
        remote = f"{root}/releases/{fp}.tar.gz"
        has, _ = builder.run_shell_command(f"test -f {root}/releases/{fp}/BUILD_INFO.json")
        if not has:
            raise OperationError(f"{builder.name} has no release {fp} to ship (its compiler or toolkit "
                                 "differs from this host's?). Fix: align the hosts, or set "
                                 "llama_cpp_build_strategy: per_host for this group.")
        ok, out = builder.run_shell_command(
            f"tar -C {root}/releases -czf {remote}.tmp {fp} && mv -f {remote}.tmp {remote}")
        if not ok:
            raise OperationError(f"could not archive release {fp} on {builder.name}: {out.stderr}")
        tmp = archive.with_suffix(".part")
        if not builder.get_file(remote, str(tmp)):
            raise OperationError(f"could not fetch {remote} from {builder.name}")
        sha = hashlib.sha256(tmp.read_bytes()).hexdigest()
        tmp.rename(archive)
        archive.with_suffix(".sha256").write_text(sha + "\n")
        return archive


def _ship(state, host, builder_name: str, ctx: dict, fp: str) -> None:
    builder = inventory.get_host(builder_name)
    archive = _archive_from(builder, ctx, fp)
    root = ctx["cfg"]["voltafleet_root"]
    sha = archive.with_suffix(".sha256").read_text().strip()
    incoming = f"{root}/releases/.incoming-{fp}.tar.gz"
    host.run_shell_command(f"mkdir -p {root}/releases")
    if not host.put_file(str(archive), incoming):
        raise OperationError(f"could not upload the release archive to {host.name}")
    ok, out = host.run_shell_command(
        f"set -e; cd {root}/releases; echo '{sha}  {incoming}' | sha256sum -c --quiet; "
        f"rm -rf {fp}.tmp; mkdir {fp}.tmp; tar -C {fp}.tmp --strip-components=1 -xzf {incoming}; "
        f"{fp}.tmp/bin/llama-server --version >/dev/null 2>&1; mv -T {fp}.tmp {fp}; rm -f {incoming}")
    if not ok:
        raise OperationError(f"release {fp} from {builder_name} failed its checksum or self-check on "
                             f"{host.name}: {out.stderr}")
    logger.info(f"{host.name}: installed release {fp} built on {builder_name} (no compile)")


@operation()
def shipped(ctx: dict, builder: str):
    """Shared strategy: install the builder's release (checksummed archive, through the
    controller's cache) on a host that did not compile it.

    .. code:: python

        llama_cpp.shipped(ctx, builder="gpu-01")
    """
    if builder == host.name:
        return
    fp = host_fingerprint(host, ctx)
    if fp is None:
        yield f"# install the release compiled on {builder}"
        return
    if fp in host.get_fact(Releases, root=ctx["cfg"]["voltafleet_root"])["releases"]:
        return
    yield FunctionCommand(_ship, (builder, ctx, fp), {})


@deploy("llama.cpp")
def llama_cpp(ctx: dict) -> None:
    """Make sure this host has the release for its fingerprint (compiling or receiving it).

    .. code:: python

        llama_cpp(ctx)
    """
    build_inputs(ctx)  # resolve the ref now: a bad ref stops the rollout before any change
    if ctx["cfg"]["llama_cpp_build_strategy"] == "per_host":
        compiled(name="Compile llama.cpp release", ctx=ctx)
        return
    builder = choose_builder(ctx)
    compiled(name="Compile llama.cpp release (one host per fingerprint)", ctx=ctx, builder=builder)
    shipped(name=f"Install llama.cpp release built on {builder}", ctx=ctx, builder=builder)
