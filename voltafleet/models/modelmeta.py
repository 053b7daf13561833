"""What the controller learns about a model without downloading it."""
from __future__ import annotations

import urllib.request


def remote_size(url: str, timeout: float = 15) -> int | None:
    """Content-Length of the model URL (HEAD, redirects followed), or None if unknown."""
    req = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            size = r.headers.get("Content-Length")
            return int(size) if size else None
    except (OSError, ValueError):
        return None
