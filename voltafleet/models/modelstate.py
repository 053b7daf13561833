"""Whether a model file on a host is already verified (no re-hash of 15 GB)."""
from __future__ import annotations


def is_verified(state: dict | None, want: str | None) -> bool:
    """The file is present and its recorded verification (`sha256 size mtime` in the
    .verified sidecar) matches its size and mtime, and the wanted checksum if any."""
    if not state or not state.get("sidecar"):
        return False
    try:
        sha, size, mtime = state["sidecar"][0].split()
    except ValueError:
        return False
    if (int(size), int(mtime)) != (state["size"], state["mtime"]):
        return False
    return want is None or sha == want
