"""One way to print a refusal: a short block naming the host, what is wrong, where it was
set (file and key) and the fix, instead of a Python traceback.

    >>> print(format_error("gpu16-01", "is 70000, above the maximum 65535", "set 65535 or less",
    ...                    source="group_vars/v100_16gb.yml", key="server_port_base"))
    voltafleet: gpu16-01: refused
      group_vars/v100_16gb.yml: server_port_base: is 70000, above the maximum 65535.
      Fix: set 65535 or less.

Configuration errors, preflight refusals, bad llama-server flags and failed smoke tests
all use it (the roles and the rolling driver too), so a user reads one format.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong: what, how to fix it, and where it was set (when it was set)."""

    what: str
    fix: str
    source: str | None = None  # the file (or `pyinfra --data`) that set the value
    key: str | None = None  # the variable

    def line(self) -> str:
        where = ": ".join(p for p in (self.source, self.key) if p)
        what = self.what.rstrip(".")
        return f"{where}: {what}." if where else f"{what}."


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "?", "!")) else text + "."


def format_errors(host: str | None, problems: list[Problem], title: str = "refused") -> str:
    """A block for one host (None: not about one host) with one or more problems."""
    head = f"voltafleet: {host}: {title}" if host else f"voltafleet: {title}"
    lines = [head]
    for p in problems:
        lines.append("  " + p.line())
        lines.append("  Fix: " + _sentence(p.fix))
    return "\n".join(lines)


def format_error(host: str | None, what: str, fix: str, source: str | None = None,
                 key: str | None = None, title: str = "refused") -> str:
    """The block for one problem; see the module docstring."""
    return format_errors(host, [Problem(what, fix, source, key)], title)
