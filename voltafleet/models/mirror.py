"""One download per fleet: hosts of the `mirror` inventory group run nginx as a pull-through
cache (roles/mirror) of model_url's origin, and every server host fetches the model through
one of them, chosen by a rendezvous hash of its name (the same host always asks the same
mirror; several mirrors share the fleet; a mirror added or gone moves only its own share).
The sha256 is still verified on every server host against model_sha256.

Decided once per rollout (the rolling driver puts the mirrors into the fleet plan), else
once per run from the inventory. Pure logic, no pyinfra.

    >>> m = [Mirror("mirror-1", "10.0.0.5", 8880, "https://huggingface.co")]
    >>> fetch_url("https://huggingface.co/u/r/resolve/main/m.gguf", "gpu-01", m)
    'http://10.0.0.5:8880/u/r/resolve/main/m.gguf'
    >>> fetch_url("https://example.org/m.gguf", "gpu-01", m)   # another origin: fetched directly
    'https://example.org/m.gguf'
"""
from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from voltafleet.inputs.settings import Settings
from voltafleet.models.modelfiles import model_files  # the model's parts and the draft model: what the fleet fetches

GROUP = "mirror"
DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Mirror:
    host: str       # inventory name
    address: str    # where server hosts reach it
    port: int       # mirror_port
    upstream: str   # the origin it caches: scheme://host[:port] of its model_url


def origin(url: str) -> str:
    """scheme://host[:port] of an http(s) URL, lowercased, the scheme's default port left out."""
    u = urlsplit(url)
    scheme, host = u.scheme.lower(), (u.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    port = u.port
    return f"{scheme}://{host}" + (f":{port}" if port and port != DEFAULT_PORTS.get(scheme) else "")


def host_port(address: str, port: int) -> str:
    """address:port, an IPv6 address in brackets."""
    try:
        if isinstance(ipaddress.ip_address(address), ipaddress.IPv6Address):
            return f"[{address}]:{port}"
    except ValueError:
        pass
    return f"{address}:{port}"


def mirror_of(name: str, cfg: Settings, ssh_hostname: str | None = None) -> Mirror:
    """A mirror host's entry from its settings and the address pyinfra connects to (ssh_hostname):
    reached at mirror_address, else ssh_hostname, else its name."""
    address = cfg.mirror.address or ssh_hostname or name
    return Mirror(host=name, address=address, port=int(cfg.mirror.port), upstream=origin(cfg.model.url))


def mirrors_of(hosts: list[tuple[str, Settings, str | None]]) -> tuple[Mirror, ...]:
    """The fleet's mirrors, inventory order: [(name, settings, ssh_hostname)] of the `mirror` group's hosts."""
    return tuple(mirror_of(name, cfg, ssh) for name, cfg, ssh in hosts)


def _score(mirror: Mirror, host: str) -> bytes:
    return hashlib.sha256(f"{mirror.host}\n{host}".encode()).digest()


def pick(host: str, mirrors) -> Mirror:
    """The mirror that `host` fetches through: highest random weight (rendezvous hashing)
    of (mirror, host), deterministic and spread evenly."""
    if not mirrors:
        raise ValueError("no mirror to pick from")
    return max(mirrors, key=lambda m: (_score(m, host), m.host))


def for_url(url: str, mirrors) -> list[Mirror]:
    """The mirrors that cache url's origin."""
    o = origin(url)
    return [m for m in mirrors if m.upstream == o]


def fetch_url(url: str, host: str, mirrors) -> str:
    """The URL `host` fetches `url` from: http://<mirror>:<port>/<path>?<query> through the
    mirror picked for it among those caching url's origin; url itself when none does."""
    candidates = for_url(url, mirrors)
    if not candidates:
        return url
    m = pick(host, candidates)
    u = urlsplit(url)
    return f"http://{host_port(m.address, m.port)}{u.path or '/'}" + (f"?{u.query}" if u.query else "")


def resolvers(lines) -> list[str]:
    """nginx `resolver` addresses from /etc/resolv.conf's nameserver lines (IPv6 in brackets;
    a link-local address with a zone, which nginx cannot take, left out)."""
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) < 2 or parts[0] != "nameserver" or "%" in parts[1]:
            continue
        try:
            ip = ipaddress.ip_address(parts[1])
        except ValueError:
            continue
        out.append(f"[{ip}]" if ip.version == 6 else str(ip))
    return out


def allow_list(addresses: list[str]) -> list[str] | None:
    """The server hosts' addresses as nginx `allow` entries, when every one of them is an IP
    address (nginx allows addresses, not names); None when one is not known that way (a host
    name): then the mirror answers any address that reaches its port."""
    out = set()
    for a in addresses:
        try:
            out.add(str(ipaddress.ip_address(a)))
        except ValueError:
            return None
    return sorted(out) or None


def nginx_vars(cfg: Settings, nameservers: list[str], fetchers: list[str] | None = None) -> dict:
    """The template's variables (templates/nginx-mirror.conf.j2) from a mirror host's
    validated variables and its nameservers; `fetchers`: the addresses allowed to fetch
    (allow_list of the server hosts), None for any."""
    up = origin(cfg.model.url)
    paths = sorted({urlsplit(f.url).path for f in model_files(cfg) if origin(f.url) == up}
                   | set(cfg.mirror.extra_paths or []))
    return {
        "upstream": up,
        "paths": paths,
        "allow": fetchers or [],
        "https": up.startswith("https://"),
        "listen": host_port(cfg.mirror.listen, cfg.mirror.port),
        "port": cfg.mirror.port,
        "cache_dir": cfg.mirror.cache_dir,
        "cache_max_gb": cfg.mirror.cache_max_gb,
        "slice_mb": cfg.mirror.slice_mb,
        "valid_days": cfg.mirror.cache_valid_days,
        "lock_timeout_s": cfg.mirror.lock_timeout_s,
        "socket": SOCKET,
        "resolvers": nameservers,
        "ca_file": CA_FILE,
        "access_log": ACCESS_LOG,
    }


# the inner server that follows the upstream's redirects (Hugging Face answers a model file
# with a 302 to its CDN), reached by the caching server only
SOCKET = "/run/nginx-voltafleet-mirror.sock"
CA_FILE = "/etc/ssl/certs/ca-certificates.crt"
ACCESS_LOG = "/var/log/nginx/voltafleet-mirror.log"
