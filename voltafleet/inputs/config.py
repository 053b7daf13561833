"""Every variable a user may set, its type and range, and the checks that run on the
merged data of each host before any host is touched.

Values come from group_vars/all.yml, then group_vars/<group>.yml for each group of the
host (inventory order), then the inventory's own host data. Each value remembers the
file that set it, so an error names the file, the key and the fix.

`validate_values` runs the same checks on a plain dict, whatever its source: the roles
call it on what they read from host.data, so `pyinfra --data key=value` is checked too.
"""
from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from voltafleet.inputs import checks, teamvars, urls
from voltafleet.inputs.settings import Settings
from voltafleet.planning import flags
from voltafleet.ground.errors import Problem, format_errors

HEX64 = re.compile(r"^[0-9a-f]{64}$")
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+-]*$")
KV_TYPES = ("f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1", "f32")
# Where a value set with pyinfra's own `--data key=value` comes from, in messages.
CLI_SOURCE = "pyinfra --data"


class ConfigError(Exception):
    """A bad value in the user's data: says where it came from and how to fix it.

    str(e) is the whole block (format_errors); .problems holds each Problem."""

    def __init__(self, what: str | list[Problem], fix: str = "", source: str | None = None,
                 key: str | None = None, host: str | None = None):
        self.problems = what if isinstance(what, list) else [Problem(what, fix, source, key)]
        self.host = host
        super().__init__(format_errors(host, self.problems, "configuration refused, no host was touched"))


@dataclass(frozen=True)
class Var:
    kind: type | tuple[type, ...]
    nullable: bool = False
    choices: tuple = ()
    min: float | None = None
    max: float | None = None
    item: type | None = None  # for lists
    pattern: re.Pattern | None = None  # for a string, or each item of a list
    hint: str = ""
    check: Callable[[str], str | None] | None = None  # a string's grammar: None or the reason


# llama.cpp's drafting from the context's own n-grams (--spec-type): no draft model, no VRAM
NGRAM_TYPES = ("ngram-simple", "ngram-mod", "ngram-map-k", "ngram-map-k4v")


def _ports():
    return Var(int, min=1, max=65535)


def _safe_path_error(path: str) -> str | None:
    if not SAFE_PATH.fullmatch(path) or "/../" in path + "/" or path.startswith("//"):
        return f"is {path!r}, not an absolute path of plain names (letters, digits, . _ + - /, no ..)"
    return None


def _http_gguf(url: str) -> str | None:
    return urls.http_url_error(url, gguf=True)


BIND = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9][A-Za-z0-9.-]*):[0-9]{1,5}$")

