"""Model: fetch the GGUF resumably, verify its sha256, and rename it into place atomically.

A wrong checksum, a 404 or a broken transfer never replaces a good file and never leaves
a half file where the server reads: downloads go to <file>.part (kept for resuming a
broken transfer), and only a verified file is renamed over <file>. A verified file is
recorded as `sha256 size mtime` in <file>.verified, so later runs do not re-hash 15 GB.
"""
from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import deploy, operation

from roles.facts import FileState


def is_verified(state: dict | None, want: str | None) -> bool:
    """The file is present and its recorded verification matches its size and mtime."""
    if not state or not state.get("sidecar"):
        return False
    try:
        sha, size, mtime = state["sidecar"][0].split()
    except ValueError:
        return False
    if (int(size), int(mtime)) != (state["size"], state["mtime"]):
        return False
    return want is None or sha == want


def fetch_script(url: str, dest: str, want: str | None) -> str:
    q = shlex.quote
    part = dest + ".part"
    return f"""set -eu
dest={q(dest)}; part={q(part)}; want={q(want or '')}
mkdir -p "$(dirname "$dest")"; chmod 755 "$(dirname "$dest")"
got=""
if [ -f "$dest" ] && [ -n "$want" ]; then got=$(sha256sum < "$dest" | cut -d' ' -f1); fi
if [ -z "$want" ] || [ "$got" != "$want" ]; then
  rc=0; curl -fsSL --retry 5 --retry-delay 2 --connect-timeout 20 -C - -o "$part" {q(url)} || rc=$?
  if [ $rc -ne 0 ]; then
    # 22/33: the server refused the resume (e.g. 416, the partial is already whole): verify it below.
    if {{ [ $rc -ne 22 ] && [ $rc -ne 33 ]; }} || [ ! -s "$part" ]; then
      echo "voltafleet: download of {url} failed (curl exit $rc); partial kept at $part, the next run resumes it; $dest untouched" >&2; exit 1
    fi
  fi
  got=$(sha256sum < "$part" | cut -d' ' -f1)
  if [ -n "$want" ] && [ "$got" != "$want" ]; then
    rm -f "$part"
    echo "voltafleet: sha256 of the download is $got, model_sha256 says $want; removed the download, $dest untouched" >&2; exit 1
  fi
  chmod 644 "$part"; mv -f "$part" "$dest"
fi
echo "$got $(stat -c '%s %Y' "$dest")" > "$dest.verified.tmp"; mv -f "$dest.verified.tmp" "$dest.verified"
"""


@operation()
def fetched(url: str, dest: str, sha256: str | None):
    """Download url to dest unless dest is already verified.

    + url: HTTP(S) URL (Hugging Face resolve URL or a mirror); must honour Range to resume
    + dest: absolute path of the model file on the host
    + sha256: expected checksum, or None to accept any file (model_allow_unverified)

    .. code:: python

        model.fetched(url="https://huggingface.co/.../Qwen3.6-27B-Q4_K_S.gguf",
                      dest="/var/lib/voltafleet/models/Qwen3.6-27B-Q4_K_S.gguf", sha256="...")
    """
    if is_verified(host.get_fact(FileState, path=dest, sidecar=dest + ".verified"), sha256):
        return
    yield fetch_script(url, dest, sha256)


@deploy("Model")
def model(ctx: dict):
    """Fetch and verify this host's model files (every part of a split GGUF, the draft
    model). Returns the operations, whose `changed` tells the server role to restart.

    .. code:: python

        model_ops = model(ctx)
    """
    return [fetched(name=f"Fetch and verify {dest}", url=url, dest=dest, sha256=sha)
            for url, dest, sha in ctx["model_files"]]
