"""Read a GGUF file's header (metadata and tensor table) without its tensor data.

A remote file is read with HTTP Range requests, a few MB at a time, never whole:
a 15 GB model's header is a few MB (most of it the tokenizer).

    >>> h = read_url("https://huggingface.co/.../Qwen3.6-27B-Q4_K_S.gguf")
    >>> h.arch, h.meta["qwen2.block_count"], h.tensor_bytes()
"""
from __future__ import annotations

import struct
import urllib.request
from dataclasses import dataclass, field

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
# GGUF value types: id -> struct format (None: string / array handled apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
KEEP_ARRAY_ITEMS = 64  # longer arrays (the vocabulary) are kept as their length only


class Truncated(Exception):
    """The bytes given end before the header does."""


@dataclass
class Tensor:
    name: str
    shape: list[int]
    type: int

    @property
    def nbytes(self) -> int:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.type)]
        n = 1
        for d in self.shape:
            n *= d
        return n // block * size


@dataclass
class Header:
    version: int
    meta: dict
    tensors: list[Tensor] = field(default_factory=list)
    header_bytes: int = 0

    @property
    def arch(self) -> str:
        return self.meta["general.architecture"]

    def get(self, key: str, default=None):
        """An architecture key without its prefix: h.get("block_count")."""
        return self.meta.get(f"{self.arch}.{key}", default)

    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


_U64 = struct.Struct("<Q")


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise Truncated(self.pos + n)
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def skip_strings(self, count: int) -> None:
        """Step over `count` strings (what `count` string() calls would read, and raise)."""
        data, pos, unpack, end = self.data, self.pos, _U64.unpack_from, len(self.data)
        for _ in range(count):
            if pos + 8 > end:
                raise Truncated(pos + 8)
            pos += 8 + unpack(data, pos)[0]
            if pos > end:
                raise Truncated(pos)
        self.pos = pos

    def string(self) -> str:
        return self.take(self.scalar("<Q")).decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype, count = self.scalar("<I"), self.scalar("<Q")
            if itype in _SCALARS and count > KEEP_ARRAY_ITEMS:
                self.take(struct.calcsize(_SCALARS[itype]) * count)
                return {"array_len": count}
            if itype == _STRING and count > KEEP_ARRAY_ITEMS:  # a vocabulary: stepped over, not decoded
                self.skip_strings(count)
                return {"array_len": count}
            items = [self.value(itype) for _ in range(count)]
            return items if count <= KEEP_ARRAY_ITEMS else {"array_len": count}
        raise ValueError(f"unknown GGUF value type {vtype}")


def parse(data: bytes) -> Header:
    """Parse a header from the first bytes of a GGUF file; raises Truncated if too few."""
    r = _Reader(data)
    if r.take(4) != MAGIC:
        raise ValueError("not a GGUF file (bad magic)")
    version = r.scalar("<I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old")
    n_tensors, n_kv = r.scalar("<Q"), r.scalar("<Q")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.scalar("<I"))
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.scalar("<Q") for _ in range(r.scalar("<I"))]
        ttype = r.scalar("<I")
        r.scalar("<Q")  # offset in the data section
        tensors.append(Tensor(name, dims, ttype))
    return Header(version, meta, tensors, r.pos)


def read_file(path: str, chunk: int = 4 << 20) -> Header:
    with open(path, "rb") as f:
        return _grow(lambda start, n: (f.seek(start), f.read(n))[1], chunk)


def read_url(url: str, chunk: int = 4 << 20, timeout: float = 30) -> Header:
    """Header of a remote GGUF through Range requests (the server must honour Range)."""

    def fetch(start: int, n: int) -> bytes:
        req = urllib.request.Request(url, headers={"Range": f"bytes={start}-{start + n - 1}"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            if resp.status != 206:
                raise ValueError(f"{url}: the server ignored the Range request (HTTP {resp.status}); "
                                 "a header read would download the whole model")
            return resp.read()

    return _grow(fetch, chunk)


def _grow(fetch, chunk: int, limit: int = 256 << 20) -> Header:
    data = b""
    while True:
        more = fetch(len(data), chunk)
        data += more
        try:
            return parse(data)
        except Truncated:
            if not more or len(data) >= limit:
                raise ValueError(f"GGUF header longer than {len(data)} bytes, or the file is cut short")
            chunk *= 2


def to_json(h: Header) -> dict:
    """A compact copy (metadata and tensor table) for fixtures and reports."""
    return {"version": h.version, "header_bytes": h.header_bytes, "meta": h.meta,
            "tensors": [[t.name, t.shape, t.type] for t in h.tensors]}


def from_json(d: dict) -> Header:
    return Header(d["version"], d["meta"], [Tensor(n, s, t) for n, s, t in d["tensors"]], d["header_bytes"])
