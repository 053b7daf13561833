"""The golden quality probe: the expected greedy output (token ids and log-probabilities)
of the model for the probe's settings, recorded once when the model is pinned and kept in
the repository (probes/<key>.json). Every instance of every host is compared with it in
every run; a missing or empty golden probe is an error, never a match.

Two probes run (`probes(cfg)`): the short one (smoke_probe_prompt) and, with smoke_probe_long,
a fixed prompt of 600+ tokens (voltafleet/data/probe-long.txt). A prompt of 64 tokens or more
is multiplied in batches of 64+ rows: on Volta through cuBLAS on F16-dequantized weights (FP16
overflow has turned such answers into NaN: llama.cpp #12946, #26044), elsewhere through MMQ.
The short probe never reaches that path; the long one must (smoke_probe_long_min_tokens).

    key("ab" * 32, "The capital of France is", 16) is
    'abababababababab-' followed by 12 hex digits of the settings
"""
from __future__ import annotations

from voltafleet.inputs.settings import Settings

import hashlib
import json
import math
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[2]
DIR = REPO / "probes"
LONG_PROMPT_FILE = REPO / "voltafleet" / "data" / "probe-long.txt"


class Probe(NamedTuple):
    """One probe a host runs: the smoke report's key for it, its prompt and token count."""
    name: str        # "probe" (short) or "probe_long": the smoke client's report key
    prompt: str
    tokens: int
    min_prompt_tokens: int = 0   # the server must have evaluated at least this many prompt tokens


def long_prompt() -> str:
    return LONG_PROMPT_FILE.read_text()


def probes(cfg: Settings) -> list[Probe]:
    """The probes of this configuration: [] with smoke_probe off; the short one; the long one
    with smoke_probe_long (same token count, its prompt the fixed long text)."""
    if not cfg.smoke.probe:
        return []
    out = [Probe("probe", cfg.smoke.probe_prompt, cfg.smoke.probe_tokens)]
    if cfg.smoke.probe_long:
        out.append(Probe("probe_long", long_prompt(), cfg.smoke.probe_tokens, cfg.smoke.probe_long_min_tokens))
    return out


class ProbeError(ValueError):
    """No usable golden probe: says which file and how to record it."""


def key(model_sha256: str, prompt: str, tokens: int) -> str:
    """(model, settings) -> the golden probe's name: the model's sha256 and a digest of the
    prompt and token count (greedy, top-5 log-probabilities: fixed by the smoke client)."""
    settings = hashlib.sha256(json.dumps([prompt, int(tokens), "greedy", 5]).encode()).hexdigest()[:12]
    return f"{model_sha256[:16]}-{settings}"


def path(model_sha256: str, prompt: str, tokens: int, directory: Path = DIR) -> Path:
    return Path(directory) / f"{key(model_sha256, prompt, tokens)}.json"


RECORD_FIX = ("Fix: record it once from a host that serves the pinned model: "
              "python -m rollout INVENTORY --canary HOST --record-probe (then commit probes/)")


def load(model_sha256: str | None, prompt: str, tokens: int, directory: Path = DIR) -> dict:
    """The golden probe for this model and settings; ProbeError when there is none."""
    if not model_sha256:
        raise ProbeError("smoke_probe needs model_sha256 (the golden probe is kept per model). "
                         "Fix: pin the model (python -m voltafleet.inputs.pin_model) or set smoke_probe: false")
    p = path(model_sha256, prompt, tokens, directory)
    try:
        golden = json.loads(p.read_text())
    except FileNotFoundError:
        raise ProbeError(f"no golden probe {p.relative_to(REPO) if p.is_relative_to(REPO) else p} for model "
                         f"{model_sha256[:16]}... and this smoke_probe_prompt/smoke_probe_tokens. {RECORD_FIX}")
    except ValueError as e:
        raise ProbeError(f"{p}: not JSON ({e}). {RECORD_FIX}")
    if not golden.get("tokens") or len(golden.get("logprobs") or []) != len(golden["tokens"]):
        raise ProbeError(f"{p}: empty or incomplete golden probe (no tokens). {RECORD_FIX}")
    return golden


