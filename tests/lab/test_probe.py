"""The quality probes on a real small model (Gemma 3 270M Q4_K_M from PyPI): every instance
of every host, the canary included, is compared with the golden probes kept in probes/ (their
greedy tokens and log-probabilities), the short one and the long one (556 prompt tokens: the
64+ row batches that run through cuBLAS on Volta); a host given a coarser KV cache (q4_0)
diverges, fails and rolls back; a host whose slots cannot take a long prompt fails the long
probe alone."""
from tests.lab.helpers import deploy, env_file, lab, rollout


def test_a_host_with_a_q4_0_kv_cache_diverges_from_the_canary_and_rolls_back(converged, tmp_path):
    hosts = lab()["hosts"][:3]
    gemma = lab()["gemma"]
    bad = hosts[2]
    before = env_file(bad)
    real_text = {"model_url": gemma["url"], "model_sha256": gemma["sha256"], "smoke_probe_prompt": gemma["prompt"],
                 "smoke_tokens": 16, "smoke_parallel": 2}
    try:
        run, report = rollout(["--batch", "2", "--fail-percent", "50"], vars=real_text,
                              host_vars={bad["name"]: {"server_cache_type_k": "q4_0", "server_cache_type_v": "q4_0"}},
                              tmp=tmp_path)
        assert run.rc == 1, run
        status = {h["host"]: h for h in report["hosts"]}
        assert status[hosts[0]["name"]]["probe"] == "match" and status[hosts[0]["name"]]["status"] == "passed"
        assert status[hosts[1]["name"]]["probe"] == "match" and status[hosts[1]["name"]]["status"] == "passed"
        assert status[bad["name"]]["status"] == "rolled_back"
        assert status[bad["name"]]["probe"].startswith("diverged")
        assert "quality probe diverged" in status[bad["name"]]["detail"]
        # the long probe diverges from its first tokens (the short one only at token 13)
        assert "long probe: token 1 is" in status[bad["name"]]["detail"]
        assert env_file(bad) == before  # its previous model and flags serve again
        assert "gemma" in env_file(hosts[1])
    finally:
        assert deploy().rc == 0


def test_the_long_probe_fails_a_host_whose_slots_cannot_take_a_long_prompt(converged, tmp_path):
    """512 tokens a slot (-c 2048 -np 4): the short probe and the smoke streams pass, the long
    probe's prompt does not fit, so the host is rolled back with the server's own reason."""
    hosts = lab()["hosts"][:3]
    bad = hosts[1]
    before = env_file(bad)
    try:
        run, report = rollout(["--batch", "2", "--fail-percent", "50"],
                              host_vars={bad["name"]: {"server_ctx": 2048}}, tmp=tmp_path)
        assert run.rc == 1, run
        status = {h["host"]: h for h in report["hosts"]}
        assert status[hosts[0]["name"]]["status"] == "passed" and status[hosts[2]["name"]]["status"] == "passed"
        assert status[bad["name"]]["status"] == "rolled_back", status[bad["name"]]
        assert "exceeds the available context size (512 tokens)" in status[bad["name"]]["detail"]
        assert env_file(bad) == before
    finally:
        assert deploy().rc == 0
