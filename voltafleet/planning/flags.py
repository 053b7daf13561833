"""llama-server flags: rendered from the plan, checked against the binary's own --help.

    >>> args = server_args(cfg, "/var/lib/voltafleet/models/m.gguf", port=8080, api_key_file=None)
    >>> check_against_help(args, help_text)   # [] when every flag is known and current
"""
from __future__ import annotations

import re
import shlex
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType

from voltafleet.inputs.settings import Settings
from voltafleet.ground.errors import Problem

# Flags the seed (and older guides) use that the pinned llama.cpp no longer has at all.
REPLACED = {
    "--draft-max": "--spec-draft-n-max",
    "--draft": "--spec-draft-n-max",
    "--draft-min": "--spec-draft-n-min",
    "--draft-n-min": "--spec-draft-n-min",
    "--model-draft": "--spec-draft-model (alias -md)",
    "--gpu-layers-draft": "--spec-draft-ngl",
}
_DESC_COL = 40


def server_args(cfg: Settings, model_path: str, port: int, api_key_file: str | None,
                draft_path: str | None = None, placement: list[str] | None = None,
                slots: int | None = None, ctx: int | None = None) -> list[str]:
    """argv for one llama-server instance. Options whose defaults llama.cpp now picks for
    you (-ngl auto, --fit on, -np auto, -fa auto) are always explicit, so behaviour does
    not drift with the pinned version. `placement`: the instance's CPU affinity flags
    (voltafleet.planning.hostcpu.CpuPlan.args: -C/-Cb of its GPU's NUMA node), none when not placed.
    `slots` and `ctx`: -np and -c as the host plan decided them (by default the settings')."""
    cuda = cfg.preflight.backend == "cuda"
    args = [
        "-m", model_path,
        "-ngl", str(cfg.server.gpu_layers) if cuda else "0",
        "--fit", "off",
        "-c", str(ctx or cfg.server.ctx),
        "-np", str(slots or cfg.server.parallel),
        "-ctk", cfg.server.cache_type_k,
        "-ctv", cfg.server.cache_type_v,
        "-fa", cfg.server.flash_attn,
        *(["-ub", str(cfg.server.ubatch)] if cfg.server.ubatch else []),  # prompt step: the VRAM plan counts it
        "-t", str(cfg.server.threads),
        *(["-tb", str(cfg.server.threads_batch)] if cfg.server.threads_batch else []),
        *(placement or []),
        # llama.cpp's default maps the file (its pages reclaimable); "none" reads it into anonymous memory
        *([] if cfg.server.mmap else ["-lm", "none"]),
        "--host", cfg.server.host,
        "--port", str(port),
        *(["--alias", cfg.server.model_alias] if cfg.server.model_alias else []),  # /v1/models's id
        # thinking tokens before the answer is forced to start (-1: unbounded); a request's own
        # thinking_budget_tokens overrides it, chat_template_kwargs enable_thinking=false skips it
        *(["--reasoning-budget", str(cfg.server.reasoning_budget)]
          if cfg.server.reasoning_budget is not None else []),
        "--metrics",
        *([] if cfg.server.slots_endpoint else ["--no-slots"]),  # /slots shows users' prompts
        # llama.cpp logs its library's info lines (`offloaded N/M layers to GPU`, buffer
        # sizes) at trace level: 4 keeps them in the journal for the offload check.
        "--log-verbosity", "4",
    ]
    if cfg.server.ctx_checkpoints is not None:
        # hybrid/recurrent models reuse a cached prefix only through these checkpoints
        args += ["--ctx-checkpoints", str(cfg.server.ctx_checkpoints)]
    if cfg.server.backend_sampling:
        args += ["--backend-sampling"]
    if cfg.server.cache_ram is not None:
        # the host-RAM prompt cache: 0 turns it off (and the save of idle slots before a request)
        args += ["--cache-ram", str(cfg.server.cache_ram)]
    spec = (["draft-mtp"] if cfg.server.spec_mtp else []) + (
        [cfg.server.spec_ngram] if cfg.server.spec_ngram else [])
    if spec:
        # draft-mtp: the model's own MTP head (the preflight refuses a file without nextn layers);
        # ngram-*: drafts from the context's own n-grams, verified in the main batch (no VRAM)
        args += ["--spec-type", ",".join(spec)]
    if cfg.server.spec_mtp or draft_path:
        args += ["--spec-draft-n-max", str(cfg.server.spec_draft_max)]
    if draft_path:
        args += ["-md", draft_path, "-ngld", str(cfg.server.gpu_layers) if cuda else "0"]
    if api_key_file:
        args += ["--api-key-file", api_key_file]
    for extra in cfg.server.extra_flags:
        args += shlex.split(extra)
    return args