def save(model_sha256: str, prompt: str, tokens: int, probe: dict, source: str, directory: Path = DIR) -> Path:
    """Record a golden probe (what `--record-probe` does with the canary's probe)."""
    if not probe.get("tokens"):
        raise ProbeError(f"the probe from {source} has no tokens: not recorded")
    if unreported(probe):
        raise ProbeError(f"the probe from {source} lacks log-probabilities (a server that speculates reports none "
                         "for drafted tokens): not recorded. Fix: record it from a canary that does not speculate")
    p = path(model_sha256, prompt, tokens, directory)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = {"model_sha256": model_sha256, "prompt": prompt, "tokens_requested": tokens, "recorded_from": source,
            "tokens": probe["tokens"], "logprobs": probe["logprobs"], "text": probe.get("text", "")}
    p.write_text(json.dumps(data, indent=1) + "\n")
    return p


def speculates(cfg: Settings) -> bool:
    """Whether the servers draft tokens (MTP, n-gram or a draft model)."""
    return bool(cfg.server.spec_mtp or cfg.server.spec_ngram or cfg.model.draft_url)


def unreported(probe: dict) -> set[int]:
    """The steps whose log-probabilities the server did not report: the pinned llama-server
    sends none for tokens that came out of a speculative step (server-context.cpp: "TODO: set
    result.probs"; the logprob reads 0.0 and the top list is empty)."""
    return {i for i, top in enumerate(probe.get("top") or []) if not top}


def compare(golden: dict, probe: dict | None, tolerance: float, speculative: bool = False) -> str | None:
    """None when the probe matches the golden one: the same greedy tokens, each chosen
    token's log-probability within `tolerance` (nats). Else why not. An empty golden probe
    or a missing probe never matches. A speculating server (`speculative`) reports no
    log-probability for a drafted step: those steps are judged by their tokens alone (greedy
    output must not change), the first token (never drafted) by its log-probability too."""
    ref_tokens = (golden or {}).get("tokens") or []
    if not ref_tokens:
        return "the golden probe is empty"
    if not probe or not probe.get("tokens"):
        return "no probe tokens from this instance"
    tokens = probe["tokens"]
    bad = [i for i, v in enumerate(probe.get("logprobs") or []) if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        return f"log-probability of token {bad[0]} is {probe['logprobs'][bad[0]]} (NaN or infinite logits)"
    for i, (a, b) in enumerate(zip(ref_tokens, tokens)):
        if a != b:
            return f"token {i} is {b}, the golden probe's is {a}"
    if len(tokens) < len(ref_tokens):
        return f"{len(tokens)} probe tokens, the golden probe has {len(ref_tokens)}"
    pairs = list(zip(golden.get("logprobs") or [], probe.get("logprobs") or []))
    if any(a is None or b is None for a, b in pairs) or len(pairs) < len(ref_tokens):
        return "log-probabilities missing"
    if speculative:
        skip = unreported(probe)
        if 0 in skip:
            return "log-probability of token 0 missing (it is never drafted)"
        pairs = [pair for i, pair in enumerate(pairs) if i not in skip]
    worst = max(abs(a - b) for a, b in pairs)
    if worst > tolerance:
        return f"log-probability differs by {worst:.3f} (> {tolerance}) from the golden probe's"
    return None


def check(golden: dict, probe: dict | None, tolerance: float, spec: Probe, speculative: bool = False) -> str | None:
    """compare(), and for a probe with a minimum prompt length, that the server evaluated at
    least that many prompt tokens (else it did not run the 64+ token path it exists for)."""
    if spec.min_prompt_tokens and probe and probe.get("tokens"):
        n = probe.get("prompt_n")
        if n is None or n < spec.min_prompt_tokens:
            return (f"the long probe's prompt was {n} tokens, fewer than smoke_probe_long_min_tokens "
                    f"({spec.min_prompt_tokens}): it did not reach the 64+ token path")
    why = compare(golden, probe, tolerance, speculative)
    return f"long probe: {why}" if why and spec.name == "probe_long" else why
