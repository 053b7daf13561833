"""The settings, typed: one frozen dataclass per section of group_vars/all.yml, built once from the
values `voltafleet.inputs.config.validate_values` checked, and passed to everything after it.

A field is its group_vars key less the section's prefix (`server_ctx` is `settings.server.ctx`,
`llama_cpp_ref` is `settings.build.ref`, `plan_compile_s` is `settings.timeline.compile_s`); a key
without the prefix keeps its name (`settings.server.vram_headroom_mib`). `KEYS` maps every key to its
(section, field); tests/unit/test_settings.py holds it to config.SCHEMA, key for key.

    >>> s = settings_of(validate_values("gpu-01", host_data))
    >>> s.server.parallel, s.build.ref, s.gateway.bind
    >>> s.replace(server_parallel=4).server.parallel        # a changed copy, by the group_vars key
    4

Only the inputs room reads the values by key; everything after it reads fields.
"""
from __future__ import annotations

import dataclasses
import keyword
from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class PreflightSettings:
    """group_vars/all.yml's "preflight" section (a field is its key less `voltafleet_`, `preflight_`)."""
    backend: str  # voltafleet_backend
    root: str  # voltafleet_root
    build_disk_gb: int | float  # preflight_build_disk_gb
    release_mib: int  # preflight_release_mib
    supported_os: list[str]  # preflight_supported_os



@dataclass(frozen=True)
class ToolchainSettings:
    """group_vars/all.yml's "toolchain" section (a field is its key less nothing)."""
    cuda_toolkit_version: str  # cuda_toolkit_version
    manage_driver: bool  # manage_driver
    nvidia_driver_branch: int  # nvidia_driver_branch
    nvidia_driver_flavour: str  # nvidia_driver_flavour
    nvidia_driver_source: str  # nvidia_driver_source
    nvidia_driver_version: str | None  # nvidia_driver_version
    allow_degraded_gpus: bool  # allow_degraded_gpus



@dataclass(frozen=True)
class GpuHealthSettings:
    """group_vars/all.yml's "GPU health" section (a field is its key less `gpu_`)."""
    fatal_xids: list[int]  # gpu_fatal_xids
    warn_xids: list[int]  # gpu_warn_xids
    retired_pages_warn: int  # gpu_retired_pages_warn
    refuse_pcie_downtrained: bool  # gpu_refuse_pcie_downtrained
    nvlink_errors_warn: int  # gpu_nvlink_errors_warn



@dataclass(frozen=True)
class BuildSettings:
    """group_vars/all.yml's "llama.cpp build" section (a field is its key less `llama_cpp_build_`, `llama_cpp_`)."""
    repo: str  # llama_cpp_repo
    ref: str  # llama_cpp_ref
    cuda_archs: list[int] | None  # llama_cpp_cuda_archs
    cmake_extra: list[str]  # llama_cpp_cmake_extra
    targets: list[str]  # llama_cpp_targets
    strategy: str  # llama_cpp_build_strategy
    jobs: int | None  # llama_cpp_build_jobs
    keep_releases: int  # llama_cpp_keep_releases



@dataclass(frozen=True)
class ModelSettings:
    """group_vars/all.yml's "model" section (a field is its key less `model_`)."""
    url: str  # model_url
    sha256: str | list | None  # model_sha256
    allow_unverified: bool  # model_allow_unverified
    dir: str  # model_dir
    draft_url: str | None  # model_draft_url
    draft_sha256: str | None  # model_draft_sha256