SCHEMA: dict[str, Var] = {
    # preflight
    "voltafleet_backend": Var(str, choices=("cuda", "cpu")),
    "voltafleet_root": Var(str, check=_safe_path_error, hint="an absolute path without spaces"),
    "preflight_build_disk_gb": Var((int, float), min=0),
    "preflight_release_mib": Var(int, min=0, max=1 << 20),
    "preflight_supported_os": Var(list, item=str, pattern=re.compile(r"^[a-z0-9][a-z0-9._-]*$"),
                                  hint='an OS id-version like "debian-12"'),
    # toolchain
    "cuda_toolkit_version": Var(str, pattern=re.compile(r"^\d+\.\d+$"), hint='like "12.9"'),
    "manage_driver": Var(bool),
    "nvidia_driver_branch": Var(int, min=470, max=999),
    "nvidia_driver_flavour": Var(str, choices=("proprietary", "open")),
    "nvidia_driver_source": Var(str, choices=("nvidia_repo", "distro")),
    "nvidia_driver_version": Var(str, nullable=True, pattern=re.compile(r"latest|\d{3}\.\d+(\.\d+)?"),
                                 hint='"latest" or an exact release like "580.95.05"'),
    "allow_degraded_gpus": Var(bool),
    # GPU health (preflight refuses, smoke records)
    "gpu_fatal_xids": Var(list, item=int, hint="a list of Xid numbers like [48, 64, 79]"),
    "gpu_warn_xids": Var(list, item=int, hint="a list of Xid numbers like [13, 31, 43]"),
    "gpu_retired_pages_warn": Var(int, min=1, max=64),
    "gpu_refuse_pcie_downtrained": Var(bool),
    "gpu_nvlink_errors_warn": Var(int, min=0, max=1_000_000_000),
    # llama.cpp build
    "llama_cpp_repo": Var(str, check=urls.git_url_error,
                          hint="a git URL: https://, git://, ssh://, user@host:path or an absolute path"),
    "llama_cpp_ref": Var(str, check=urls.git_ref_error, hint="a tag, a branch or a 40-hex commit"),
    "llama_cpp_cuda_archs": Var(list, item=int, nullable=True),
    "llama_cpp_cmake_extra": Var(list, item=str, pattern=re.compile(
        r"^-D[A-Za-z_][A-Za-z0-9_]*(:[A-Za-z]+)?=[A-Za-z0-9._,/+:=@%-]*$"),
        hint='a CMake -D flag like "-DGGML_CUDA_F16=ON" (no spaces, quotes or shell characters)'),
    "llama_cpp_targets": Var(list, item=str, pattern=re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$"),
                             hint="a CMake target name like llama-server"),
    "llama_cpp_build_strategy": Var(str, choices=("shared", "per_host")),
    "llama_cpp_build_jobs": Var(int, nullable=True, min=1, max=256),
    "llama_cpp_keep_releases": Var(int, min=0, max=20),
    # model
    "model_url": Var(str, check=_http_gguf, hint="an http(s) URL of a .gguf file"),
    "model_sha256": Var((str, list), nullable=True, pattern=HEX64,
                        hint="64 lowercase hex digits (a list of them for a split GGUF)"),
    "model_allow_unverified": Var(bool),
    "model_dir": Var(str, check=_safe_path_error, hint="an absolute path without spaces"),
    "model_draft_url": Var(str, nullable=True, check=_http_gguf, hint="an http(s) URL of a .gguf file"),
    "model_draft_sha256": Var(str, nullable=True, pattern=HEX64, hint="64 lowercase hex digits"),
    # server
    "server_instances": Var(int, nullable=True, min=1, max=16),
    "server_port_base": _ports(),
    "server_host": Var(str, check=urls.server_host_error, hint="an IP address or a host name"),
    "server_ctx": Var(int, nullable=True, min=256, max=1 << 20),
    "server_parallel": Var(int, nullable=True, min=1, max=64),
    "server_ubatch": Var(int, nullable=True, min=32, max=2048, hint="a token count, 32 to 2048 (llama.cpp's -b is 2048)"),
    "vram_headroom_mib": Var(int, min=0, max=65536),
    "vram_cuda_overhead_mib": Var(int, min=0, max=65536),
    "vram_plan_required": Var(bool),
    "server_ctx_checkpoints": Var(int, nullable=True, min=0, max=1024),
    "server_backend_sampling": Var(bool),
    "server_cache_ram": Var(int, nullable=True, min=-1, max=1 << 20),
    "server_malloc_heap": Var(bool),
    "server_spec_mtp": Var(bool),
    "server_spec_draft_max": Var(int, min=1, max=16),
    "server_spec_ngram": Var(str, nullable=True, choices=NGRAM_TYPES),
    "server_cache_type_k": Var(str, choices=KV_TYPES),
    "server_cache_type_v": Var(str, choices=KV_TYPES),
    "server_flash_attn": Var(str, choices=("on", "off", "auto")),
    "server_gpu_layers": Var((str, int), hint='"all" or a layer count'),
    "server_allow_partial_offload": Var(bool),
    "server_threads": Var(int, min=1, max=256),
    "server_threads_batch": Var(int, nullable=True, min=1, max=256),
    "server_mmap": Var(bool),
    # host memory and CPU (voltafleet/planning/hostmem.py, voltafleet/planning/hostcpu.py)
    "hostmem_process_mib": Var(int, min=0, max=1 << 20),
    "hostmem_slot_mib": Var((int, float), min=0, max=1 << 16),
    "hostmem_program_mib": Var(int, min=0, max=1 << 20),
    "hostmem_kernel_mib": Var(int, min=0, max=1 << 20),
    "hostmem_heap_share": Var((int, float), min=0, max=1),
    "hostmem_cache_heap_share": Var((int, float), min=0, max=1),
    "hostmem_cache_heap_floor_mib": Var(int, min=0, max=1 << 20),
    "hostmem_reserve_mib": Var(int, min=0, max=1 << 24),
    "hostmem_ceiling_margin": Var((int, float), min=0, max=10),
    "hostmem_plan_required": Var(bool),
    "hostcpu_reserve": Var(int, min=0, max=4096),
    "server_api_key_file": Var(str, nullable=True, check=_safe_path_error,
                               hint="a path on the controller to a file holding the key"),
    "server_extra_flags": Var(list, item=str),
    "server_user": Var(str, pattern=re.compile(r"^[a-z_][a-z0-9_-]{0,31}$"),
                       hint="a user name like llama"),
    "server_oom_score_adjust": Var(int, min=1, max=1000, hint="1-1000: the kernel's preference for a server"),
    "server_address": Var(str, nullable=True, check=urls.server_host_error,
                          hint="an IP address or a host name the gateway reaches this host at"),
    "server_tier": Var(str, pattern=teamvars.TIER_NAME, hint=teamvars.TIER_NAME_HINT),
    # gateway (HAProxy, hosts of the `gateway` group)
    "gateway_bind": Var(str, pattern=BIND, hint='an address:port like "0.0.0.0:8000"'),
    "gateway_metrics_bind": Var(str, pattern=BIND, hint='an address:port like "0.0.0.0:8404"'),
    "gateway_stream_timeout_s": Var(int, min=10, max=86400),
    "gateway_check_interval_ms": Var(int, min=100, max=60000),
    "gateway_maxconn": Var(int, min=16, max=1000000),
    "gateway_drain_timeout_s": Var(int, nullable=True, min=0, max=3600),
    "gateway_queue_timeout_s": Var(int, min=1, max=3600),
    "gateway_retry_after_s": Var(int, min=1, max=3600),
    "gateway_keepalive_timeout_s": Var(int, min=1, max=3600),
    "gateway_affinity": Var(bool),
    "gateway_hash_balance_factor": Var(int, min=101, max=1000),
    "server_slots_endpoint": Var(bool),
    "server_allow_unauthenticated": Var(bool),
    "server_model_alias": Var(str, nullable=True, pattern=re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"),
                              hint='a model name like "qwen3.6-27b" (letters, digits, . _ : -)'),
    "server_reasoning_budget": Var(int, nullable=True, min=-1, max=1_000_000),
    "gateway_allow_unauthenticated": Var(bool),
    "gateway_teams": Var(list, item=dict, hint="a list of teams: [{name: ..., key_sha256: ...}]"),
    "gateway_team_max_concurrent": Var(int, min=1, max=1_000_000),
    "gateway_team_requests_per_minute": Var(int, min=1, max=1_000_000),
    "gateway_team_retry_after_s": Var(int, min=1, max=3600),
    "gateway_tier_overflow": Var(str, choices=teamvars.OVERFLOWS),
    # two gateways or more (issue 52): one address between them (keepalived), one set of limits
    "gateway_vip": Var(str, nullable=True, pattern=re.compile(r"^[0-9]{1,3}(\.[0-9]{1,3}){3}$"),
                       hint="an IPv4 address on the gateways' network, e.g. 10.0.0.10"),
    "gateway_vip_prefix": Var(int, min=8, max=32),
    "gateway_vip_interface": Var(str, pattern=re.compile(r"^[A-Za-z0-9_.-]{1,15}$"), hint="a network interface like eth0"),
    "gateway_vrrp_router_id": Var(int, min=1, max=255),
    "gateway_vrrp_preempt_delay_s": Var(int, min=0, max=1000),
    "gateway_address": Var(str, nullable=True, check=urls.server_host_error,
                           hint="the address the other gateways reach this one at"),
    "gateway_peers_port": _ports(),
    "gateway_budget_peer_port": _ports(),
    "gateway_budget_peer_poll_ms": Var(int, min=100, max=60000),
    "rollout_max_minutes": Var(int, min=1, max=7 * 24 * 60),
    # model mirror (nginx on the hosts of the `mirror` group; voltafleet/models/mirror.py)
    "mirror_port": _ports(),
    "mirror_listen": Var(str, check=urls.server_host_error, hint="an IP address (0.0.0.0: every address) or a host name"),
    "mirror_address": Var(str, nullable=True, check=urls.server_host_error,
                          hint="an IP address or a host name the server hosts reach the mirror at"),
    "mirror_cache_dir": Var(str, check=_safe_path_error, hint="an absolute path without spaces, like /var/cache/voltafleet-mirror"),
    "mirror_cache_max_gb": Var(int, min=1, max=1_000_000),
    "mirror_slice_mb": Var(int, min=1, max=1024),
    "mirror_cache_valid_days": Var(int, min=1, max=3650),
    "mirror_extra_paths": Var(list, item=str, pattern=re.compile(r"^/[A-Za-z0-9._~/-]{1,500}$"),
                              hint='paths of model_url\'s origin like ["/org/repo/resolve/<rev>/next.gguf"]'),
    "mirror_lock_timeout_s": Var(int, min=1, max=3600),
    # the tune on the canary (python -m rollout --tune; voltafleet/measure/tune.py)
    "tune_prompt_tokens": Var(int, min=1, max=1 << 20),
    "tune_answer_tokens": Var(int, min=1, max=1 << 20),
    "tune_clients": Var(int, min=1, max=1024),
    "tune_requests": Var(int, min=1, max=100_000),
    "tune_followup_share": Var((int, float), min=0, max=1),
    "tune_repetitions": Var(int, min=1, max=20),
    "tune_max_ttft_p99_ms": Var((int, float), min=1),
    "tune_headroom_mib": Var(int, min=0, max=65536),
    "tune_budget_minutes": Var((int, float), min=1, max=7 * 24 * 60),
    "tune_profile_hours": Var((int, float), min=0, max=31 * 24),
    "tune_try": Var(list, nullable=True, item=str,
                    pattern=re.compile(r"^(slots|context|ubatch|ngram|backend_sampling|host_cache|checkpoints|build)$"),
                    hint="one of slots, context, ubatch, ngram, backend_sampling, host_cache, checkpoints, build"),
    # smoke
    "smoke_enabled": Var(bool),
    "smoke_tokens": Var(int, min=8, max=4096),
    "smoke_parallel": Var(int, nullable=True, min=1, max=64),
    "smoke_health_timeout_s": Var(int, min=5, max=3600),
    "smoke_max_ttft_ms": Var((int, float), min=1),
    "smoke_min_single_tps": Var((int, float), min=0),
    "smoke_min_aggregate_tps": Var((int, float), min=0),
    "smoke_rollback": Var(bool),
    "smoke_probe": Var(bool),
    "smoke_probe_prompt": Var(str, pattern=re.compile(r"^[^\x00]{1,4000}$", re.S), hint="a prompt of 1-4000 characters"),
    "smoke_probe_tokens": Var(int, min=1, max=256),
    "smoke_probe_long": Var(bool),
    "smoke_probe_long_min_tokens": Var(int, min=64, max=8192),
    "smoke_probe_tolerance": Var((int, float), min=0, max=100),
    "smoke_gpu_sample_s": Var((int, float), min=0, max=60),
    "smoke_textfile_dir": Var(str, nullable=True, check=_safe_path_error, hint="an absolute path without spaces"),
    "smoke_report_dir": Var(str, pattern=re.compile(r"^[A-Za-z0-9._/+][A-Za-z0-9._/+-]*$"),
                            hint="a directory on the controller, relative to the repository or absolute"),
    # the timeline of `python -m rollout --plan` (voltafleet.planning.timeline): measured costs
    "plan_run_s": Var((int, float), min=0, max=86400),
    "plan_toolchain_s": Var((int, float), min=0, max=86400),
    "plan_driver_s": Var((int, float), min=0, max=86400),
    "plan_compile_s": Var((int, float), min=0, max=86400),
    "plan_ship_s": Var((int, float), min=0, max=86400),
    "plan_model_mib_s": Var((int, float), min=0.1, max=1_000_000, hint="MiB/s, more than 0"),
    "plan_drain_s": Var((int, float), min=0, max=86400),
    "plan_restart_s": Var((int, float), min=0, max=86400),
    "plan_smoke_s": Var((int, float), min=0, max=86400),
    "plan_probe_s": Var((int, float), min=0, max=86400),
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
                        list: "a list", dict: "a mapping"}[k] for k in kinds)


