"""How long a rollout would take: the timeline model of `python -m rollout --plan`. Pure
logic, no pyinfra: it reads what each host would change (voltafleet.state.dryrun) and the
measured constants (the `plan_*` variables of group_vars), and returns per host, per batch
and in total the seconds the rolling driver would need.

The model follows how the rollout runs:

- a batch is one pyinfra run of deploy.py: a fixed cost (connect, facts, the operations
  that change nothing; `plan_run_s`), and so are the preflight run and the gateway run;
- pyinfra runs each operation on every host of the batch at once and starts the next one
  when every host is done: the hosts of a batch run in parallel, and each step of the batch
  takes as long as its slowest host (a batch is the sum over steps of the max over hosts);
- the steps, in deploy.py's order: toolchain (build tools, CUDA toolkit), driver (every
  instance drained, packages, reboot), compile (once per fingerprint: on its builder, the
  first host of the fingerprint; `per_host` compiles everywhere), ship (the other hosts of
  the fingerprint install the built release), model (bytes / bandwidth), activate (the
  instances that restart, one at a time, each drained then restarted and loaded, then one
  smoke test of the host; a converged host is only probed).

    >>> work = {"a": Work("a", restarts=2, instances=2, consts=Constants(run_s=2, drain_s=1, restart_s=3, smoke_s=5))}
    >>> estimate([["a"]], work, gateway=True).total_s   # preflight 2 + gateway 2 + (2 + 2 x (1 + 3) + 5)
    19.0
"""
from __future__ import annotations

from voltafleet.inputs.settings import Settings

from dataclasses import asdict, dataclass, field, fields

MIB = 1024 ** 2
STEPS = ("toolchain", "driver", "compile", "ship", "model", "activate")
# Release actions (see release_actions): what the llama.cpp step does on a host.
KEEP, SWITCH, COMPILE, INSTALL, MISSING = "keep", "switch", "compile", "install", "missing"


@dataclass(frozen=True)
class Constants:
    """The measured costs, in seconds unless named otherwise (group_vars: `plan_<name>`)."""

    run_s: float = 60.0          # one pyinfra run: connect, facts, operations that change nothing
    toolchain_s: float = 600.0   # build tools and the CUDA toolkit on a host that lacks them
    driver_s: float = 600.0      # driver packages and the reboot into them
    compile_s: float = 600.0     # one compile of a release (one fingerprint)
    ship_s: float = 60.0         # pack on the builder, fetch, upload, verify and unpack a release
    model_mib_s: float = 100.0   # model download bandwidth, MiB/s
    drain_s: float = 30.0        # an instance's open streams finishing after its drain
    restart_s: float = 60.0      # restart one instance until /health answers (the model loaded)
    smoke_s: float = 90.0        # one host's smoke test (every instance, thresholds and probe)
    probe_s: float = 15.0        # a converged host's quality probe (no restart)

    @classmethod
    def from_cfg(cls, cfg: Settings) -> "Constants":
        """From a host's validated variables (`plan_run_s`, `plan_model_mib_s`, ...)."""
        return cls(**{f.name: float(getattr(cfg.timeline, f.name)) for f in fields(cls)})

    @classmethod
    def from_dict(cls, d: dict | None) -> "Constants":
        return cls(**{k: float(v) for k, v in (d or {}).items() if k in {f.name for f in fields(cls)}})


@dataclass(frozen=True)
class Release:
    """What a host has of the release it should run."""

    key: str                     # its fingerprint, or a stand-in while the fingerprint is unknown
    current: bool = False        # it runs it now
    present: bool = False        # it is on the host (not necessarily current)
    shared: bool = True          # llama_cpp_build_strategy: shared (else per_host)
    pending: bool = False        # fingerprint unknown until the toolchain is installed


@dataclass(frozen=True)
class Work:
    """One host's share of a batch, as the timeline counts it."""

    host: str
    toolchain: bool = False      # build tools or the CUDA toolkit to install first
    driver: bool = False         # the driver changes (drain everything, install, reboot)
    release: str = KEEP          # KEEP, SWITCH, COMPILE, INSTALL or MISSING (release_actions)
    model_bytes: int = 0         # bytes to download
    restarts: int = 0            # instances restarted (one at a time)
    instances: int = 0           # every instance of the host (drained before a driver change)
    smoke: bool = True           # smoke_enabled: the host is smoke-tested after its restarts
    probe: bool = True           # smoke_probe: a converged host is probed (whatever smoke_enabled says)
    consts: Constants = field(default_factory=Constants)


# ---------------------------------------------------------------- the release each host gets


def batch_of(batches: list[list[str]]) -> dict[str, int]:
    return {h: n for n, batch in enumerate(batches) for h in batch}


