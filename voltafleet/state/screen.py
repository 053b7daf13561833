"""What an operator reads while a rollout runs: pyinfra's output of one run condensed to one
line per host and step as each step ends (run, host, step, changed/ok/error, seconds), and
what voltafleet itself says (compile and download progress, the smoke tables, verdicts,
errors). pyinfra's full output still goes to the run's log (reports/rollout-<id>/batch-N.log);
`python -m rollout -v` streams it instead. No pyinfra import.

    >>> c = Condenser("canary", clock=iter([0.0, 2.0, 3.5]).__next__)
    >>> c.feed("--> Starting operation: Toolchain | Install build dependencies")
    []
    >>> c.feed("    [vf-lab-1]  Success")
    []
    >>> c.feed("--> Starting operation: Smoke test | Restart, smoke test")
    []
    >>> c.feed("    [vf-lab-1]  Success")
    ['  canary   vf-lab-1      Toolchain        changed     2.0 s']
    >>> c.close()
    ['  canary   vf-lab-1      Smoke test       changed     1.5 s']
"""
from __future__ import annotations

import re
import time

RESULT = re.compile(r"^\s*\[([^\]]+)\]\s+(Success|No changes|Error|Skipped)\s*$")
# pyinfra's own narration: connecting, loading, its per-operation results table
BOILERPLATE = re.compile(r"^\s*(--> (Loading|Connecting|Preparing|Skipping|Beginning|Disconnecting|Starting)|"
                         r"\[[^\]]+\]\s+(Connected|Ready:)|Loading: )")


class Condenser:
    """Feed it pyinfra's lines; it returns the lines to show (see the module docstring)."""

    def __init__(self, label: str, clock=time.monotonic):
        self.label, self.clock = label, clock
        self.step: str | None = None
        self.hosts: dict[str, dict] = {}   # host -> {step, start, last, result}
        self.in_results = False
        self.t0 = clock()

    def _line(self, host: str, h: dict) -> str:
        return (f"  {self.label:<8} {host:<13} {h['step'][:15]:<15}  {h['result']:<8} "
                f"{h['last'] - h['start']:6.1f} s")

    def feed(self, line: str) -> list[str]:
        s = line.rstrip("\n")
        if s.startswith("--> Starting operation: "):
            self.step = s[len("--> Starting operation: "):].strip().split(" | ")[0]
            return []
        if s.startswith("--> Results:"):
            self.in_results = True
            return []
        if self.in_results:
            if s.startswith("--> "):
                self.in_results = False
            return [] if not s.startswith("--> pyinfra error") else [s]
        m = RESULT.match(s)
        if m:
            host, result = m.groups()
            if result == "Skipped" or self.step is None:
                return []
            word = {"Success": "changed", "No changes": "ok", "Error": "error"}[result]
            now = self.clock()
            h = self.hosts.get(host)
            out = []
            if h is None or h["step"] != self.step:
                start = h["last"] if h else self.t0
                if h:
                    out.append(self._line(host, h))
                h = self.hosts[host] = {"step": self.step, "start": start, "last": now, "result": word}
            else:
                h["last"] = now
            if word == "error" or (word == "changed" and h["result"] == "ok"):
                h["result"] = word
            return out
        if not s.strip() or BOILERPLATE.match(s):
            return []
        return [s]

    def close(self) -> list[str]:
        """The step each host is in when the run ends."""
        out = [self._line(host, h) for host, h in self.hosts.items()]
        self.hosts = {}
        return out