def _help_entries(help_text: str):
    """(names on one --help line, its description) for each flag line of llama-server --help."""
    lines = help_text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("-"):
            continue
        # llama.cpp prints names in the first 40 columns, the description after them
        # (or from the next line on when the names are longer).
        fits = len(line) > _DESC_COL and line[_DESC_COL - 2:_DESC_COL] == "  "
        head, desc = (line[:_DESC_COL], line[_DESC_COL:]) if fits else (line, "")
        names = [n for n in re.findall(r"(?:^|[\s,])(-{1,2}[A-Za-z0-9][\w-]*)", head)]
        for cont in lines[i + 1:]:
            if cont.startswith("-") or not cont.startswith(" "):
                break
            desc += " " + cont.strip()
        yield names, desc


@lru_cache(maxsize=16)
def parse_help(help_text: str) -> tuple[frozenset[str], MappingProxyType]:
    """(every flag name the binary accepts, {removed flag: the binary's own advice}), read-only:
    parsed once per --help text (every host and every check of a run shares it)."""
    known: set[str] = set()
    removed: dict[str, str] = {}
    for names, desc in _help_entries(help_text):
        known.update(names)
        if "has been removed" in desc:
            for n in names:
                removed[n] = re.sub(r"\s*\(env: [^)]*\)", "", " ".join(desc.split()))
    return frozenset(known), MappingProxyType(removed)


def flag_names(args: list[str]) -> list[str]:
    out = []
    for a in args:
        if a.startswith("-") and not re.match(r"^-\d", a):
            out.append(a.split("=", 1)[0])
    return out


def check_against_help(args: list[str], help_text: str) -> list[str]:
    """Every problem with `args` for this binary, each naming the flag and its fix."""
    known, removed = parse_help(help_text)
    errors = []
    for name in flag_names(args):
        if name in removed:
            errors.append(f"{name}: the pinned llama-server says: {removed[name]}")
        elif name not in known:
            hint = REPLACED.get(name)
            errors.append(f"{name}: not a flag of the pinned llama-server"
                          + (f"; use {hint} instead" if hint else "; see llama-server --help"))
    return errors


