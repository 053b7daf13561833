"""N-gram speculation (issue 19 §6), measured on the lab fleet with Gemma 3 270M: greedy output
with and without `server_spec_ngram`, tok/s and the draft acceptance rate, for two kinds of text:
an editing task that repeats its input, and free prose.

    .venv/bin/python -m bench.lab.ngram [--types ngram-mod ngram-simple] [--runs 3] [--tokens 192]

Each mode is a real deploy of the lab fleet (Gemma on every host, the mode's flags rendered by
voltafleet); requests go straight to one instance (loopback), one at a time, greedy, prompt cache
off, `timings` from llama-server itself (predicted_per_second, draft_n, draft_n_accepted). The
lab's own configuration is put back at the end. Every figure: median of --runs, min-max beside
it; the raw record goes to reports/ngram.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import yaml

from lab.fleet import BRIDGE_ADDR, load_state

REPO = Path(__file__).resolve().parents[2]

PARAGRAPH = (
    "Our fleet runs old servers with eight GPUs each. Every server gets the same driver, the same "
    "toolkit and the same build of the inference engine. When a server fails its smoke test, the "
    "rollout stops, the server goes back to its previous build, and the operator reads one line that "
    "says why. The gateway sends each conversation to the same server, so the prompt cache is hit, "
    "and it never sends a server more requests than it has slots. A server that is restarting is "
    "drained first, so no user sees an error while the fleet rolls."
)
TEXTS = {
    "edit": ("Copy the following text exactly, word for word, but replace every word \"server\" with "
             "\"host\" and every word \"servers\" with \"hosts\". Output only the edited text.\n\n" + PARAGRAPH),
    "prose": "Write a short original story about a lighthouse keeper who finds a strange map. Use vivid details.",
}


def deploy(vars_: dict) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump(vars_, f)
    env = {**os.environ, "VOLTAFLEET_VARS": f.name}
    cmd = [str(Path(sys.executable).with_name("pyinfra")), "-y", "inventory/lab.py", "deploy.py"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"deploy with {vars_} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")


def one(c: httpx.Client, text: str, tokens: int) -> dict:
    r = c.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": text}], "max_tokens": tokens, "temperature": 0,
        "cache_prompt": False, "seed": 1})
    r.raise_for_status()
    body = r.json()
    t = body.get("timings", {})
    return {"content": body["choices"][0]["message"]["content"], "predicted_n": t.get("predicted_n"),
            "tps": t.get("predicted_per_second"), "draft_n": t.get("draft_n", 0),
            "draft_n_accepted": t.get("draft_n_accepted", 0)}


def med(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1), "max": round(max(values), 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--types", nargs="+", default=["ngram-mod", "ngram-simple"])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--tokens", type=int, default=192)
    a = p.parse_args()
    st = load_state()
    g = st["gemma"]
    h = st["hosts"][0]
    url = f"http://{BRIDGE_ADDR}:{h['server_port_base']}"
    base = {"model_url": g["url"], "model_sha256": g["sha256"], "smoke_probe_prompt": g["prompt"],
            "smoke_tokens": 16, "smoke_parallel": 2, "server_ctx_checkpoints": 16}
    record: dict = {"host": h["name"], "instance_url": url, "runs": a.runs, "tokens": a.tokens, "modes": {}}
    try:
        for mode in ["off", *a.types]:
            deploy({**base, "server_spec_ngram": None if mode == "off" else mode})
            argv = subprocess.run(["ssh", "-F", st["ssh_config"], h["name"], "cat /etc/voltafleet/llama-server/0.env"],
                                  capture_output=True, text=True).stdout.strip()
            out = {"env": argv}
            with httpx.Client(base_url=url, timeout=300) as c:
                one(c, "Hello", 8)  # warm-up
                for kind, text in TEXTS.items():
                    runs = [one(c, text, a.tokens) for _ in range(a.runs)]
                    out[kind] = {"runs": runs, "tps": med([r["tps"] for r in runs]),
                                 "acceptance": (round(sum(r["draft_n_accepted"] for r in runs)
                                                      / max(1, sum(r["draft_n"] for r in runs)), 3)
                                                if mode != "off" else None),
                                 "identical_runs": len({r["content"] for r in runs}) == 1}
            record["modes"][mode] = out
            print(f"{mode}: " + "; ".join(f"{k} {out[k]['tps']['median']} tok/s ({out[k]['tps']['min']}-"
                                        f"{out[k]['tps']['max']}), acceptance {out[k]['acceptance']}"
                                        for k in TEXTS), flush=True)
    finally:
        deploy({})  # the lab's own configuration again
    off = record["modes"]["off"]
    for mode in a.types:
        m = record["modes"].get(mode)
        if not m:
            continue
        for kind in TEXTS:
            same = m[kind]["runs"][0]["content"] == off[kind]["runs"][0]["content"]
            m[kind]["same_output_as_off"] = same
            m[kind]["speedup"] = round(m[kind]["tps"]["median"] / off[kind]["tps"]["median"], 2)
            print(f"{mode} {kind}: {m[kind]['speedup']}x tok/s vs off, acceptance {m[kind]['acceptance']}, "
                  f"greedy output identical: {same}")
    (REPO / "reports").mkdir(exist_ok=True)
    (REPO / "reports" / "ngram.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
