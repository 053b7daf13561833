"""Every variable a user may set, its type and range, and the checks that run on the
merged data of each host before any host is touched.

Values come from group_vars/all.yml, then group_vars/<group>.yml for each group of the
host (inventory order), then the inventory's own host data. Each value remembers the
file that set it, so an error names the file, the key and the fix.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any

HEX64 = re.compile(r"^[0-9a-f]{64}$")
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+-]*$")
KV_TYPES = ("f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1", "f32")


class ConfigError(Exception):
    """A bad value in the user's data: says where it came from and how to fix it."""


@dataclass(frozen=True)
class Var:
    kind: type | tuple[type, ...]
    nullable: bool = False
    choices: tuple = ()
    min: float | None = None
    max: float | None = None
    item: type | None = None  # for lists
    pattern: re.Pattern | None = None
    hint: str = ""


def _ports():
    return Var(int, min=1, max=65535)


SCHEMA: dict[str, Var] = {
    # preflight
    "voltafleet_backend": Var(str, choices=("cuda", "cpu")),
    "voltafleet_root": Var(str, pattern=SAFE_PATH, hint="an absolute path without spaces"),
    "preflight_build_disk_gb": Var((int, float), min=0),
    "preflight_supported_os": Var(list, item=str),
    # toolchain
    "cuda_toolkit_version": Var(str, pattern=re.compile(r"^\d+\.\d+$"), hint='like "12.9"'),
    "manage_driver": Var(bool),
    "nvidia_driver_branch": Var(int, min=470, max=999),
    "nvidia_driver_flavour": Var(str, choices=("proprietary", "open")),
    "nvidia_driver_source": Var(str, choices=("nvidia_repo", "distro")),
    # llama.cpp build
    "llama_cpp_repo": Var(str),
    "llama_cpp_ref": Var(str, pattern=re.compile(r"^[A-Za-z0-9._/-]+$"),
                         hint="a tag, a branch or a 40-hex commit"),
    "llama_cpp_cuda_archs": Var(list, item=int, nullable=True),
    "llama_cpp_cmake_extra": Var(list, item=str),
    "llama_cpp_targets": Var(list, item=str),
    "llama_cpp_build_strategy": Var(str, choices=("shared", "per_host")),
    "llama_cpp_build_jobs": Var(int, nullable=True, min=1, max=256),
    "llama_cpp_keep_releases": Var(int, min=1, max=20),
    # model
    "model_url": Var(str, pattern=re.compile(r"^(https?|file)://\S+$"), hint="an http(s) URL"),
    "model_sha256": Var((str, list), nullable=True, pattern=HEX64,
                        hint="64 lowercase hex digits (a list of them for a split GGUF)"),
    "model_allow_unverified": Var(bool),
    "model_dir": Var(str, pattern=SAFE_PATH, hint="an absolute path without spaces"),
    "model_draft_url": Var(str, nullable=True, pattern=re.compile(r"^(https?|file)://\S+\.gguf$"),
                           hint="an http(s) URL of a .gguf"),
    "model_draft_sha256": Var(str, nullable=True, pattern=HEX64, hint="64 lowercase hex digits"),
    # server
    "server_instances": Var(int, nullable=True, min=1, max=16),
    "server_port_base": _ports(),
    "server_host": Var(str),
    "server_ctx": Var(int, nullable=True, min=256, max=1 << 20),
    "server_parallel": Var(int, nullable=True, min=1, max=64),
    "vram_headroom_mib": Var(int, min=0, max=65536),
    "vram_cuda_overhead_mib": Var(int, min=0, max=65536),
    "server_cache_type_k": Var(str, choices=KV_TYPES),
    "server_cache_type_v": Var(str, choices=KV_TYPES),
    "server_flash_attn": Var(str, choices=("on", "off", "auto")),
    "server_gpu_layers": Var((str, int), hint='"all" or a layer count'),
    "server_allow_partial_offload": Var(bool),
    "server_threads": Var(int, min=1, max=256),
    "server_api_key_file": Var(str, nullable=True, pattern=SAFE_PATH,
                               hint="a path on the controller to a file holding the key"),
    "server_extra_flags": Var(list, item=str),
    "server_user": Var(str, pattern=re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")),
    # smoke
    "smoke_enabled": Var(bool),
    "smoke_tokens": Var(int, min=8, max=4096),
    "smoke_parallel": Var(int, nullable=True, min=1, max=64),
    "smoke_health_timeout_s": Var(int, min=5, max=3600),
    "smoke_max_ttft_ms": Var((int, float), min=1),
    "smoke_min_single_tps": Var((int, float), min=0),
    "smoke_min_aggregate_tps": Var((int, float), min=0),
    "smoke_rollback": Var(bool),
    "smoke_report_dir": Var(str),
}


@dataclass
class Sourced:
    """Merged host data that remembers which file set each key."""

    values: dict[str, Any] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)

    def update(self, data: dict, origin: str) -> None:
        for k, v in data.items():
            self.values[k] = v
            self.source[k] = origin