@dataclass(frozen=True)
class ServerSettings:
    """group_vars/all.yml's "server" section (a field is its key less `server_`)."""
    instances: int | None  # server_instances
    port_base: int  # server_port_base
    host: str  # server_host
    allow_unauthenticated: bool  # server_allow_unauthenticated
    model_alias: str | None  # server_model_alias
    slots_endpoint: bool  # server_slots_endpoint
    ctx: int | None  # server_ctx
    parallel: int | None  # server_parallel
    ubatch: int | None  # server_ubatch
    vram_headroom_mib: int  # vram_headroom_mib
    vram_cuda_overhead_mib: int  # vram_cuda_overhead_mib
    vram_plan_required: bool  # vram_plan_required
    cache_type_k: str  # server_cache_type_k
    cache_type_v: str  # server_cache_type_v
    flash_attn: str  # server_flash_attn
    ctx_checkpoints: int | None  # server_ctx_checkpoints
    backend_sampling: bool  # server_backend_sampling
    cache_ram: int | None  # server_cache_ram
    malloc_heap: bool  # server_malloc_heap
    spec_mtp: bool  # server_spec_mtp
    spec_draft_max: int  # server_spec_draft_max
    spec_ngram: str | None  # server_spec_ngram
    gpu_layers: str | int  # server_gpu_layers
    allow_partial_offload: bool  # server_allow_partial_offload
    threads: int  # server_threads
    threads_batch: int | None  # server_threads_batch
    mmap: bool  # server_mmap
    hostmem_process_mib: int  # hostmem_process_mib
    hostmem_slot_mib: int | float  # hostmem_slot_mib
    hostmem_program_mib: int  # hostmem_program_mib
    hostmem_kernel_mib: int  # hostmem_kernel_mib
    hostmem_heap_share: int | float  # hostmem_heap_share
    hostmem_cache_heap_share: int | float  # hostmem_cache_heap_share
    hostmem_cache_heap_floor_mib: int  # hostmem_cache_heap_floor_mib
    hostmem_reserve_mib: int  # hostmem_reserve_mib
    hostmem_ceiling_margin: int | float  # hostmem_ceiling_margin
    hostmem_plan_required: bool  # hostmem_plan_required
    hostcpu_reserve: int  # hostcpu_reserve
    api_key_file: str | None  # server_api_key_file
    reasoning_budget: int | None  # server_reasoning_budget
    extra_flags: list[str]  # server_extra_flags
    user: str  # server_user
    oom_score_adjust: int  # server_oom_score_adjust
    address: str | None  # server_address
    tier: str  # server_tier



@dataclass(frozen=True)
class GatewaySettings:
    """group_vars/all.yml's "gateway" section (a field is its key less `gateway_`)."""
    bind: str  # gateway_bind
    allow_unauthenticated: bool  # gateway_allow_unauthenticated
    rollout_max_minutes: int  # rollout_max_minutes
    metrics_bind: str  # gateway_metrics_bind
    stream_timeout_s: int  # gateway_stream_timeout_s
    check_interval_ms: int  # gateway_check_interval_ms
    maxconn: int  # gateway_maxconn
    drain_timeout_s: int | None  # gateway_drain_timeout_s
    queue_timeout_s: int  # gateway_queue_timeout_s
    retry_after_s: int  # gateway_retry_after_s
    keepalive_timeout_s: int  # gateway_keepalive_timeout_s
    affinity: bool  # gateway_affinity
    hash_balance_factor: int  # gateway_hash_balance_factor
    teams: list[dict]  # gateway_teams
    team_max_concurrent: int  # gateway_team_max_concurrent
    team_requests_per_minute: int  # gateway_team_requests_per_minute
    team_retry_after_s: int  # gateway_team_retry_after_s
    vip: str | None  # gateway_vip
    vip_prefix: int  # gateway_vip_prefix
    vip_interface: str  # gateway_vip_interface
    vrrp_router_id: int  # gateway_vrrp_router_id
    vrrp_preempt_delay_s: int  # gateway_vrrp_preempt_delay_s
    address: str | None  # gateway_address
    peers_port: int  # gateway_peers_port
    budget_peer_port: int  # gateway_budget_peer_port
    budget_peer_poll_ms: int  # gateway_budget_peer_poll_ms
    tier_overflow: str  # gateway_tier_overflow



@dataclass(frozen=True)
class MirrorSettings:
    """group_vars/all.yml's "model mirror" section (a field is its key less `mirror_`)."""
    port: int  # mirror_port
    listen: str  # mirror_listen
    address: str | None  # mirror_address
    cache_dir: str  # mirror_cache_dir
    cache_max_gb: int  # mirror_cache_max_gb
    slice_mb: int  # mirror_slice_mb
    cache_valid_days: int  # mirror_cache_valid_days
    lock_timeout_s: int  # mirror_lock_timeout_s
    extra_paths: list[str]  # mirror_extra_paths



@dataclass(frozen=True)
class TuneSettings:
    """group_vars/all.yml's "the tune on the canary" section (a field is its key less `tune_`)."""
    prompt_tokens: int  # tune_prompt_tokens
    answer_tokens: int  # tune_answer_tokens
    clients: int  # tune_clients
    requests: int  # tune_requests
    followup_share: int | float  # tune_followup_share
    repetitions: int  # tune_repetitions
    max_ttft_p99_ms: int | float  # tune_max_ttft_p99_ms
    headroom_mib: int  # tune_headroom_mib
    budget_minutes: int | float  # tune_budget_minutes
    profile_hours: int | float  # tune_profile_hours
    try_: list[str] | None  # tune_try



