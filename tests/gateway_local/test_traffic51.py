"""Issue 51 item 1 on a real llama-server of the pinned build (CPU, this machine, no lab): a small
file of qwen35gen's varying kind answers different prompts differently (the zero-weight file says "!"
every step), and the traffic driver's records are complete, its follow-ups finding most of their
prompt cached. Like the other tests here, a missing server or vocabulary fails, never skips."""
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from bench.gpu.gpu_proof import HEAP51
from bench.traffic import driver
from bench.traffic.model import Lognormal, Params, schedule
from lab import qwen35gen as gen
from tests.gateway_local import harness

PORT = harness.BASE_PORT + 40
SHAPE = replace(gen.SHAPES["tiny"], n_embd=256, n_ff=512, head_dim=64, ssm_d_state=32, ssm_dt_rank=8)


def vocab() -> Path:
    from lab.fleet import sdist_vocab
    return sdist_vocab()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """The module's one model file (vary.gguf, qwen35gen's varying kind), written once: every server here loads it."""
    binary = harness.pinned_server()
    if not binary or not vocab().exists():
        pytest.fail(f"needs a llama-server of the pinned commit ({binary or 'none'}) and {vocab()} (the lab's sdist)")
    tmp = tmp_path_factory.mktemp("traffic51-models")
    gen.write_sparse(str(vocab()), str(tmp / "vary.gguf"), SHAPE, "q4_k_s", vary=51)
    return tmp


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    binary = harness.pinned_server()
    tmp = tmp_path_factory.mktemp("traffic51")
    model = models / "vary.gguf"
    log = open(tmp / "llama-server.log", "wb")
    p = subprocess.Popen([binary, "-m", str(model), "-c", "8192", "-np", "2", "-t", "1", "--host", "127.0.0.1",
                          "--port", str(PORT)], stdout=log, stderr=subprocess.STDOUT)
    try:
        harness.wait_http(f"http://127.0.0.1:{PORT}/health", 120)
        yield PORT
    finally:
        p.terminate()
        p.wait(30)


def answer(port: int, question: str) -> tuple[str, str]:
    r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": question}], "max_tokens": 24, "thinking_budget_tokens": 8,
        "ignore_eos": True, "temperature": 0}).json()["choices"][0]["message"]
    return r.get("reasoning_content") or "", r["content"]


def test_answers_differ_with_the_prompt(server):
    a = answer(server, "how many prime numbers are there below one hundred")
    b = answer(server, "tell me about the fleet and its canary hosts today")
    assert a == answer(server, "how many prime numbers are there below one hundred")  # greedy: replayable
    assert a[1] != b[1] and a[1].split() and b[1].split()
    assert all(w.isascii() and w.islower() for w in (a[0] + a[1] + b[1]).split())  # plain words only
    assert "<think>" not in a[1] and "!" not in a[1]


def test_driver_records_are_complete_and_follow_ups_found_their_prompt_cached(server):
    small = dict(opening=Lognormal(60, 0.5, 16, 200), followup=Lognormal(20, 0.5, 8, 80),
                 thinking=Lognormal(8, 0.3, 4, 16), answer=Lognormal(16, 0.3, 8, 32))
    s = schedule(Params(seed=3, slots=2, per_slot=2, busy=0.8, turn_s=0.6, conversations=4, max_turns=3,
                        ctx_per_slot=4096, **small))
    t = time.monotonic()
    r = driver.replay(s, server)
    assert time.monotonic() - t < 90
    recs = r["records"]
    assert len(recs) == sum(len(c.turns) for c in s.conversations)
    for x in recs:
        assert "error" not in x, x
        assert x["ttft_ms"] > 0 and x["prompt_n"] > 0 and x["cache_n"] is not None
        assert x["reasoning_chunks"] == x["thinking_tokens"] and x["tokens"] == x["thinking_tokens"] + x["answer_tokens"]
    follow = [x for x in recs if x["followup"]]
    assert follow and all(x["cache_n"] > 0 for x in follow)
    assert r["summary"]["followup_cached_share"] > 0.3 and r["summary"]["errors"] == 0
    assert r["fingerprint"] == s.fingerprint()


