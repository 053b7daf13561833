"""A llama.cpp ref (tag, branch or commit) resolved to a commit with `git ls-remote`, on the
controller: once per rollout (the fleet plan keeps it), so every batch builds the same commit.

    >>> resolve("https://github.com/ggml-org/llama.cpp", "0c1e57098bba" + "0" * 28)  # a commit stays
    '0c1e57098bba0000000000000000000000000000'
"""
from __future__ import annotations

import re
import subprocess
from functools import lru_cache

SHA40 = re.compile(r"^[0-9a-f]{40}$")


class RefError(ValueError):
    """The ref cannot be resolved: says which variable and how to fix it."""


@lru_cache(maxsize=None)
def resolve(repo: str, ref: str) -> str:
    if SHA40.match(ref):
        return ref
    try:
        out = subprocess.run(["git", "ls-remote", "--", repo, ref, f"{ref}^{{}}"], capture_output=True,
                             text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise RefError(f"llama_cpp_ref: `git ls-remote {repo}` timed out. Fix: check the "
                       "llama_cpp_repo URL and the controller's network.")
    if out.returncode != 0:
        raise RefError(f"llama_cpp_repo: `git ls-remote {repo}` failed: {out.stderr.strip()}. "
                       "Fix: check the URL in group_vars.")
    refs = dict(reversed(line.split("\t")) for line in out.stdout.splitlines() if "\t" in line)
    for name in (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}", ref):
        if name in refs:
            return refs[name]
    raise RefError(f"llama_cpp_ref: {ref!r} is not a tag, branch or commit of {repo}. "
                   "Fix: set llama_cpp_ref to an existing tag or a full 40-hex commit.")