# server_malloc_heap: glibc's malloc serves every chunk from its heap (no mmap'd chunk) and never trims it, so a
# freed 149.6 MiB context checkpoint's pages stay resident and the next checkpoint reuses them instead of faulting
# in and zeroing fresh ones (a copy 27.7 ms against 78.3, H200, bench/records/proof51/session4). The resident peak
# is the live peak's, which the host-memory plan bounds (voltafleet/planning/hostmem.py).
MALLOC_HEAP = {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"}


def env_vars(malloc_heap: bool) -> dict:
    """The variables a server's env file sets besides its GPU and its argv (the kernel test starts its server so)."""
    return dict(MALLOC_HEAP) if malloc_heap else {}


def env_file(instance: int, args: list[str], cuda: bool, malloc_heap: bool = False) -> str:
    """The per-instance environment file read by llama-server@.service; `malloc_heap` adds MALLOC_HEAP's line.

        >>> env_file(0, ["-np", "16"], True, malloc_heap=True).splitlines()[2]
        'GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736'
    """
    for a in args:
        if any(c.isspace() for c in a) or '"' in a or "\\" in a:
            raise ValueError(f"llama-server argument {a!r} has whitespace or quotes; "
                             "systemd splits $LLAMA_SERVER_ARGS on whitespace")
    lines = ["# written by voltafleet: one llama-server instance"]
    lines.append(f"CUDA_VISIBLE_DEVICES={instance}" if cuda else "CUDA_VISIBLE_DEVICES=")
    lines += [f"{k}={v}" for k, v in env_vars(malloc_heap).items()]
    lines.append("LLAMA_SERVER_ARGS=" + " ".join(args))
    return "\n".join(lines) + "\n"


# Flags voltafleet sets itself (server_args), and flags that would replace what it set,
# with the variable that controls each (None: fixed by voltafleet, with the reason).
# Every alias the binary's --help prints on the same line is protected too.
MANAGED: dict[str, tuple[str | None, str]] = {
    "-m": ("model_url", "the model is fetched from model_url into model_dir"),
    "-mu": ("model_url", "the model is fetched from model_url, verified and served from disk"),
    "-hf": ("model_url", "the model is fetched from model_url, verified and served from disk"),
    "-dr": ("model_url", "the model is fetched from model_url, verified and served from disk"),
    "-ngl": ("server_gpu_layers", "the partial-offload guard and the VRAM plan use it"),
    "-fit": (None, "it is off: the VRAM plan sets -c and -np (server_ctx, server_parallel)"),
    "-c": ("server_ctx", "the VRAM plan checks it"),
    "-np": ("server_parallel", "the VRAM plan checks it"),
    "-ub": ("server_ubatch", "the VRAM plan counts its compute buffer and cuBLAS op"),
    "-ctk": ("server_cache_type_k", "the VRAM plan and the build use it"),
    "-ctv": ("server_cache_type_v", "the VRAM plan and the build use it"),
    "-fa": ("server_flash_attn", "a quantized V cache needs it"),
    "-t": ("server_threads", ""),
    "-tb": ("server_threads_batch", "the CPU plan counts each instance's threads"),
    "-C": (None, "each instance runs on its GPU's NUMA node (the CPU plan, voltafleet/planning/hostcpu.py)"),
    "-Cb": (None, "each instance runs on its GPU's NUMA node (the CPU plan, voltafleet/planning/hostcpu.py)"),
    "-Cr": (None, "the CPU plan sets each instance's CPUs with -C (voltafleet/planning/hostcpu.py)"),
    "-Crb": (None, "the CPU plan sets each instance's CPUs with -Cb (voltafleet/planning/hostcpu.py)"),
    "-lm": ("server_mmap", "the host memory plan counts the model's pages by it"),
    "--host": ("server_host", "the health check and the smoke test use it"),
    "--port": ("server_port_base", "each instance has its own port"),
    "--alias": ("server_model_alias", "every instance answers to the same model name"),
    "--reasoning-budget": ("server_reasoning_budget", "the fleet's default thinking budget"),
    "--metrics": (None, "the smoke test reads /metrics"),
    "-lv": (None, "the offload check reads llama.cpp's log at verbosity 4"),
    "-dev": (None, "each instance gets one GPU through CUDA_VISIBLE_DEVICES"),
    "-md": ("model_draft_url", "the draft model is fetched and verified like the model"),
    "-ngld": ("server_gpu_layers", "the draft model follows the model's offload"),
    "-ctxcp": ("server_ctx_checkpoints", "prompt reuse on the hybrid model depends on it"),
    "-bs": ("server_backend_sampling", ""),
    "-cram": ("server_cache_ram", "the group decides it from TTFT (bench/RESULTS.md)"),
    "--spec-type": ("server_spec_mtp or server_spec_ngram",
                    "the preflight checks the file's MTP head and the VRAM plan counts it"),
    "--spec-draft-n-max": ("server_spec_draft_max", "the VRAM plan counts a recurrent state a slot per draft token"),
    "--api-key-file": ("server_api_key_file", "the key file is installed 0600 for the service user"),
    "--api-key": ("server_api_key_file", "a key on the command line shows in `ps`"),
    "--slots": ("server_slots_endpoint", "/slots shows users' prompts: off unless asked for"),
    "--props": (None, "POST /props changes a serving instance's global properties: kept off"),
}
# Characters that have no business in a llama-server argument: a shell, systemd's
# EnvironmentFile or the word splitting of $LLAMA_SERVER_ARGS would read them.
_BAD_ARG_CHARS = set("`$;&|<>'\"\\!#")
_DATA = Path(__file__).resolve().parents[1] / "data"


@lru_cache(maxsize=16)
def managed_names(help_text: str) -> MappingProxyType:
    """{every name of a managed flag, aliases from --help included: its MANAGED key}, read-only,
    once per --help text."""
    out = {name: name for name in MANAGED}
    for names, _ in _help_entries(help_text):
        hit = next((n for n in names if n in MANAGED), None)
        if hit:
            out.update({n: hit for n in names})
    return MappingProxyType(out)


@lru_cache(maxsize=64)
def pinned_help(ref: str) -> str | None:
    """The --help text of llama-server at commit `ref` or release tag `ref` (bNNNN), when voltafleet ships it
    (voltafleet/data/llama-server-help-<first 12 hex or the tag>.txt: the tag's from its pin gate's record,
    bench/records/pin-gate/<tag>); None for a branch, another tag or another commit (then only the build-time
    check knows the flags)."""
    if not isinstance(ref, str):
        return None
    if re.fullmatch(r"[0-9a-f]{12,40}", ref):
        name = ref[:12]
    elif re.fullmatch(r"b[0-9]{4,6}", ref):
        name = ref
    else:
        return None
    path = _DATA / f"llama-server-help-{name}.txt"
    return path.read_text() if path.exists() else None


def _release(path) -> tuple:
    """A shipped --help's order: release tags by number, after the commits' (whose order is their name's)."""
    tag = re.fullmatch(r"llama-server-help-b([0-9]+)\.txt", path.name)
    return (1, int(tag.group(1)), "") if tag else (0, 0, path.name)


@lru_cache(maxsize=1)
def default_help() -> str:
    """The newest shipped --help (the highest release tag), for alias names when the ref's is not shipped."""
    return max(_DATA.glob("llama-server-help-*.txt"), key=_release).read_text()


def protected_flag_errors(extra_args: list[str], help_text: str | None = None) -> list[tuple[str, str]]:
    """(what, fix) for each extra argument that is, or is an alias of, a flag voltafleet sets.
    Call it with the built binary's --help too (roles/server), for its aliases."""
    names = managed_names(help_text or default_help())
    out = []
    for flag in dict.fromkeys(flag_names(extra_args)):
        key = names.get(flag)
        if key is None:
            continue
        var, why = MANAGED[key]
        alias = "" if flag == key else f" (an alias of {key})"
        if key == "--api-key":
            out.append((f"{flag} passes an API key on the command line, where `ps` shows it",
                        "put the key in a file and set server_api_key_file"))
        elif var:
            out.append((f"{flag}{alias} is set by voltafleet from {var}" + (f" ({why})" if why else ""),
                        f"set {var} instead, and remove {flag} from server_extra_flags"))
        else:
            out.append((f"{flag}{alias} is set by voltafleet: {why}", f"remove {flag} from server_extra_flags"))
    return out


def split_extra(extra_flags: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """server_extra_flags split into llama-server arguments, and (what, fix) for each item
    that would not stay one plain argument per word."""
    args, errors = [], []
    for item in extra_flags:
        try:
            words = shlex.split(item)
        except ValueError as e:
            errors.append((f"has the item {item!r}: {e}", "write flags and values as plain words"))
            continue
        if not words or any(w == "" for w in words):
            errors.append((f"has the item {item!r}: an empty argument", "remove it, or give the flag a value"))
            continue
        for w in words:
            bad = sorted({c for c in w if c in _BAD_ARG_CHARS or c.isspace() or not c.isprintable()})
            if bad:
                errors.append((f"has the item {item!r}: its word {w!r} holds {' '.join(repr(c) for c in bad)}",
                               "use plain words: no quotes, spaces, $, `, ;, &, |, <, >, ! or #"))
            else:
                args.append(w)
    return args, errors


def extra_flag_errors(extra_flags: list[str], ref: str) -> list[tuple[str, str]]:
    """Everything checkable about server_extra_flags on the controller: plain words, no
    flag voltafleet sets, and (when voltafleet ships the --help of commit `ref`) only
    current flags of that llama-server."""
    args, errors = split_extra(extra_flags)
    pinned = pinned_help(ref)
    errors += protected_flag_errors(args, pinned)
    if pinned is not None:
        known, removed = parse_help(pinned)
        for name in dict.fromkeys(flag_names(args)):
            hint = REPLACED.get(name)
            if name in removed:
                errors.append((f"{name}: llama-server {ref[:12]} says: {removed[name]}",
                               f"use {hint} instead" if hint else f"remove {name} from server_extra_flags"))
            elif name not in known:
                errors.append((f"{name} is not a flag of llama-server {ref[:12]} (llama_cpp_ref)",
                               f"use {hint} instead" if hint else "remove it; see llama-server --help"))
    return errors


def binary_flag_problems(args: list[str], extra_flags: list[str], help_text: str,
                         source: str | None = None) -> list[Problem]:
    """The build-time check (roles/server, against the new binary's own --help): every
    rendered argument known and current, and no extra flag that is, or is an alias of, a
    flag voltafleet sets. Each Problem names server_extra_flags and its file."""
    extra, _ = split_extra(extra_flags)
    out = [Problem(what, fix, source, "server_extra_flags") for what, fix in protected_flag_errors(extra, help_text)]
    for e in check_against_help(args, help_text):
        name = e.split(":", 1)[0]
        fix = (f"use {REPLACED[name]} instead" if name in REPLACED
               else f"remove {name} from server_extra_flags, or see llama-server --help")
        out.append(Problem(e, fix, source, "server_extra_flags"))
    return out