def _type_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({str: "a string", int: "an integer", float: "a number", bool: "true/false",
                        list: "a list"}[k] for k in kinds)


def _is(value, kind) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        return False
    return isinstance(value, kinds)


def check_value(key: str, value: Any, origin: str) -> None:
    var = SCHEMA[key]

    def fail(why: str, fix: str) -> None:
        raise ConfigError(f"{origin}: {key}: {why}. Fix: {fix}.")

    if value is None:
        if not var.nullable:
            fail("must be set (it is empty)", f"give {_type_name(var.kind)}")
        return
    if isinstance(value, bool) and "on" in var.choices:
        fail(f"is {value!r}: YAML reads a bare on/off as true/false", 'quote it: "on" or "off"')
    if not _is(value, var.kind):
        fail(f"is {value!r} ({type(value).__name__})", f"give {_type_name(var.kind)}"
             + (f", {var.hint}" if var.hint else ""))
    if var.choices and value not in var.choices:
        fail(f"is {value!r}", "use one of " + ", ".join(map(str, var.choices)))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if var.min is not None and value < var.min:
            fail(f"is {value}, below the minimum {var.min}", f"set {var.min} or more")
        if var.max is not None and value > var.max:
            fail(f"is {value}, above the maximum {var.max}", f"set {var.max} or less")
    if var.pattern is not None and isinstance(value, str) and not var.pattern.match(value):
        fail(f"is {value!r}", f"give {var.hint or 'a value matching ' + var.pattern.pattern}")
    if isinstance(value, list) and var.pattern is not None:
        for v in value:
            if not isinstance(v, str) or not var.pattern.match(v):
                fail(f"has the item {v!r}", f"every item must be {var.hint}")
    if var.item is not None:
        for v in value:
            if not _is(v, var.item):
                fail(f"has the item {v!r}", f"every item must be {_type_name(var.item)}")


def validate(host: str, data: Sourced) -> dict:
    """Check one host's merged data; return the plain values or raise ConfigError."""
    for key, origin in data.source.items():
        if key not in SCHEMA:
            close = difflib.get_close_matches(key, SCHEMA, n=1)
            fix = f"did you mean {close[0]!r}?" if close else "remove it (see group_vars/all.yml)"
            raise ConfigError(f"{origin}: {key}: unknown key. Fix: {fix}")
    for key in SCHEMA:
        if key not in data.values:
            raise ConfigError(f"group_vars/all.yml: {key}: missing (host {host}). "
                              f"Fix: restore it from the repository's group_vars/all.yml.")
        check_value(key, data.values[key], data.source[key])
    v, src = data.values, data.source

    def fail(key: str, why: str, fix: str) -> None:
        raise ConfigError(f"{src[key]}: {key}: {why} (host {host}). Fix: {fix}.")

    if v["model_sha256"] is None and not v["model_allow_unverified"]:
        fail("model_sha256", "no checksum for the model, so a corrupt download would be served",
             "set model_sha256 to the file's sha256 (Hugging Face shows it on the file page), "
             "or set model_allow_unverified: true")
    if v["model_draft_url"] and v["model_draft_sha256"] is None and not v["model_allow_unverified"]:
        fail("model_draft_sha256", "no checksum for the draft model",
             "set model_draft_sha256, or model_allow_unverified: true")
    if v["server_cache_type_v"] != "f16" and v["server_cache_type_v"] != "f32" \
            and v["server_flash_attn"] == "off":
        fail("server_flash_attn", f"is off, but server_cache_type_v is {v['server_cache_type_v']} "
             "and a quantized V cache needs flash attention (llama-server aborts)",
             "set server_flash_attn: on, or server_cache_type_v: f16")
    layers = v["server_gpu_layers"]
    if isinstance(layers, str) and layers != "all":
        fail("server_gpu_layers", f"is {layers!r}", 'use "all" or a layer count')
    if v["voltafleet_backend"] == "cuda" and layers != "all" and not v["server_allow_partial_offload"]:
        fail("server_gpu_layers", f"is {layers}: layers left on the CPU make decode several times "
             "slower (the seed's 4 tok/s)",
             'use "all", or set server_allow_partial_offload: true if you mean it')
    if v["voltafleet_backend"] == "cpu":
        for key in ("server_ctx", "server_parallel"):
            if v[key] is None:
                fail(key, "is empty on the cpu backend (the VRAM planner picks it only for GPUs)",
                     f"set {key}")
    if v["voltafleet_backend"] == "cpu" and v["server_instances"] is None:
        fail("server_instances", "is empty on the cpu backend (there are no GPUs to count)",
             "set server_instances to the number of servers per host")
    for flag in v["server_extra_flags"]:
        if flag.split("=")[0] in ("--api-key", "-ak"):
            fail("server_extra_flags", "passes an API key on the command line, where `ps` shows it",
                 "put the key in a file and set server_api_key_file")
    from voltafleet.hostplan import model_files  # the same rule the model role follows

    try:
        model_files(v)
    except ValueError as e:
        fail("model_sha256", str(e), "give one sha256 per file of the model")
    return dict(v)
