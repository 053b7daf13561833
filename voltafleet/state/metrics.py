"""The textfile format (gauge) and the rolling driver's outcome for node_exporter's textfile collector on the controller,
so that a failed rollout raises an alert (monitoring/alerts.yml, VoltafleetRolloutFailed).
No pyinfra: the driver calls it with its fleet report.

    >>> path = write_rollout_textfile("/var/lib/prometheus/node-exporter", report)   # report: rollout/rolling.py's
    >>> print(rollout_textfile(report, now=1767225600))
    voltafleet_rollout_passed{rollout="20260101-000000",inventory="inventory/prod.py"} 0
    voltafleet_rollout_hosts{rollout="20260101-000000",inventory="inventory/prod.py",status="failed"} 1
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from voltafleet.state.rolling import STATUSES

TEXTFILE = "voltafleet-rollout.prom"


def gauge(name: str, text: str, rows: list[tuple[dict, float | None]]) -> list[str]:
    """One gauge in the textfile format; rows without a value are left out (never a made-up 0)."""
    rows = [(labels, v) for labels, v in rows if v is not None]
    if not rows:
        return []
    out = [f"# HELP {name} {text}", f"# TYPE {name} gauge"]
    for labels, v in rows:
        lab = ",".join(f'{k}="{_escape(x)}"' for k, x in labels.items())
        out.append(f"{name}{{{lab}}} {int(v) if float(v).is_integer() else float(v)!r}")
    return out


def _escape(value) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def rollout_textfile(report: dict, now: float | None = None) -> str:
    """The fleet report (rollout id, inventory, ok, counts) as gauges; a report without
    "ok" or "counts" is refused (KeyError), never written as a pass."""
    lab = {"rollout": report["rollout"], "inventory": report.get("inventory", "")}
    lines = gauge("voltafleet_rollout_passed", "1 if the last rollout passed on every host", [(lab, int(report["ok"]))])
    lines += gauge("voltafleet_rollout_hosts", "hosts of the last rollout by outcome",
                    [({**lab, "status": s}, report["counts"].get(s, 0)) for s in STATUSES])
    lines += gauge("voltafleet_rollout_interrupted", "1 if the last rollout was stopped by a signal (SIGINT, SIGTERM, SIGHUP)",
                    [({**lab, "signal": report.get("interrupted") or ""}, int(bool(report.get("interrupted"))))])
    lines += gauge("voltafleet_rollout_end_timestamp_seconds", "when the last rollout ended",
                    [(lab, round(time.time() if now is None else now))])
    lines += gauge("voltafleet_rollout_duration_seconds", "how long the last rollout took", [(lab, report.get("seconds"))])
    lines += gauge("voltafleet_rollout_running", "1 while a rollout runs", [(lab, 0)])
    return "\n".join(lines) + "\n"


def running_textfile(rollout: str, inventory: str, max_seconds: float, now: float | None = None) -> str:
    """While a rollout runs: its start and the longest a rollout may take (rollout_max_minutes),
    so VoltafleetInstanceLeftOutOfRotation tells a drain in progress from one left behind."""
    lab = {"rollout": rollout, "inventory": inventory}
    lines = gauge("voltafleet_rollout_running", "1 while a rollout runs", [(lab, 1)])
    lines += gauge("voltafleet_rollout_start_timestamp_seconds", "when the rollout started",
                   [(lab, round(time.time() if now is None else now))])
    lines += gauge("voltafleet_rollout_max_seconds", "rollout_max_minutes: longer than this, a drain is left behind",
                   [(lab, round(max_seconds))])
    return "\n".join(lines) + "\n"


def write_rollout_textfile(directory: str | os.PathLike, report: dict) -> Path:
    """The finished rollout's report as voltafleet-rollout.prom in `directory` (write_textfile)."""
    return write_textfile(directory, rollout_textfile(report))


def write_textfile(directory: str | os.PathLike, text: str) -> Path:
    """Write voltafleet-rollout.prom into `directory` atomically (node_exporter never reads
    half a file); returns its path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".voltafleet-rollout.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, d / TEXTFILE)
    return d / TEXTFILE