def _is(value, kind) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        return False
    return isinstance(value, kinds)


def coerce(key: str, value: Any) -> Any:
    """A string where the schema wants no string (`--data port=70000` from another tool, an
    environment): read it the way pyinfra's CLI reads --data values (true/false, an
    integer, JSON). Anything else is returned as it is, for check_value to judge."""
    var = SCHEMA[key]
    kinds = var.kind if isinstance(var.kind, tuple) else (var.kind,)
    if not isinstance(value, str) or str in kinds:
        return value
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return json.loads(value)
    except ValueError:
        return value


def check_value(key: str, value: Any, origin: str | None, host: str | None = None) -> None:
    var = SCHEMA[key]

    def fail(why: str, fix: str) -> None:
        raise ConfigError(why, fix, origin, key, host)

    if value is None:
        if not var.nullable:
            fail("must be set (it is empty)", f"give {_type_name(var.kind)}")
        return
    if isinstance(value, bool) and "on" in var.choices:
        fail(f"is {value!r}: YAML reads a bare on/off as true/false", 'quote it: "on" or "off"')
    if not _is(value, var.kind):
        kinds = var.kind if isinstance(var.kind, tuple) else (var.kind,)
        if origin == CLI_SOURCE and str in kinds and isinstance(value, (int, float, bool)):
            fail(f"is {value!r}: pyinfra --data reads it as {type(value).__name__}, not text",
                 f"""pass it as a JSON string: --data '{key}="..."'""")
        fail(f"is {value!r} ({type(value).__name__})", f"give {_type_name(var.kind)}"
             + (f", {var.hint}" if var.hint else ""))
    if var.choices and value not in var.choices:
        fail(f"is {value!r}", "use one of " + ", ".join(map(str, var.choices)))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if var.min is not None and value < var.min:
            fail(f"is {value}, below the minimum {var.min}", f"set {var.min} or more")
        if var.max is not None and value > var.max:
            fail(f"is {value}, above the maximum {var.max}", f"set {var.max} or less")
    if var.pattern is not None and isinstance(value, str) and not var.pattern.fullmatch(value):
        fail(f"is {value!r}", f"give {var.hint or 'a value matching ' + var.pattern.pattern}")
    if var.check is not None and isinstance(value, str):
        why = var.check(value)
        if why:
            fail(why, f"give {var.hint}")
    if var.item is not None:
        for v in value:
            if not _is(v, var.item):
                fail(f"has the item {v!r}", f"every item must be {_type_name(var.item)}")
    if isinstance(value, list) and var.pattern is not None:
        for v in value:
            if not isinstance(v, str) or not var.pattern.fullmatch(v):
                fail(f"has the item {v!r}", f"every item must be {var.hint}")


