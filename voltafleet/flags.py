"""llama-server flags: rendered from the plan, checked against the binary's own --help.

    >>> args = server_args(cfg, "/var/lib/voltafleet/models/m.gguf", port=8080, api_key_file=None)
    >>> check_against_help(args, help_text)   # [] when every flag is known and current
"""
from __future__ import annotations

import re
import shlex

# Flags the seed (and older guides) use that the pinned llama.cpp no longer has at all.
REPLACED = {
    "--draft-max": "--spec-draft-n-max",
    "--draft": "--spec-draft-n-max",
    "--draft-min": "--spec-draft-n-min",
    "--draft-n-min": "--spec-draft-n-min",
    "--model-draft": "--spec-draft-model (alias -md)",
    "--gpu-layers-draft": "--spec-draft-ngl",
}
_DESC_COL = 40


def server_args(cfg: dict, model_path: str, port: int, api_key_file: str | None,
                draft_path: str | None = None) -> list[str]:
    """argv for one llama-server instance. Options whose defaults llama.cpp now picks for
    you (-ngl auto, --fit on, -np auto, -fa auto) are always explicit, so behaviour does
    not drift with the pinned version."""
    cuda = cfg["voltafleet_backend"] == "cuda"
    args = [
        "-m", model_path,
        "-ngl", str(cfg["server_gpu_layers"]) if cuda else "0",
        "--fit", "off",
        "-c", str(cfg["server_ctx"]),
        "-np", str(cfg["server_parallel"]),
        "-ctk", cfg["server_cache_type_k"],
        "-ctv", cfg["server_cache_type_v"],
        "-fa", cfg["server_flash_attn"],
        "-t", str(cfg["server_threads"]),
        "--host", cfg["server_host"],
        "--port", str(port),
        "--metrics",
        # llama.cpp logs its library's info lines (`offloaded N/M layers to GPU`, buffer
        # sizes) at trace level: 4 keeps them in the journal for the offload check.
        "--log-verbosity", "4",
    ]
    if draft_path:
        args += ["-md", draft_path, "-ngld", str(cfg["server_gpu_layers"]) if cuda else "0"]
    if api_key_file:
        args += ["--api-key-file", api_key_file]
    for extra in cfg["server_extra_flags"]:
        args += shlex.split(extra)
    return args


def parse_help(help_text: str) -> tuple[set[str], dict[str, str]]:
    """(every flag name the binary accepts, {removed flag: the binary's own advice})."""
    known: set[str] = set()
    removed: dict[str, str] = {}
    lines = help_text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("-"):
            continue
        # llama.cpp prints names in the first 40 columns, the description after them
        # (or from the next line on when the names are longer).
        fits = len(line) > _DESC_COL and line[_DESC_COL - 2:_DESC_COL] == "  "
        head, desc = (line[:_DESC_COL], line[_DESC_COL:]) if fits else (line, "")
        names = [n for n in re.findall(r"(?:^|[\s,])(-{1,2}[A-Za-z0-9][\w-]*)", head)]
        known.update(names)
        for cont in lines[i + 1:]:
            if cont.startswith("-") or not cont.startswith(" "):
                break
            desc += " " + cont.strip()
        if "has been removed" in desc:
            for n in names:
                removed[n] = " ".join(desc.split())
    return known, removed


def flag_names(args: list[str]) -> list[str]:
    out = []
    for a in args:
        if a.startswith("-") and not re.match(r"^-\d", a):
            out.append(a.split("=", 1)[0])
    return out


def check_against_help(args: list[str], help_text: str) -> list[str]:
    """Every problem with `args` for this binary, each naming the flag and its fix."""
    known, removed = parse_help(help_text)
    errors = []
    for name in flag_names(args):
        if name in removed:
            errors.append(f"{name}: the pinned llama-server says: {removed[name]}")
        elif name not in known:
            hint = REPLACED.get(name)
            errors.append(f"{name}: not a flag of the pinned llama-server"
                          + (f"; use {hint} instead" if hint else "; see llama-server --help"))
    return errors


def env_file(instance: int, args: list[str], cuda: bool) -> str:
    """The per-instance environment file read by llama-server@.service."""
    for a in args:
        if any(c.isspace() for c in a) or '"' in a or "\\" in a:
            raise ValueError(f"llama-server argument {a!r} has whitespace or quotes; "
                             "systemd splits $LLAMA_SERVER_ARGS on whitespace")
    lines = ["# written by voltafleet: one llama-server instance"]
    lines.append(f"CUDA_VISIBLE_DEVICES={instance}" if cuda else "CUDA_VISIBLE_DEVICES=")
    lines.append("LLAMA_SERVER_ARGS=" + " ".join(args))
    return "\n".join(lines) + "\n"
