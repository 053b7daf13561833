"""Fault injection on the lab fleet: each case ends with a clear error or a recovered
service, and nothing lost (the previous release, model and flags keep serving).
Every case records {case, passed, data_lost} in reports/faults.jsonl; bench/lab/faults.py
runs this file and prints the summary table."""
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lab import fleet
from tests.lab.helpers import PYINFRA, REPO, SERVER_HOST, current_release, deploy, env_file, fresh_cache, lab, rollout, ssh

RECORD = REPO / "reports" / "faults.jsonl"
MODELS = "/var/lib/voltafleet/models"


def serving(h) -> dict:
    """What a host serves now: release, flags, model checksum, health of instance 0."""
    return {"release": current_release(h), "env": env_file(h),
            # the checksum of the model instance 0 serves (its -m), not of every file kept
            "model": ssh(h, "f=$(sed -n 's/.*-m \\([^ ]*\\).*/\\1/p' /etc/voltafleet/llama-server/0.env); "
                            "sha256sum \"$f\" | cut -d' ' -f1"),
            "health": ssh(h, f"curl -s -o /dev/null -w '%{{http_code}}' http://{SERVER_HOST}:{h['server_port_base']}/health",
                          check=False)}


def completes(h) -> bool:
    """Every instance of the host answers a real completion request."""
    return all('"tokens_predicted":4' in ssh(h, f"curl -s -m 30 http://{SERVER_HOST}:{h['server_port_base'] + i}/completion "
                                                "-d '{\"prompt\":\"hi\",\"n_predict\":4}'", check=False)
               for i in (0, 1))


@pytest.fixture
def case(request, converged):
    """Records the case's outcome; data_lost: a host no longer serves what it served before."""
    hosts = lab()["hosts"][:3]
    before = {h["name"]: serving(h) for h in hosts}
    outcome = {"case": request.node.name.removeprefix("test_"), "passed": False, "data_lost": None}
    yield outcome
    rep = getattr(request.node, "rep_call", None)
    outcome["passed"] = bool(rep and rep.passed)
    after = {h["name"]: serving(h) for h in hosts}
    answered = {h["name"]: completes(h) for h in hosts}
    if outcome["data_lost"] is None:  # the case itself did not judge it: compare with before
        outcome["data_lost"] = sum(after[n]["model"] != before[n]["model"] or after[n]["health"] != "200"
                                   or not answered[n] for n in before)
    RECORD.parent.mkdir(exist_ok=True)
    with open(RECORD, "a") as f:
        f.write(json.dumps(outcome) + "\n")
    # every case ends with the fleet serving what it served before, answering real requests
    assert outcome["data_lost"] == 0, (before, after, answered)
    assert all(answered.values()), answered


class Dropping(http.server.BaseHTTPRequestHandler):
    """Serves the lab model's first half, then drops the connection (a broken mirror)."""
    path_on_disk: Path

    def do_GET(self):
        data = self.path_on_disk.read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2])
        self.wfile.flush()
        self.connection.shutdown(2)

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", str(self.path_on_disk.stat().st_size))
        self.end_headers()

    def log_message(self, *a):
        pass


def new_model_vars(url: str, sha: str) -> dict:
    # a model no golden probe was recorded for (the case is the download, not the probe)
    return {"model_url": url, "model_sha256": sha, "smoke_probe": False}


def test_model_with_a_wrong_checksum_is_refused_and_the_old_one_serves(case, tmp_path):
    h = lab()["hosts"][0]
    run = deploy(new_model_vars(lab()["model_url"], "0" * 64), tmp_path)  # the mirror's file is not that one
    assert run.rc != 0 and "sha256 of the download is" in run.out and "untouched" in run.out
    assert ssh(h, f"ls {MODELS}/*/*.part 2>/dev/null || true") == ""  # the bad download is gone


def test_model_404_is_a_clear_error_and_the_old_one_serves(case, tmp_path):
    run = deploy(new_model_vars(lab()["model_url"].replace("tiny", "missing"), "1" * 64), tmp_path)
    assert run.rc != 0 and "download of" in run.out and "failed (curl exit 22)" in run.out


