"""Facts read once until a change (host_fact), ref resolution, model sizes and GGUF headers once per run, and
a host's release fingerprint from its live facts."""

from __future__ import annotations

import copy
from weakref import WeakKeyDictionary

from pyinfra.context import ContextObject

from roles.facts import Gpus, HostBasics, NvccVersion
from roles.run import RefError, fleet_plan, host_config, once_per_run
from voltafleet.planning import hostplan
from voltafleet.state import refs
from voltafleet.planning.hostplan import BuildSpec
from voltafleet.models import gguf_header
from voltafleet.models.modelmeta import remote_size


# ---------------------------------------------------------------- releases


def resolve_ref(repo: str, ref: str) -> str:
    """The commit of (repo, ref): the fleet plan's (resolved once per rollout), else
    resolved on the controller once per run."""
    plan = fleet_plan()
    if plan and plan.commit(repo, ref):
        return plan.commit(repo, ref)
    try:
        return _resolve(repo, ref)
    except refs.RefError as e:
        raise RefError(str(e)) from None


_resolve = once_per_run(refs.resolve)


@once_per_run
def model_header(url: str):
    """The model's GGUF header, read once per run over HTTP Range (the other hosts wait for
    it); an error text if not."""
    try:
        return gguf_header.read_url(url)
    except Exception as e:  # reported by the plan with the fix
        return f"{type(e).__name__}: {e}"


@once_per_run
def model_size(url: str) -> int | None:
    """A model file's size: the fleet plan's (one HEAD per rollout), else one HEAD per run
    (however many hosts ask at once)."""
    plan = fleet_plan()
    if plan and url in plan.model_bytes:
        return plan.model_bytes[url]
    return remote_size(url)  # one `git ls-remote` per (repo, ref) and run, not one per greenlet


# ---------------------------------------------------------------- facts read once until a change


_FACTS: WeakKeyDictionary = WeakKeyDictionary()  # {host: {(fact, kwargs): ((stage, changes), value)}}


def real_host(h):
    """The Host object itself: `pyinfra.host` is one context proxy for every host (hashed as
    itself), so a memo keyed by it would mix the hosts up."""
    return h._get_module() if isinstance(h, ContextObject) else h


def changes_so_far(h) -> int | None:
    """How many of host h's operations have run commands on it so far in this run (None:
    not a pyinfra host of a run, a test's fake one)."""
    h = real_host(h)
    ops = getattr(h.state, "ops", None)
    if not isinstance(ops, dict):
        return None
    return sum(1 for data in ops.get(h, {}).values() if data.operation_meta.executed)


def host_fact(h, cls, **kwargs):
    """h.get_fact(cls, **kwargs), read from the host once per run stage (prepare, execute)
    until one of its operations runs a command on it; then once again, and so on: the same
    value pyinfra's fresh read gives, for a fact only an operation changes (the compiler,
    the toolkit, packages, releases, the GPUs a driver shows), never one that moves by
    itself (a clock, a unit's state, the gateway's servers). An operation asks before its
    first command (after it, its own command may have changed the value). A copy each time."""
    h = real_host(h)
    executed = changes_so_far(h)
    if executed is None:
        return h.get_fact(cls, **kwargs)
    key, epoch = (cls, tuple(sorted(kwargs.items()))), (h.state.is_executing, executed)
    memo = _FACTS.setdefault(h, {})
    if key not in memo or memo[key][0] != epoch:
        memo[key] = (epoch, h.get_fact(cls, **kwargs))
    return copy.deepcopy(memo[key][1])


def host_build(h) -> BuildSpec:
    """Host h's build inputs, from its variables and GPUs (the same rule as its plan)."""
    cfg = host_config(h)
    cuda = cfg.preflight.backend == "cuda"
    archs = hostplan.cuda_archs(cfg, host_fact(h, Gpus)) if cuda else []
    return hostplan.build_spec(cfg, archs, resolve_ref(cfg.build.repo, cfg.build.ref))


def host_fingerprint(h, build: BuildSpec | None = None) -> str | None:
    """Host h's fingerprint from its live facts; None while it has no compiler yet."""
    cxx = host_fact(h, HostBasics)["cxx"]
    if not cxx:
        return None
    build = build or host_build(h)
    toolkit = host_fact(h, NvccVersion, path=f"{build.cuda_bin}/nvcc") if build.cuda_bin else None
    return build.fingerprint(toolkit, cxx)
