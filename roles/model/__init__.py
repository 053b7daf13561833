"""Model: fetch the GGUF resumably, verify its sha256, and rename it into place atomically
(roles/model/files/vf-fetch-model.sh).

With a `mirror` group in the inventory, every file of the mirrors' origin comes through the
mirror that voltafleet.models.mirror picks for the host (roles/mirror: nginx caching it once).

A wrong checksum, a 404 or a broken transfer never replaces a good file and never leaves
a half file where the server reads: downloads go to <file>.part (kept for resuming a
broken transfer), and only a verified file is renamed over <file>. A verified file is
recorded as `sha256 size mtime` in <file>.verified, so later runs do not re-hash 15 GB.
"""
from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FunctionCommand, deploy, operation

from roles.gateway_api import fleet_mirrors

from roles.run import config, report_dir, run_context
from roles.shell import bin_path, live, q, sh
from roles.facts import FileState
from voltafleet.models.modelfiles import ModelFile
from voltafleet.planning.hostplan import HostPlan
from voltafleet.models.mirror import fetch_url
from voltafleet.models.modelstate import is_verified
from voltafleet.state.records import Download, Fetch
from voltafleet.state.runctx import RunDir


def fetch_command(fetcher: str, url: str, dest: str, sha256: str | None) -> str:
    return " ".join(shlex.quote(a) for a in [fetcher, url, dest] + ([sha256] if sha256 else []))


@operation()
def fetched(fetcher: str, url: str, dest: str, sha256: str | None):
    """Download url to dest unless dest is already verified.

    + fetcher: path of vf-fetch-model on the host
    + url: HTTP(S) URL (Hugging Face resolve URL or a mirror); must honour Range to resume
    + dest: absolute path of the model file on the host
    + sha256: expected checksum, or None to accept any file (model_allow_unverified)

    .. code:: python

        model.fetched(fetcher="/opt/voltafleet/bin/vf-fetch-model",
                      url="https://huggingface.co/.../Qwen3.6-27B-Q4_K_S.gguf",
                      dest="/var/lib/voltafleet/models/Qwen3.6-27B-Q4_K_S.gguf", sha256="...")
    """
    if is_verified(host.get_fact(FileState, path=dest, sidecar=dest + ".verified"), sha256):
        return
    yield live(fetch_command(fetcher, url, dest, sha256))
    yield FunctionCommand(_downloaded, (dest,), {})


def _downloaded(state, host, dest: str) -> bool:
    """fetch-<host>.json: this download (the bytes this run fetched, curl's seconds: the
    <dest>.fetched vf-fetch-model leaves, read and removed here) added to the run's record."""
    stats = q(f"{dest}.fetched")
    ok, out = sh(host, f"if [ -f {stats} ]; then cat -- {stats}; rm -f -- {stats}; fi")
    try:
        size, micros = (int(v) for v in out.stdout.split())
    except ValueError:  # no download (the file was whole, verified only), or no figures
        return True
    records, run = RunDir(report_dir(config())), run_context().run
    before = records.read(Fetch, host.name, run)
    records.write(Fetch(host=host.name, run=run, downloads=(before.downloads if before else ())
                        + (Download(dest=dest, bytes=size, seconds=round(micros / 1e6, 3)),)))
    return True


@deploy("Model")
def model(plan: HostPlan) -> list:
    """Fetch and verify this host's model files (every part of a split GGUF, the draft
    model), through the fleet's model mirror when the inventory has a `mirror` group (the
    mirror picked for this host; a file of another origin directly); the checksum is the
    same. Returns the operations: the server role restarts when one of them changed.

    .. code:: python

        model_ops = model(plan)
    """
    fetcher = bin_path(plan, "vf-fetch-model")
    mirrors = fleet_mirrors(host.state)
    ops = []
    for f in plan.model_files:
        url = fetch_url(f.url, host.name, mirrors)
        via = f" (through {url.split('/')[2]})" if url != f.url else ""
        ops.append(fetched(name=f"Fetch and verify {f.dest}{via}", fetcher=fetcher, url=url, dest=f.dest,
                           sha256=f.sha256))
    return ops


__all__ = ["ModelFile", "fetch_command", "fetched", "model"]
