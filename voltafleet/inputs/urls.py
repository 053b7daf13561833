"""Strict grammars for the URLs and names that reach a shell or a command line: a value
that passes here holds no shell metacharacter, no whitespace and no leading `-`, so it
cannot become a command or an option even where a script forgets to quote it.

Each check returns None when the value is good, else the reason (for ConfigError).
"""
from __future__ import annotations

import ipaddress
import posixpath
import re

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")
# RFC 3986 unreserved characters, percent-escapes and the path separator: no shell metacharacter.
_PATH_CHARS = r"[A-Za-z0-9._~%/+-]"
HTTP_URL = re.compile(
    rf"^(?P<scheme>https?)://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::(?P<port>\d{{1,5}}))?"
    rf"(?P<path>/{_PATH_CHARS}*)(?:\?(?P<query>[A-Za-z0-9._~%/+=-]*))?$")
GGUF_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\.gguf$")
_GIT_PATH = r"[A-Za-z0-9._~/+-]*"
GIT_URL = re.compile(
    rf"^(?P<scheme>https|git|ssh)://(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9._-]*)@)?"
    rf"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::(?P<port>\d{{1,5}}))?(?P<path>/{_GIT_PATH})$")
GIT_SCP = re.compile(r"^(?P<user>[A-Za-z0-9_][A-Za-z0-9._-]*)@(?P<host>[A-Za-z0-9.-]+):"
                     r"(?P<path>[A-Za-z0-9._~+][A-Za-z0-9._~/+-]*)$")
GIT_LOCAL = re.compile(r"^/[A-Za-z0-9._/+-]*$")
GIT_REF = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/+-]*$")
SHELL_META = set("`$;&|<>(){}[]*?!~#'\"\\") | {" ", "\t", "\n", "\r"}


def _host_ok(host: str) -> bool:
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
            return True
        except ValueError:
            return False
    return bool(HOSTNAME.fullmatch(host))


def _shown(value: str) -> str:
    bad = sorted({c for c in value if c in SHELL_META or not c.isprintable()})
    return f" (it holds {' '.join(repr(c) for c in bad)})" if bad else ""


def http_url_error(url: str, gguf: bool = True) -> str | None:
    """model_url / model_draft_url: http(s) only, no credentials, no shell metacharacters,
    and (gguf) a path that ends in a plain .gguf file name."""
    if not isinstance(url, str):
        return "is not a string"
    m = HTTP_URL.fullmatch(url)
    if not m:
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", url) and not url.lower().startswith(("http://", "https://")):
            return f"is {url!r}: only http:// and https:// URLs are fetched"
        netloc = url.split("://", 1)[-1].split("/", 1)[0]
        if "@" in netloc:
            return f"is {url!r}: credentials in a URL end up in logs and process lists"
        return f"is {url!r}, not a plain http(s) URL{_shown(url)}"
    if not _host_ok(m["host"]):
        return f"is {url!r}: {m['host']!r} is not a host name"
    if m["port"] and not 0 < int(m["port"]) <= 65535:
        return f"is {url!r}: port {m['port']} is out of range"
    if gguf:
        name = posixpath.basename(m["path"])
        if not GGUF_NAME.fullmatch(name):
            return f"is {url!r}: the path must end in a .gguf file name (letters, digits, . _ + -)"
    return None


def git_url_error(url: str) -> str | None:
    """llama_cpp_repo: https://, git://, ssh://, user@host:path or an absolute local path."""
    if not isinstance(url, str):
        return "is not a string"
    if url.startswith("-"):
        return f"is {url!r}: a leading '-' makes git read it as an option"
    for grammar in (GIT_URL, GIT_SCP):
        m = grammar.fullmatch(url)
        if m:
            if not _host_ok(m["host"]):
                return f"is {url!r}: {m['host']!r} is not a host name"
            if m.groupdict().get("port") and not 0 < int(m["port"]) <= 65535:
                return f"is {url!r}: port {m['port']} is out of range"
            return None
    if GIT_LOCAL.fullmatch(url) and "/../" not in url + "/":
        return None
    return f"is {url!r}, not a git URL{_shown(url)}"


def git_ref_error(ref: str) -> str | None:
    """llama_cpp_ref: a tag, a branch or a commit; never an option, never a revision range."""
    if not isinstance(ref, str):
        return "is not a string"
    if ref.startswith("-"):
        return f"is {ref!r}: a leading '-' makes git read it as an option"
    if not GIT_REF.fullmatch(ref) or ".." in ref or "//" in ref or ref.endswith(("/", ".", ".lock")):
        return f"is {ref!r}, not a git tag, branch or commit{_shown(ref)}"
    return None


SCOPE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")  # a Linux interface name (IFNAMSIZ - 1)


def server_host_error(host: str) -> str | None:
    """server_host: an IPv4/IPv6 address or a host name (the health check needs TCP)."""
    if not isinstance(host, str):
        return "is not a string"
    addr, _, scope = host.partition("%")
    if scope or host.endswith("%"):  # an IPv6 scope id (fe80::1%eth0): an interface name, nothing else
        if not (SCOPE_ID.fullmatch(scope) and ":" in addr):
            return f"is {host!r}: an IPv6 scope id is an interface name (letters, digits, . _ -){_shown(host)}"
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    if HOSTNAME.fullmatch(host) and not re.fullmatch(r"[0-9.]+", host):
        return None
    return f"is {host!r}, not an IP address or a host name{_shown(host)}"


def is_loopback(host: str) -> bool:
    """An address only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