@dataclass(frozen=True)
class SmokeSettings:
    """group_vars/all.yml's "smoke test" section (a field is its key less `smoke_`)."""
    enabled: bool  # smoke_enabled
    tokens: int  # smoke_tokens
    parallel: int | None  # smoke_parallel
    health_timeout_s: int  # smoke_health_timeout_s
    max_ttft_ms: int | float  # smoke_max_ttft_ms
    min_single_tps: int | float  # smoke_min_single_tps
    min_aggregate_tps: int | float  # smoke_min_aggregate_tps
    rollback: bool  # smoke_rollback
    probe: bool  # smoke_probe
    probe_prompt: str  # smoke_probe_prompt
    probe_tokens: int  # smoke_probe_tokens
    probe_long: bool  # smoke_probe_long
    probe_long_min_tokens: int  # smoke_probe_long_min_tokens
    probe_tolerance: int | float  # smoke_probe_tolerance
    gpu_sample_s: int | float  # smoke_gpu_sample_s
    textfile_dir: str | None  # smoke_textfile_dir
    report_dir: str  # smoke_report_dir



@dataclass(frozen=True)
class TimelineSettings:
    """group_vars/all.yml's "plan" section (a field is its key less `plan_`)."""
    run_s: int | float  # plan_run_s
    toolchain_s: int | float  # plan_toolchain_s
    driver_s: int | float  # plan_driver_s
    compile_s: int | float  # plan_compile_s
    ship_s: int | float  # plan_ship_s
    model_mib_s: int | float  # plan_model_mib_s
    drain_s: int | float  # plan_drain_s
    restart_s: int | float  # plan_restart_s
    smoke_s: int | float  # plan_smoke_s
    probe_s: int | float  # plan_probe_s


SECTIONS = (
    ('preflight', PreflightSettings, ('voltafleet_', 'preflight_')),
    ('toolchain', ToolchainSettings, ()),
    ('gpu_health', GpuHealthSettings, ('gpu_',)),
    ('build', BuildSettings, ('llama_cpp_build_', 'llama_cpp_')),
    ('model', ModelSettings, ('model_',)),
    ('server', ServerSettings, ('server_',)),
    ('gateway', GatewaySettings, ('gateway_',)),
    ('mirror', MirrorSettings, ('mirror_',)),
    ('tune', TuneSettings, ('tune_',)),
    ('smoke', SmokeSettings, ('smoke_',)),
    ('timeline', TimelineSettings, ('plan_',)),
)


def _field(key: str, prefixes: tuple[str, ...]) -> str:
    for p in prefixes:
        if key.startswith(p):
            name = key[len(p):]
            return name + "_" if keyword.iskeyword(name) else name
    return key


def _keys() -> dict[str, tuple[str, str]]:
    out = {}
    for attr, cls, prefixes in SECTIONS:
        comments = {f.name: f for f in dataclasses.fields(cls)}
        for key in _SECTION_KEYS[attr]:
            name = _field(key, prefixes)
            assert name in comments, (key, name)
            out[key] = (attr, name)
    return out


@dataclass(frozen=True)
class Settings:
    """One host's settings, every section typed (see the module's docstring)."""

    preflight: PreflightSettings
    toolchain: ToolchainSettings
    gpu_health: GpuHealthSettings
    build: BuildSettings
    model: ModelSettings
    server: ServerSettings
    gateway: GatewaySettings
    mirror: MirrorSettings
    tune: TuneSettings
    smoke: SmokeSettings
    timeline: TimelineSettings

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> "Settings":
        """The settings of a flat mapping of every group_vars key (what validate_values returns)."""
        missing = [k for k in KEYS if k not in values]
        if missing:
            raise KeyError(f"settings without {', '.join(missing[:5])}: build them from validate_values")
        parts: dict[str, dict[str, Any]] = {attr: {} for attr, _, _ in SECTIONS}
        for key, (attr, name) in KEYS.items():
            parts[attr][name] = values[key]
        return cls(**{attr: c(**parts[attr]) for attr, c, _ in SECTIONS})

    def flat(self) -> dict[str, Any]:
        """{group_vars key: value}: the spelling of records, messages and validate_values."""
        return {key: getattr(getattr(self, attr), name) for key, (attr, name) in KEYS.items()}

    def replace(self, **changes: Any) -> "Settings":
        """A copy with some values changed, named by their group_vars keys (not checked again)."""
        unknown = [k for k in changes if k not in KEYS]
        if unknown:
            raise KeyError(f"not a setting: {', '.join(unknown)}")
        return Settings.of({**self.flat(), **changes})


