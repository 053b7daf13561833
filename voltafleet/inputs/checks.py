"""Checks that need more than one value, or the controller's own files: the port range of
a host's instances, the context a slot gets, the API key file. Each returns a list of
Problems (empty when all is well) naming the key, the file that set it and the fix.

    problems = port_problems(8080, count=8, other_ports={"gateway_port": 8000}, sources=src)
"""
from __future__ import annotations

import os
import re
import stat

from voltafleet.ground.errors import Problem

MAX_PORT = 65535
MIN_UNPRIVILEGED_PORT = 1024  # llama-server runs as server_user with no capabilities
MIN_SLOT_CTX = 512  # tokens a slot gets at the least: below it a chat prompt does not fit
SPLIT_GGUF = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")  # a split GGUF's part: -00001-of-00003.gguf


def _src(sources: dict | None, key: str) -> str | None:
    return (sources or {}).get(key)


def port_problems(base, count: int, other_ports: dict[str, int] | None = None,
                  sources: dict | None = None) -> list[Problem]:
    """Instance i listens on `base` (server_port_base) + i: the whole range must be valid ports an
    unprivileged user may bind, and miss every other port the project uses on the host
    (other_ports: {what uses it, e.g. "gateway_port": port})."""
    if not isinstance(base, int) or isinstance(base, bool) or count < 1:
        return []
    last = base + count - 1
    src = _src(sources, "server_port_base")
    span = f"port {base}" if count == 1 else f"ports {base}-{last} ({count} instances)"
    out = []
    if last > MAX_PORT:
        out.append(Problem(f"is {base}: {span} go past {MAX_PORT}",
                           f"set server_port_base to {MAX_PORT - count + 1} or less", src, "server_port_base"))
    if base < MIN_UNPRIVILEGED_PORT:
        out.append(Problem(f"is {base}: llama-server runs without privileges and cannot bind below "
                           f"{MIN_UNPRIVILEGED_PORT}", f"set server_port_base to {MIN_UNPRIVILEGED_PORT} "
                           "or more (8080 is the default)", src, "server_port_base"))
    for name, port in sorted((other_ports or {}).items(), key=lambda kv: kv[1]):
        if base <= port <= last:
            free = max(max((other_ports or {}).values()) + 1, MIN_UNPRIVILEGED_PORT)
            move = (f"set server_port_base to {free} or more" if free + count - 1 <= MAX_PORT
                    else f"set server_port_base below {port - count + 1}")
            out.append(Problem(f"is {base}: {span} include {port}, which {name} uses",
                               f"{move}, or change {name}", src, "server_port_base"))
    return out


def slot_ctx_problems(ctx, par, sources: dict | None = None) -> list[Problem]:
    """`ctx` (server_ctx) is the KV pool of all slots: each slot gets ctx / `par` (server_parallel)."""
    if not isinstance(ctx, int) or not isinstance(par, int) or par < 1:
        return []
    per = ctx // par
    if per >= MIN_SLOT_CTX:
        return []
    fix = f"raise server_ctx to {par * MIN_SLOT_CTX} or more"
    if ctx >= MIN_SLOT_CTX:
        fix += f", or lower server_parallel to {ctx // MIN_SLOT_CTX} or less"
    par_src = _src(sources, "server_parallel")
    return [Problem(f"is {ctx} for server_parallel {par} slots"
                    + (f" (set in {par_src})" if par_src and par_src != _src(sources, "server_ctx") else "")
                    + f": {per} tokens a slot, below the minimum {MIN_SLOT_CTX}", fix,
                    _src(sources, "server_ctx"), "server_ctx")]


def api_key_file_problems(path: str | None, sources: dict | None = None) -> list[Problem]:
    """The key file on the controller: there, a readable regular file holding a key, and
    not readable by group or others."""
    if not path:
        return []
    src, key = _src(sources, "server_api_key_file"), "server_api_key_file"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return [Problem(f"{path} does not exist on the controller",
                        f"write the key to {path} (chmod 600), or set server_api_key_file: null", src, key)]
    except OSError as e:
        return [Problem(f"{path} cannot be read: {e.strerror}", "check the path and its directories", src, key)]
    if not stat.S_ISREG(st.st_mode):
        return [Problem(f"{path} is not a regular file", "point it at the file holding the key", src, key)]
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 16)
    except OSError as e:
        return [Problem(f"{path} cannot be read: {e.strerror}",
                        f"make it readable by the user running pyinfra (chmod 600 {path}, owned by that user)",
                        src, key)]
    out = []
    if not any(line.strip() and not line.lstrip().startswith("#") for line in text.splitlines()):
        out.append(Problem(f"{path} holds no key (empty, or comments only)",
                           f"write the API key into {path}, one per line", src, key))
    if st.st_mode & 0o077:
        who = "everyone" if st.st_mode & 0o007 else "its group"
        out.append(Problem(f"{path} is open to {who} (mode {stat.S_IMODE(st.st_mode):03o}): a key must be private",
                           f"chmod 600 {path}", src, key))
    return out


def model_parts(url: str, shas) -> list[tuple[str, str | None]]:
    """Each part of model_url with its checksum: every part of a split GGUF (`-00001-of-00003.gguf`),
    else the one file. model_sha256 is one checksum, or a list with one per part (None:
    model_allow_unverified). ValueError when they do not pair (voltafleet.models.modelfiles
    places the files by them)."""
    m = SPLIT_GGUF.search(url)
    urls = [url] if not m else [url[:m.start()] + f"-{i:05d}-of-{m.group(2)}.gguf"
                                for i in range(1, int(m.group(2)) + 1)]
    if shas is None:
        shas = [None] * len(urls)  # model_allow_unverified
    elif isinstance(shas, str):
        if len(urls) > 1:
            raise ValueError(f"model_url is a split GGUF of {len(urls)} parts: model_sha256 must list "
                             "one checksum per part")
        shas = [shas]
    elif len(shas) != len(urls):
        raise ValueError(f"model_sha256 lists {len(shas)} checksums for {len(urls)} file(s)")
    return list(zip(urls, shas))
