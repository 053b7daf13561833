"""The outcome record's former home, kept only for the rolling driver until it reads the typed
records itself (rollout/rolling.py's `outcome.read`; then this file goes). The record is
voltafleet.records.Outcome, written and read through voltafleet.runctx.RunDir."""
from __future__ import annotations

from pathlib import Path

from voltafleet.records import Outcome
from voltafleet.runctx import RunDir


def read(directory: Path, host: str, run: str) -> Outcome | None:
    """The host's record of run `run`, or None (missing, unreadable, another run's, malformed)."""
    return RunDir(directory).read(Outcome, host, run)