# every group_vars key of each section, in all.yml's order
_SECTION_KEYS: dict[str, tuple[str, ...]] = {
    'preflight': (
        'voltafleet_backend', 'voltafleet_root', 'preflight_build_disk_gb', 'preflight_release_mib',
        'preflight_supported_os',
    ),
    'toolchain': (
        'cuda_toolkit_version', 'manage_driver', 'nvidia_driver_branch', 'nvidia_driver_flavour',
        'nvidia_driver_source', 'nvidia_driver_version', 'allow_degraded_gpus',
    ),
    'gpu_health': (
        'gpu_fatal_xids', 'gpu_warn_xids', 'gpu_retired_pages_warn', 'gpu_refuse_pcie_downtrained',
        'gpu_nvlink_errors_warn',
    ),
    'build': (
        'llama_cpp_repo', 'llama_cpp_ref', 'llama_cpp_cuda_archs', 'llama_cpp_cmake_extra', 'llama_cpp_targets',
        'llama_cpp_build_strategy', 'llama_cpp_build_jobs', 'llama_cpp_keep_releases',
    ),
    'model': (
        'model_url', 'model_sha256', 'model_allow_unverified', 'model_dir', 'model_draft_url', 'model_draft_sha256',
    ),
    'server': (
        'server_instances', 'server_port_base', 'server_host', 'server_allow_unauthenticated', 'server_model_alias',
        'server_slots_endpoint', 'server_ctx', 'server_parallel', 'server_ubatch', 'vram_headroom_mib',
        'vram_cuda_overhead_mib', 'vram_plan_required', 'server_cache_type_k', 'server_cache_type_v',
        'server_flash_attn', 'server_ctx_checkpoints', 'server_backend_sampling', 'server_cache_ram',
        'server_malloc_heap', 'server_spec_mtp', 'server_spec_draft_max', 'server_spec_ngram', 'server_gpu_layers',
        'server_allow_partial_offload', 'server_threads', 'server_threads_batch', 'server_mmap',
        'hostmem_process_mib', 'hostmem_slot_mib', 'hostmem_program_mib', 'hostmem_kernel_mib', 'hostmem_heap_share',
        'hostmem_cache_heap_share', 'hostmem_cache_heap_floor_mib', 'hostmem_reserve_mib', 'hostmem_ceiling_margin',
        'hostmem_plan_required', 'hostcpu_reserve',
        'server_api_key_file', 'server_reasoning_budget', 'server_extra_flags', 'server_user',
        'server_oom_score_adjust', 'server_address', 'server_tier',
    ),
    'gateway': (
        'gateway_bind', 'gateway_allow_unauthenticated', 'rollout_max_minutes', 'gateway_metrics_bind',
        'gateway_stream_timeout_s', 'gateway_check_interval_ms', 'gateway_maxconn', 'gateway_drain_timeout_s',
        'gateway_queue_timeout_s', 'gateway_retry_after_s', 'gateway_keepalive_timeout_s', 'gateway_affinity',
        'gateway_hash_balance_factor', 'gateway_teams', 'gateway_team_max_concurrent',
        'gateway_team_requests_per_minute', 'gateway_team_retry_after_s', 'gateway_vip', 'gateway_vip_prefix',
        'gateway_vip_interface', 'gateway_vrrp_router_id', 'gateway_vrrp_preempt_delay_s', 'gateway_address',
        'gateway_peers_port', 'gateway_budget_peer_port', 'gateway_budget_peer_poll_ms', 'gateway_tier_overflow',
    ),
    'mirror': (
        'mirror_port', 'mirror_listen', 'mirror_address', 'mirror_cache_dir', 'mirror_cache_max_gb',
        'mirror_slice_mb', 'mirror_cache_valid_days', 'mirror_lock_timeout_s', 'mirror_extra_paths',
    ),
    'tune': (
        'tune_prompt_tokens', 'tune_answer_tokens', 'tune_clients', 'tune_requests', 'tune_followup_share',
        'tune_repetitions', 'tune_max_ttft_p99_ms', 'tune_headroom_mib', 'tune_budget_minutes', 'tune_profile_hours',
        'tune_try',
    ),
    'smoke': (
        'smoke_enabled', 'smoke_tokens', 'smoke_parallel', 'smoke_health_timeout_s', 'smoke_max_ttft_ms',
        'smoke_min_single_tps', 'smoke_min_aggregate_tps', 'smoke_rollback', 'smoke_probe', 'smoke_probe_prompt',
        'smoke_probe_tokens', 'smoke_probe_long', 'smoke_probe_long_min_tokens', 'smoke_probe_tolerance',
        'smoke_gpu_sample_s', 'smoke_textfile_dir', 'smoke_report_dir',
    ),
    'timeline': (
        'plan_run_s', 'plan_toolchain_s', 'plan_driver_s', 'plan_compile_s', 'plan_ship_s', 'plan_model_mib_s',
        'plan_drain_s', 'plan_restart_s', 'plan_smoke_s', 'plan_probe_s',
    ),
}
KEYS: dict[str, tuple[str, str]] = _keys()   # group_vars key -> (section, field)