def unknown_key_error(key: str, origin: str | None) -> ConfigError:
    close = difflib.get_close_matches(key, SCHEMA, n=1)
    fix = f"did you mean {close[0]!r}?" if close else "remove it (see group_vars/all.yml)"
    return ConfigError("unknown key", fix, origin, key)


def validate(host: str, data: Sourced) -> dict:
    """Check one host's merged data; return the plain values or raise ConfigError."""
    for key, origin in data.source.items():
        if key not in SCHEMA:
            raise unknown_key_error(key, origin)
    for key in SCHEMA:
        if key not in data.values:
            raise ConfigError(f"missing (host {host})", "restore it from the repository's group_vars/all.yml",
                              "group_vars/all.yml", key, host)
    return validate_values(host, data.values, data.source)


def cli_sources(sources: dict | None, cli_keys) -> dict:
    """The source map with the keys pyinfra's `--data` overrides marked as CLI_SOURCE
    (roles: cli_sources(host.data.get(SOURCES_KEY), inventory.get_override_data()))."""
    return {**(sources or {}), **{k: CLI_SOURCE for k in cli_keys or () if k in SCHEMA}}


def mirror_error(v: dict) -> tuple[str, str, str] | None:
    """(key, what, fix) when the mirror's variables cannot work together, else None."""
    for key in ("gateway_bind", "gateway_metrics_bind"):
        if v[key].rsplit(":", 1)[1] == str(v["mirror_port"]):
            return ("mirror_port", f"is {v['mirror_port']}, the port of {key} ({v[key]}): a host of both the "
                    "`mirror` and the `gateway` group could not run both",
                    f"set mirror_port to a free port, e.g. {v['mirror_port'] + 1 if v['mirror_port'] < 65535 else 8880}")
    path = v["mirror_cache_dir"].rstrip("/")
    if path.count("/") < 2:
        return ("mirror_cache_dir", f"is {v['mirror_cache_dir']!r}: the mirror role makes it nginx's own "
                "(owner www-data, mode 700), a top-level directory must not be",
                "give a directory of its own, e.g. /var/cache/voltafleet-mirror")
    return None