def test_model_transfer_cut_halfway_keeps_the_partial_and_the_next_run_resumes(case, tmp_path):
    """One host is given the new model's URL (the others keep theirs): its transfer is cut
    half way, the partial is kept, the next run resumes it from the mirror and serves it."""
    st = lab()
    h = st["hosts"][0]
    src = Path(st["mirror_root"]) / "models" / Path(st["model_url"]).name
    copy = src.with_name("tiny-copy.gguf")
    copy.write_bytes(src.read_bytes())
    Dropping.path_on_disk = copy
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 18901), Dropping)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        run = deploy(host_vars={h["name"]: new_model_vars("http://127.0.0.1:18901/models/tiny-copy.gguf",
                                                          st["model_sha256"])}, tmp=tmp_path)
    finally:
        server.shutdown()
    assert run.rc != 0 and "partial kept at" in run.out
    part = int(ssh(h, f"stat -c %s {MODELS}/*/tiny-copy.gguf.part"))
    assert 0 < part < copy.stat().st_size
    run = deploy(host_vars={h["name"]: new_model_vars(st["model_url"].rsplit("/", 1)[0] + "/tiny-copy.gguf",
                                                      st["model_sha256"])}, tmp=tmp_path)
    assert run.rc == 0, run  # resumed from the mirror, verified, served
    assert ssh(h, f"ls {MODELS}/*/tiny-copy.gguf.part 2>/dev/null || echo none") == "none"
    assert "tiny-copy.gguf" in env_file(h)
    assert deploy().rc == 0
    copy.unlink()


def test_model_disk_full_is_refused_before_any_change(case, tmp_path):
    h = lab()["hosts"][0]
    ssh(h, "mkdir -p /mnt/vf-small && (mountpoint -q /mnt/vf-small || mount -t tmpfs -o size=1m tmpfs /mnt/vf-small)")
    try:
        run = deploy(host_vars={h["name"]: {"model_dir": "/mnt/vf-small"}}, tmp=tmp_path)
        assert run.rc != 0 and "preflight refused the rollout, nothing was changed" in run.out
        assert "free in /mnt/vf-small, the model needs" in run.out
        assert ssh(h, "ls /mnt/vf-small") == ""
    finally:
        ssh(h, "umount /mnt/vf-small")


