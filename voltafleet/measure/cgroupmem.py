"""A memory cgroup as the kernel counts it, cgroup v1 or v2, in one reading (issue 49): what the
host's textfile script (roles/server/files/vf-memory-textfile.sh) exports, read the same way, for
the kernel test (tests/kernel), the bench (bench/lab/memcg.py) and the unit tests that hold the
script to it.

    charged   what the ceiling limits: v2 memory.current, v1 memory.usage_in_bytes. Anonymous
              memory, the page cache charged to the cgroup (a file's pages belong to the cgroup
              that first read them) and kernel memory (page tables, slab, sockets)
    file      of that, the page cache on the file LRU lists, which the kernel reclaims before it
              OOM-kills: v2 memory.stat active_file + inactive_file, v1 total_active_file +
              total_inactive_file
    limit     the hard ceiling, systemd's MemoryMax: v2 memory.max, v1 memory.limit_in_bytes;
              None when unlimited ("max"; v1's 9223372036854771712)
    peak      the most charged since the cgroup was made: v2 memory.peak (5.19+), v1
              memory.max_usage_in_bytes; None where the kernel has none
    events    v2 memory.events: high (throttled above memory.high), max (at memory.max, reclaiming),
              oom, oom_kill. v1 has no memory.high and no OOM count: max is memory.failcnt (each
              charge that hit the limit), oom_kill memory.oom_control's oom_kill (4.13+)

The kernel's counters start at 0 in each cgroup, and systemd makes a new one at each start: the
unit's ExecStopPost folds a run's counters into a tally (`fold`), and the textfile adds the running
invocation's own (`counted`).

    >>> r = reading({"memory.current": "300", "memory.stat": "anon 100\\nactive_file 150\\ninactive_file 50\\n",
    ...              "memory.max": "400", "memory.events": "low 0\\nhigh 0\\nmax 7\\noom 0\\noom_kill 0\\n"})
    >>> (r.version, r.charged, r.file, r.anon, r.unreclaimable, r.limit, r.events["max"])
    (2, 300, 200, 100, 100, 400, 7)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

EVENTS = ("high", "max", "oom", "oom_kill")
UNLIMITED = 1 << 62        # v1 writes "no limit" as PAGE_COUNTER_MAX pages: 9223372036854771712
V2_FILES = ("memory.current", "memory.stat", "memory.max", "memory.events", "memory.peak")
V1_FILES = ("memory.usage_in_bytes", "memory.stat", "memory.limit_in_bytes", "memory.failcnt",
            "memory.oom_control", "memory.max_usage_in_bytes")


@dataclass(frozen=True)
class Reading:
    version: int                      # 1 or 2
    charged: int
    file: int
    limit: int | None
    peak: int | None
    events: dict[str, int] = field(default_factory=dict)
    stat: dict[str, int] = field(default_factory=dict)

    @property
    def anon(self) -> int:
        """Anonymous memory (the heap, the weights read with -lm none, checkpoints): v2 memory.stat anon,
        v1 total_rss (transparent huge pages included)."""
        return self.stat.get("anon", 0) if self.version == 2 else self.stat.get("total_rss", 0)

    @property
    def unreclaimable(self) -> int:
        """The charge less its page cache: what stays when the kernel has reclaimed all it can
        (anonymous memory, kernel memory; no swap): at the limit, the OOM killer's business."""
        return self.charged - self.file


def flat(text: str) -> dict[str, int]:
    """`key value` lines (memory.stat, memory.events, memory.oom_control) as {key: int}."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def limit_of(text: str | None) -> int | None:
    """memory.max or memory.limit_in_bytes in bytes; None when unlimited or absent."""
    if text is None or not text.strip().isdigit():
        return None
    value = int(text)
    return value if value < UNLIMITED else None


def reading(files: dict[str, str]) -> Reading:
    """One cgroup from its files' texts ({name: text}; v2 when memory.current is among them)."""
    stat = flat(files.get("memory.stat", ""))
    if "memory.current" in files:
        events = {k: v for k, v in flat(files.get("memory.events", "")).items() if k in EVENTS}
        return Reading(2, int(files["memory.current"]), stat.get("active_file", 0) + stat.get("inactive_file", 0),
                       limit_of(files.get("memory.max")),
                       int(files["memory.peak"]) if files.get("memory.peak", "").strip().isdigit() else None,
                       events, stat)
    events = {}
    if "memory.failcnt" in files:
        events["max"] = int(files["memory.failcnt"])
        oom = flat(files.get("memory.oom_control", ""))
        if "oom_kill" in oom:
            events["oom_kill"] = oom["oom_kill"]
    peak = files.get("memory.max_usage_in_bytes", "").strip()
    return Reading(1, int(files["memory.usage_in_bytes"]),
                   stat.get("total_active_file", 0) + stat.get("total_inactive_file", 0),
                   limit_of(files.get("memory.limit_in_bytes")), int(peak) if peak.isdigit() else None, events, stat)


def read(directory: str | Path) -> Reading:
    """The cgroup at `directory` (a v2 cgroup, or one of v1's memory controller)."""
    d = Path(directory)
    names = V2_FILES if (d / "memory.current").exists() else V1_FILES
    return reading({n: (d / n).read_text() for n in names if (d / n).exists()})


# ---------------------------------------------------------------- counts that outlive a run's cgroup


@dataclass(frozen=True)
class Tally:
    """An instance's events summed over its ended runs, and the last run folded in."""

    invocation: str = ""
    events: dict[str, int] = field(default_factory=dict)

    def text(self) -> str:
        """As the script writes it: `invocation ID`, then `EVENT COUNT` in EVENTS' order."""
        return "".join([f"invocation {self.invocation or '-'}\n"]
                       + [f"{e} {self.events[e]}\n" for e in EVENTS if e in self.events])

    @classmethod
    def parse(cls, text: str) -> "Tally":
        invocation = next((line.split()[1] for line in text.splitlines()
                           if line.startswith("invocation ") and len(line.split()) == 2), "")
        return cls(invocation, {k: v for k, v in flat(text).items() if k in EVENTS})


def fold(tally: Tally, live: dict[str, int], invocation: str) -> Tally:
    """The tally once the run `invocation` has ended with counters `live`; unchanged when that
    run was folded already."""
    if invocation and invocation == tally.invocation:
        return tally
    keys = [e for e in EVENTS if e in tally.events or e in live]
    return Tally(invocation or "-", {e: tally.events.get(e, 0) + live.get(e, 0) for e in keys})


def counted(tally: Tally, live: dict[str, int], invocation: str) -> dict[str, int]:
    """The counters since boot: the tally, plus the running invocation's own unless folded in already."""
    if tally.invocation and invocation == tally.invocation:
        live = {}
    return {e: tally.events.get(e, 0) + live.get(e, 0) for e in EVENTS if e in tally.events or e in live}
