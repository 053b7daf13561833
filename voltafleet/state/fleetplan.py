"""The fleet plan: what a rollout decides once, before the canary, and every batch reads:
the commit each (repo, ref) resolves to, each model URL's size, the model mirrors (hosts of
the `mirror` group: where each server host fetches the model), every server host's
instances (the gateway's backends come from here, not from who is reachable in a run) and
the builder of each release fingerprint. Written by the rolling driver as JSON.

    >>> plan = FleetPlan(rollout="r1", commits={commit_key("git://x", "main"): "ab" * 20})
    >>> FleetPlan.from_json(plan.to_json()).commit("git://x", "main") == "ab" * 20
    True
"""
from __future__ import annotations

import json
import os
import tarfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from voltafleet.models.mirror import Mirror


def commit_key(repo: str, ref: str) -> str:
    return f"{repo} {ref}"


@dataclass(frozen=True)
class ServerEntry:
    """A server host's entry in the fleet plan: what the gateway and the builders need of it. Its
    preflight record (voltafleet.state.records.Preflight) carries these same fields, declared here."""

    host: str
    address: str                      # where the gateway reaches it
    ports: tuple[int, ...]            # one per instance, in instance order
    slots: int = 1                    # each instance's -np
    fingerprint: str | None = None    # its release fingerprint, when its compiler is known
    tier: str = "throughput"          # its server_tier: the gateway backend its instances are in (voltafleet/front/tiers.py)


@dataclass(frozen=True)
class FleetPlan:
    rollout: str
    commits: dict = field(default_factory=dict)       # "repo ref" -> 40-hex commit
    model_bytes: dict = field(default_factory=dict)   # model URL -> Content-Length (or None)
    servers: tuple = ()                               # ServerEntry, inventory order
    builders: dict = field(default_factory=dict)      # fingerprint -> the host that compiles it
    mirrors: tuple = ()                               # voltafleet.models.mirror.Mirror, inventory order

    def commit(self, repo: str, ref: str) -> str | None:
        return self.commits.get(commit_key(repo, ref))

    def server(self, host: str) -> ServerEntry | None:
        return next((s for s in self.servers if s.host == host), None)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "FleetPlan":
        d = json.loads(text)
        servers = tuple(ServerEntry(**{**s, "ports": tuple(s["ports"])}) for s in d.get("servers", []))
        mirrors = tuple(Mirror(**m) for m in d.get("mirrors", []))
        return cls(rollout=d["rollout"], commits=d.get("commits", {}), model_bytes=d.get("model_bytes", {}),
                   servers=servers, builders=d.get("builders", {}), mirrors=mirrors)

    @classmethod
    def load(cls, path: str | Path) -> "FleetPlan":
        return cls.from_json(Path(path).read_text())


def builders(servers: list[ServerEntry]) -> dict[str, str]:
    """The first host (inventory order) of each fingerprint compiles it; the others receive it."""
    out: dict[str, str] = {}
    for s in servers:
        if s.fingerprint and s.fingerprint not in out:
            out[s.fingerprint] = s.host
    return out


def with_servers(plan: FleetPlan, servers: list[ServerEntry]) -> FleetPlan:
    """The plan completed after preflight: every server host's instances and the builders."""
    return FleetPlan(rollout=plan.rollout, commits=plan.commits, model_bytes=plan.model_bytes,
                     servers=tuple(servers), builders=builders(servers), mirrors=plan.mirrors)


def release_cache(repo: Path) -> Path:
    """The controller's cache of release archives: VOLTAFLEET_RELEASE_CACHE, else
    .voltafleet/releases in the repository (roles/llama_cpp fills it, the plan reads it)."""
    return Path(os.environ.get("VOLTAFLEET_RELEASE_CACHE", Path(repo) / ".voltafleet" / "releases"))


def release_cached(cache: Path, fp: str) -> bool:
    """The cache holds release fp's archive and its checksum (a later batch installs it, no compile)."""
    archive = Path(cache) / f"{fp}.tar.gz"
    return archive.exists() and archive.with_suffix(".sha256").exists()


def archive_built_on(archive: Path, fp: str) -> str:
    """The host that compiled a release archive: `built_on` of the BUILD_INFO.json that
    vf-build-release wrote into it; "" when the archive does not say."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            info = tar.extractfile(f"{fp}/BUILD_INFO.json")
            return str(json.load(info).get("built_on") or "") if info else ""
    except (OSError, tarfile.TarError, KeyError, ValueError, AttributeError):
        return ""


def release_builder(cache: Path, fp: str) -> str:
    """The host that compiled the cached release fp (the `<fp>.tar.builder` beside its archive,
    written when the archive was fetched from it); "" when the cache does not say."""
    try:
        return (Path(cache) / f"{fp}.tar.builder").read_text().strip()
    except OSError:
        return ""