def release_actions(batches: list[list[str]], releases: dict[str, Release],
                    builders: dict[str, str] | None = None, cached: set | frozenset = frozenset()
                    ) -> dict[str, tuple[str, str]]:
    """{host: (action, why)} as the llama.cpp role would decide it, batch after batch.

    `builders`: {fingerprint: host that compiles it} (the fleet plan's: the first host of the
    fingerprint in inventory order); None: the first host of the fingerprint in batch order.
    `cached`: fingerprints whose archive the controller's cache holds before the rollout.
    A host installs from the cache, or from its builder when the builder is in the same
    batch; the cache holds a release once a batch compiled or shipped it. A host whose
    builder runs in a later batch, or ran earlier without filling the cache, is MISSING:
    the real run fails it ("release ... is missing").
    """
    where = batch_of(batches)
    builders = dict(builders or {})
    for batch in batches:
        for h in batch:
            r = releases.get(h)
            if r is not None and not r.pending:
                builders.setdefault(r.key, h)
    cache, out = set(cached), {}
    for n, batch in enumerate(batches):
        filled, pending_builders = set(), {}
        for h in batch:
            r = releases.get(h)
            if r is None:
                continue
            action, why = _action(h, r, n, where, builders, cache, releases, pending_builders)
            out[h] = (action, why)
            if action in (COMPILE, INSTALL) and r.shared:
                filled.add(r.key)
        cache |= filled
    return out


def _action(h, r: Release, n, where, builders, cache, releases, pending_builders) -> tuple[str, str]:
    if r.current:
        return KEEP, ""
    if r.present:
        return SWITCH, "on the host already"
    if not r.shared:
        return COMPILE, "per_host strategy"
    if r.key in cache:
        return INSTALL, "from the controller's release cache"
    if r.pending:  # the compiler comes with this batch's toolchain: the batch's first such host builds
        first = pending_builders.setdefault(r.key, h)
        return (COMPILE, "fingerprint known once the toolchain is installed") if first == h else \
            (INSTALL, f"from {first}, in this batch")
    builder = builders.get(r.key, h)
    if builder == h:
        return COMPILE, "first host of its fingerprint"
    b = where.get(builder)
    if b == n:
        return INSTALL, f"from {builder}, in this batch"
    if b is None:
        return MISSING, f"its build host {builder} is not in the rollout"
    if b > n:
        return MISSING, f"its build host {builder} runs in a later batch ({b}). Fix: roll {builder} first (--canary)"
    # the builder ran in an earlier batch without compiling (it had the release): nothing filled the cache
    return MISSING, (f"its build host {builder} (batch {b}) had it already and the controller's cache lacks it. "
                     f"Fix: roll {h} in one batch with {builder}, or set llama_cpp_build_strategy: per_host")


# ---------------------------------------------------------------- seconds


def host_steps(w: Work, gateway: bool) -> dict[str, float]:
    """Seconds of each step for one host alone. `gateway`: instances are drained first."""
    c = w.consts
    drain = c.drain_s if gateway else 0.0
    if w.restarts:
        activate = w.restarts * (drain + c.restart_s) + (c.smoke_s if w.smoke else 0.0)
    else:
        activate = c.probe_s if w.probe else 0.0
    return {
        "toolchain": c.toolchain_s if w.toolchain else 0.0,
        "driver": w.instances * drain + c.driver_s if w.driver else 0.0,
        "compile": c.compile_s if w.release == COMPILE else 0.0,
        "ship": c.ship_s if w.release in (INSTALL, MISSING) else 0.0,
        "model": w.model_bytes / (c.model_mib_s * MIB) if w.model_bytes else 0.0,
        "activate": activate,
    }


@dataclass
class BatchEstimate:
    index: int
    hosts: list
    seconds: float
    steps: dict                  # step -> its slowest host's seconds (plus "run")
    compiles: list               # hosts that compile in this batch


@dataclass
class Estimate:
    batches: list                # BatchEstimate, in order
    hosts: dict                  # host -> seconds alone (one run plus its steps)
    preflight_s: float           # the preflight run before the canary
    gateway_s: float             # the gateway run (0 without a gateway)
    total_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def batch_estimate(n: int, hosts: list[str], work: dict[str, Work], gateway: bool) -> BatchEstimate:
    """One batch: its run's fixed cost plus, step after step, the slowest host."""
    ws = [work[h] for h in hosts if h in work]
    per = [host_steps(w, gateway) for w in ws]
    steps = {"run": max((w.consts.run_s for w in ws), default=0.0)}
    steps.update({s: max((p[s] for p in per), default=0.0) for s in STEPS})
    return BatchEstimate(n, list(hosts), round(sum(steps.values()), 1), {k: round(v, 1) for k, v in steps.items()},
                         [w.host for w in ws if w.release == COMPILE])


def estimate(batches: list[list[str]], work: dict[str, Work], gateway: bool) -> Estimate:
    """Every batch, every host alone, and the total: the preflight run, the gateway run (when
    the rollout has a gateway), then the batches one after the other. Hosts absent from
    `work` (refused) count for nothing."""
    run_s = max((w.consts.run_s for w in work.values()), default=Constants().run_s)
    out = [batch_estimate(n, b, work, gateway) for n, b in enumerate(batches)]
    alone = {h: round(w.consts.run_s + sum(host_steps(w, gateway).values()), 1) for h, w in work.items()}
    gateway_s = run_s if gateway else 0.0
    total = run_s + gateway_s + sum(b.seconds for b in out)
    return Estimate(out, alone, run_s, gateway_s, round(total, 1))


def duration(seconds: float | None) -> str:
    """A readable duration: "45 s", "12 min 05 s", "1 h 03 min"."""
    if seconds is None:
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"
