"""Pin the served model file to its sha256, read once from the model's own URL.

Hugging Face answers a `resolve` URL of a file stored in LFS with a redirect whose headers
carry the file's sha256 in `X-Linked-Etag` (what huggingface_hub verifies downloads
against). This reads it with HEAD requests (following redirects, the header taken from
whichever response in the chain carries it), shows it, and records it in the group_vars
file that sets model_url (its `model_sha256:` line rewritten, comments kept). Every later
rollout verifies the download against the recorded value; `--check` notices a changed
upstream file (exit 1) instead of serving it silently.

    python -m voltafleet.inputs.pin_model                 # read, show, record
    python -m voltafleet.inputs.pin_model --check         # exit 0 if upstream matches the record, 1 if not
    python -m voltafleet.inputs.pin_model --vars group_vars/v100_32gb.yml --url https://...

Exit codes: 0 ok, 1 upstream differs from the record (--check), 2 cannot read or record.
"""
from __future__ import annotations

import argparse
import http.client
import re
import sys
from pathlib import Path
from urllib.parse import urljoin, urlsplit

HEX64 = re.compile(r"^[0-9a-f]{64}$")
LINE = re.compile(r"^(model_sha256:[ \t]*)(\S+)?([ \t]*#.*)?$", re.M)
URL_LINE = re.compile(r"^model_url:[ \t]*(\S+)", re.M)


class PinError(Exception):
    """Names the URL or file and the fix."""


def linked_sha256(url: str, timeout: float = 30, max_hops: int = 10) -> tuple[str, list[str]]:
    """(sha256 from X-Linked-Etag, the chain of URLs visited). HEAD only: nothing is downloaded."""
    chain = []
    for _ in range(max_hops):
        chain.append(url)
        u = urlsplit(url)
        if u.scheme not in ("http", "https"):
            raise PinError(f"model_url {url}: only http(s) URLs carry X-Linked-Etag")
        conn = (http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection)(
            u.hostname, u.port, timeout=timeout)
        try:
            conn.request("HEAD", (u.path or "/") + (f"?{u.query}" if u.query else ""),
                         headers={"User-Agent": "voltafleet-pin-model", "Accept-Encoding": "identity"})
            r = conn.getresponse()
            r.read()
            etag = r.getheader("X-Linked-Etag")
            location = r.getheader("Location")
            status = r.status
        except OSError as e:
            raise PinError(f"model_url {url}: HEAD failed ({e}). Fix: check the URL and the network") from e
        finally:
            conn.close()
        if etag:
            sha = etag.strip().removeprefix("W/").strip('"').lower()
            if not HEX64.match(sha):
                raise PinError(f"{url}: X-Linked-Etag is {etag!r}, not a sha256 (a file outside LFS?). "
                               "Fix: take the sha256 from the file's page and set model_sha256 by hand")
            return sha, chain
        if status in (301, 302, 303, 307, 308) and location:
            url = urljoin(url, location)
            continue
        if status >= 400:
            raise PinError(f"model_url {url}: HTTP {status}. Fix: check model_url (a Hugging Face "
                           "`resolve` URL, or a mirror that sends X-Linked-Etag)")
        break
    raise PinError(f"model_url {chain[0]}: no X-Linked-Etag header in {len(chain)} response(s) "
                   f"({' -> '.join(chain)}). Fix: use the Hugging Face resolve URL, or have the mirror send "
                   "`add_header X-Linked-Etag <sha256>;`, or set model_sha256 by hand")


def recorded(text: str) -> str | None:
    m = LINE.search(text)
    if not m:
        return None
    v = (m.group(2) or "").strip("'\"")
    return v if HEX64.match(v) else None


def record(text: str, sha: str, path: str) -> str:
    """The file's text with its model_sha256 line set to `sha`, its comment kept (a new line
    after model_url when there is none)."""
    if LINE.search(text):
        return LINE.sub(lambda m: m.group(1) + sha + (m.group(3) or ""), text, count=1)
    m = URL_LINE.search(text)
    if not m:
        raise PinError(f"{path}: sets no model_url. Fix: pass --vars with the file that sets model_url")
    end = text.index("\n", m.end()) + 1 if "\n" in text[m.end():] else len(text)
    return text[:end] + f"model_sha256: {sha}  # pinned by python -m voltafleet.inputs.pin_model\n" + text[end:]


def vars_file(root: Path) -> Path:
    hits = [p for p in sorted((root / "group_vars").glob("*.yml")) if URL_LINE.search(p.read_text())]
    if len(hits) != 1:
        raise PinError(f"{root / 'group_vars'}: {len(hits)} files set model_url "
                       f"({', '.join(p.name for p in hits) or 'none'}). Fix: pass --vars FILE")
    return hits[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m voltafleet.inputs.pin_model", description=__doc__.split("\n")[0])
    ap.add_argument("--vars", help="group_vars file that sets model_url (default: the one under group_vars/)")
    ap.add_argument("--url", help="read this URL instead of the file's model_url")
    ap.add_argument("--check", action="store_true", help="only compare upstream with the recorded sha256")
    ap.add_argument("--root", default=".", help="project root (default: .)")
    a = ap.parse_args(argv)
    try:
        path = Path(a.vars) if a.vars else vars_file(Path(a.root))
        text = path.read_text()
        url = a.url or (URL_LINE.search(text) or [None, None])[1]
        if not url:
            raise PinError(f"{path}: sets no model_url. Fix: pass --url or --vars")
        sha, chain = linked_sha256(url)
        print(f"{url}\n  sha256 {sha}" + (f"  (via {' -> '.join(chain[1:])})" if len(chain) > 1 else ""))
        old = recorded(text)
        if a.check:
            if old == sha:
                print(f"{path}: model_sha256 matches upstream")
                return 0
            print(f"{path}: model_sha256 is {old or 'not set'}, upstream is {sha}: the file at model_url changed "
                  "(or was never pinned). Fix: check the new file, then run python -m voltafleet.inputs.pin_model",
                  file=sys.stderr)
            return 1
        if old == sha:
            print(f"{path}: already pinned")
            return 0
        path.write_text(record(text, sha, str(path)))
        print(f"{path}: model_sha256 {old or 'unset'} -> {sha}")
        print("next, record the model's golden quality probe (kept in probes/, compared on every host in every "
              "run): python -m rollout INVENTORY --canary HOST --record-probe, then commit probes/")
        return 0
    except PinError as e:
        print(f"pin_model: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