def test_host_stopped_mid_rollout_is_named_and_a_rerun_completes_it(case, tmp_path):
    hosts = lab()["hosts"][:3]
    victim = hosts[2]
    e = {**os.environ, "VOLTAFLEET_VARS": str(tmp_path / "v.yml")}
    (tmp_path / "v.yml").write_text("server_ctx_checkpoints: 16\n")
    proc = subprocess.Popen([sys.executable, "-m", "rollout", "inventory/lab.py", "--batch", "1", "--fail-percent", "50"],
                            cwd=REPO, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    try:
        for line in proc.stdout:
            out.append(line)
            if "batch 1:" in line:  # the canary is done: the last host goes away before its batch
                fleet.stop_pidfile(Path(victim["dir"]) / "nspawn.pid")
        proc.wait(timeout=900)
        text = "".join(out)
        report = json.loads((REPO / "reports" / "rollout-latest.json").read_text())
        status = {h["host"]: h["status"] for h in report["hosts"]}
        assert proc.returncode == 1, text
        assert status == {hosts[0]["name"]: "passed", hosts[1]["name"]: "passed", victim["name"]: "failed"}, text
        lost = next(h for h in report["hosts"] if h["host"] == victim["name"])
        assert "no outcome record" in lost["detail"]  # never a pass by default
    finally:
        fleet.up(len(lab()["hosts"]))  # the host comes back (whatever happened above)
    run, report = rollout(["--batch", "1"], vars={"server_ctx_checkpoints": 16}, tmp=tmp_path)
    assert run.rc == 0 and report["ok"], run
    assert "--ctx-checkpoints 16" in env_file(victim)
    assert deploy().rc == 0


def test_controller_interrupted_leaves_no_half_switched_release_and_a_rerun_converges(case, tmp_path):
    hosts = lab()["hosts"][:3]
    (tmp_path / "v.yml").write_text(f"llama_cpp_ref: {lab()['llama_cpp_next_ref']}\n")
    e = {**os.environ, "VOLTAFLEET_VARS": str(tmp_path / "v.yml")}
    proc = subprocess.Popen([PYINFRA, "-y", "inventory/lab.py", "deploy.py"], cwd=REPO, env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sent = False
    for line in proc.stdout:
        if "Switch `current`" in line or "Restart, smoke test" in line:
            proc.send_signal(signal.SIGKILL)  # the controller dies mid-run (pyinfra lets Ctrl-C finish the op)
            sent = True
            break
    proc.wait(timeout=60)
    assert sent, "the run ended before it could be interrupted: the case tested nothing"
    assert proc.returncode == -signal.SIGKILL, "the run was not interrupted: it finished"
    for h in hosts:  # `current` is whole: a release directory with its build info, never a half one
        target = ssh(h, "readlink /opt/voltafleet/current")
        assert ssh(h, f"test -f /opt/voltafleet/{target}/BUILD_INFO.json && test -x /opt/voltafleet/{target}/bin/llama-server && echo ok") == "ok"
        assert ssh(h, "ls -d /opt/voltafleet/current.tmp 2>/dev/null || true") == ""
    run = deploy()  # back to the repository's config; then it is converged
    assert run.rc == 0, run
    assert deploy().changed == 0


def test_server_crash_loop_stops_at_the_start_limit_and_the_smoke_test_reports_it(case, tmp_path):
    h = lab()["hosts"][0]
    port = h["server_port_base"]
    env = "/etc/voltafleet/llama-server/0.env"
    dropin = "/run/systemd/system/llama-server@0.service.d"
    since = ssh(h, "date '+%Y-%m-%d %H:%M:%S'")
    ssh(h, f"sed -i 's/^LLAMA_SERVER_ARGS=/LLAMA_SERVER_ARGS=--no-such-flag /' {env} && mkdir -p {dropin} && "
           # the limit reached in 3 starts, 1 s apart (the unit's own RestartSec is 5 s): the same loop, sooner
           f"printf '[Unit]\\nStartLimitBurst=3\\n[Service]\\nRestartSec=1\\n' > {dropin}/limit.conf && "
           "systemctl daemon-reload && "
           "systemctl restart llama-server@0.service || true")
    gave_up = "Start request repeated too quickly"  # systemd's words at the start limit
    deadline = time.time() + 90
    while time.time() < deadline:
        if gave_up in ssh(h, f"journalctl -u llama-server@0.service --no-pager -o cat --since '{since}'", check=False):
            break
        time.sleep(2)
    assert gave_up in ssh(h, f"journalctl -u llama-server@0.service --no-pager -o cat --since '{since}'", check=False)
    assert ssh(h, "systemctl is-active llama-server@0.service", check=False) == "failed"
    assert int(ssh(h, "systemctl show -P NRestarts llama-server@0.service")) >= 2  # it did loop, then stopped
    out = ssh(h, f"python3 /opt/voltafleet/bin/voltafleet-smoke --port {port} --health-timeout 5 --tokens 8 --parallel 1")
    assert "not ready after 5s" in json.loads(out)["instances"][0]["error"]
    ssh(h, f"rm -rf {dropin} && systemctl daemon-reload")
    run = deploy()  # the env file is put back and the instance started again (past its start limit)
    assert run.rc == 0, run
    assert ssh(h, "systemctl is-active llama-server@0.service") == "active"


def test_build_host_lost_during_a_shared_build_is_reported_and_a_rerun_builds(case, tmp_path):
    hosts = lab()["hosts"][:3]
    builder = hosts[0]
    before = {h["name"]: current_release(h) for h in hosts}
    (tmp_path / "v.yml").write_text("llama_cpp_cmake_extra: ['-DLLAMA_FAULT_TEST=ON']\n")
    e = {**os.environ, "VOLTAFLEET_VARS": str(tmp_path / "v.yml"), **fresh_cache(tmp_path)}  # a real compile
    proc = subprocess.Popen([PYINFRA, "-y", "inventory/lab.py", "deploy.py"], cwd=REPO, env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    for line in proc.stdout:
        out.append(line)
        if "Starting operation: llama.cpp | Compile" in line:
            time.sleep(3)
            fleet.stop_pidfile(Path(builder["dir"]) / "nspawn.pid")
    proc.wait(timeout=900)
    text = "".join(out)
    fleet.up(len(lab()["hosts"]))  # the builder comes back whatever the assertions say
    assert proc.returncode != 0
    assert "its build host" in text and "failed or was lost" in text, text[-3000:]
    assert "Unexpected error in Python callback" not in text  # one line, never a traceback
    for h in hosts[1:]:
        assert current_release(h) == before[h["name"]]  # nothing switched on the others
        assert ssh(h, f"curl -sf http://{SERVER_HOST}:{h['server_port_base']}/health")
    run = deploy({"llama_cpp_cmake_extra": ["-DLLAMA_FAULT_TEST=ON"]}, tmp_path, env=fresh_cache(tmp_path))
    assert run.rc == 0, run
    assert len({current_release(h) for h in hosts}) == 1
    assert deploy().rc == 0