def validate_values(host_name: str, values: dict | Settings, sources: dict | None = None) -> dict:
    """Check a plain dict of voltafleet variables, whatever its source (group_vars, the
    inventory, pyinfra --data): every SCHEMA key, with the same checks and messages as
    the inventory loader. Strings where a number or a bool is wanted are read as pyinfra
    reads --data. Keys outside SCHEMA are ignored (pyinfra's own connection data).
    Returns the checked values (SCHEMA keys only); raises ConfigError naming the host,
    the file (sources: {key: file}) and the key. `settings_of` gives them typed."""
    src = dict(sources or {})
    if isinstance(values, Settings):
        values = values.flat()
    v = {key: coerce(key, values.get(key)) for key in SCHEMA}
    for key in SCHEMA:
        check_value(key, v[key], src.get(key), host_name)

    def fail(key: str, why: str, fix: str) -> None:
        raise ConfigError(why, fix, src.get(key), key, host_name)

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
    for key in ("gpu_fatal_xids", "gpu_warn_xids"):
        bad = [x for x in v[key] if not 1 <= x <= 255]
        if bad:
            fail(key, f"has {bad[0]}, not an Xid (1-255)", "list Xid numbers from NVIDIA's Xid catalog, e.g. [48, 64, 79]")
    if not v["server_api_key_file"] and not v["server_allow_unauthenticated"] \
            and not urls.is_loopback(v["server_host"]):
        fail("server_host", f"is {v['server_host']} without an API key: every llama-server would answer anyone "
             "who reaches the port, not only the gateway",
             "set server_api_key_file (a 0600 file holding the key), or bind an address only the gateway reaches "
             "and set server_allow_unauthenticated: true to say so")
    gw_host = v["gateway_bind"].rsplit(":", 1)[0].strip("[]")
    team_problems = teamvars.team_problems(v["gateway_teams"], src.get("gateway_teams"))
    if team_problems:
        raise ConfigError(team_problems, host=host_name)
    if not v["server_api_key_file"] and not v["gateway_teams"] and not v["gateway_allow_unauthenticated"] \
            and not urls.is_loopback(gw_host):
        fail("gateway_bind", f"is {v['gateway_bind']}, but neither the gateway nor the servers check a key "
             "(gateway_teams and server_api_key_file are empty): the fleet's API would answer anyone who reaches it",
             "give each team a key (gateway_teams), or set server_api_key_file (a 0600 file holding the key: clients "
             "send it as a Bearer token), or bind the "
             'gateway to loopback (gateway_bind: "127.0.0.1:8000"), or set gateway_allow_unauthenticated: true '
             "for a network you trust")
    layers = v["server_gpu_layers"]
    if isinstance(layers, str) and layers != "all":
        fail("server_gpu_layers", f"is {layers!r}", 'use "all" or a layer count')
    if isinstance(layers, int) and layers < 0:
        fail("server_gpu_layers", f"is {layers}", 'use "all" or a layer count of 0 or more')
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
    if v["server_tier"] != teamvars.TIER_DEFAULT and v["server_parallel"] is None:
        fail("server_tier", f"is {v['server_tier']} but server_parallel is empty: the gateway admits a tier's requests "
             "by its servers' slots (maxconn) and overflows them when none is free, so it must know them",
             "set server_parallel in the same group (1 or 2 for a latency tier)")
    mirror_problem = mirror_error(v)
    if mirror_problem:
        fail(*mirror_problem)
    problems = [Problem(what, fix, src.get("server_extra_flags"), "server_extra_flags")
                for what, fix in flags.extra_flag_errors(v["server_extra_flags"], v["llama_cpp_ref"])]
    problems += checks.slot_ctx_problems(v["server_ctx"], v["server_parallel"], src)
    if v["server_instances"] is not None:
        problems += checks.port_problems(v["server_port_base"], v["server_instances"], sources=src)
    else:
        problems += checks.port_problems(v["server_port_base"], 1, sources=src)
    problems += checks.api_key_file_problems(v["server_api_key_file"], src)
    if problems:
        raise ConfigError(problems, host=host_name)
    try:
        checks.model_parts(v["model_url"], v["model_sha256"])  # the same rule the model role follows
    except ValueError as e:
        fail("model_sha256", str(e), "give one sha256 per file of the model")
    return v


def settings_of(host_name: str, values: dict | Settings, sources: dict | None = None) -> Settings:
    """validate_values, typed: what every stage after the inputs reads."""
    return Settings.of(validate_values(host_name, values, sources))