def test_the_gpu_phase_keeps_each_repetitions_metrics_and_log_span(server, models, tmp_path, monkeypatch):
    """bench/gpu/proof/traffic.py, the phase the GPU sessions run, on the pinned CPU server (a second one,
    started by the phase itself with checkpoints on): each repetition keeps /metrics before and after and
    its span of the server's log, and those agree with the driver's own records: the server's counter of
    prompt tokens grows by exactly what the records say it processed, and the span holds the repetition's
    checkpoints (bench.traffic.analyze reads them)."""
    import argparse
    import json
    from dataclasses import asdict

    from bench.gpu.proof import traffic as phase
    from bench.gpu.proof.runner import ProofRun
    from bench.traffic import analyze

    port = PORT + 1
    small = dict(opening=Lognormal(60, 0.5, 16, 200), followup=Lognormal(20, 0.5, 8, 80),
                 thinking=Lognormal(8, 0.3, 4, 16), answer=Lognormal(16, 0.3, 8, 32))
    params = Params(seed=5, slots=2, per_slot=1, busy=0.8, turn_s=0.6, conversations=3, max_turns=3,
                    ctx_per_slot=4096, **small)
    args = ["-m", "MODEL", "-c", "8192", "-np", "2", "-t", "1", "--host", "127.0.0.1", "--port", str(port),
            "--metrics", "--log-verbosity", "4", "--ctx-checkpoints", "4"]
    plan = {"port": port, "traffic51": {"build": "mmq", "runs": 2, "configs": [
        {"name": "t51-local", "kind": "traffic", "model": "vary.gguf", "args": args, "traffic": asdict(params),
         "env": HEAP51}]}}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    a = argparse.Namespace(plan=str(tmp_path / "plan.json"), res=str(tmp_path), models=str(models),
                           bin=str(Path(harness.pinned_server()).parent), bins="", cublas_bin=None)
    run = ProofRun(a)
    monkeypatch.delenv("TRAFFIC51_ONLY", raising=False)  # every config of the plan
    phase.traffic(run, "mmq")
    (r,) = json.loads((tmp_path / "results.json").read_text())["traffic51"]
    assert r["complete"] and r["alive_at_end"] is True and len(r["reps"]) == 2, r.get("log")
    assert r["env"] == HEAP51 and phase.done([r], plan["traffic51"]["configs"][0])
    assert not phase.done([r], {**plan["traffic51"]["configs"][0], "env": None})  # another environment: run it
    text = (Path("/tmp") / r["log_file"]).read_text(errors="replace")
    spans = [rep["log_span"] for rep in r["reps"]]
    assert spans[0][0] < spans[0][1] <= spans[1][0] < spans[1][1] <= len(text.encode())
    for rep in r["reps"]:
        grew = rep["metrics_after"]["prompt_tokens_total"] - rep["metrics_before"]["prompt_tokens_total"]
        assert grew == analyze.tokens(rep)["processed"] > 0
        counts = analyze.server_counts(analyze.rep_lines(text, rep["log_span"]))
        assert counts["created"] >= rep["summary"]["requests"]  # every prompt leaves one near its end, at least
        assert counts["restored"] >= 1  # follow-ups resumed from a checkpoint
        # llama-server's default host cache (8 GiB here: no --cache-ram) saves slots and times its own updates
        assert counts["save_attempts"] >= 1 and counts["cache_updates"] >= 1 and counts["cache_update_ms"] > 0


def test_a_config_s_environment_reaches_its_server(models, tmp_path):
    """The phase starts a config's server with its env beside the phase's own (gpu_proof.HEAP51: glibc's
    malloc tunables, which the server reads at its start): the running process's environment holds it."""
    import argparse
    import json

    from bench.gpu.proof.runner import ProofRun

    port = PORT + 2
    model = models / "vary.gguf"
    (tmp_path / "plan.json").write_text(json.dumps({"port": port}))
    a = argparse.Namespace(plan=str(tmp_path / "plan.json"), res=str(tmp_path), models=str(tmp_path),
                           bin=str(Path(harness.pinned_server()).parent), bins="", cublas_bin=None)
    s = ProofRun(a).server("mmq", "env-check", ["-m", "MODEL", "-c", "512", "-t", "1", "--host", "127.0.0.1",
                                                "--port", str(port)], model=str(model), env=HEAP51)
    try:
        assert s.ok, s.log()[-2000:]
        (got,) = [x.decode() for x in Path(f"/proc/{s.p.pid}/environ").read_bytes().split(b"\0")
                  if x.startswith(b"GLIBC_TUNABLES=")]
        # glibc (2.36 here) parses every tunable at the server's start, then leaves the first alone in the string
        # (tests/unit/test_ckpt_copy.py checks that both act)
        first = HEAP51["GLIBC_TUNABLES"].split(":")[0]
        assert got in (f"GLIBC_TUNABLES={HEAP51['GLIBC_TUNABLES']}", f"GLIBC_TUNABLES={first}")
    finally:
        s.stop()
