"""The HAProxy gateway on the lab fleet: every instance a health-checked backend, the
client's API key passed through, a fleet that keeps serving while it rolls, a killed
server taken out and back, an invalid configuration refused with the old one serving."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from bench.lab.load import Load
from tests.lab.helpers import GATEWAY_URL, REPO, deploy, forget, gateway_stat, lab, main_pid, rollout, run_env, ssh, th


URL = GATEWAY_URL


def test_every_instance_is_a_health_checked_backend(gw):
    servers = gateway_stat(gw)
    want = {f"{h['name']}-{i}" for h in lab()["hosts"] for i in (0, 1)}
    assert set(servers) == want
    assert {s["status"] for s in servers.values()} == {"UP"}
    # "* L7OK": a check is running at this moment, its last result L7OK (HAProxy's stats)
    assert {s["check_status"].removeprefix("* ") for s in servers.values()} <= {"L7OK"}
    assert th(gw).service("haproxy").is_running and th(gw).service("haproxy").is_enabled
    cfg = ssh(gw, "cat /etc/haproxy/haproxy.cfg")
    assert "balance hash var(txn.affinity)" in cfg and "option httpchk GET /health" in cfg and "timeout server 600s" in cfg
    assert "option http-server-close" in cfg and "check maxconn 4 weight 64\n" in cfg  # keep-alive safe; slot-aware; even hash shares


def test_requests_and_prometheus_metrics_through_the_gateway(gw):
    load = Load(URL, clients=2, tokens=8, seconds=60, max_requests=6).start()
    for t in load.threads:
        t.join(timeout=70)
    s = load.stop()
    assert s["served"] >= 6 and s["failed"] == 0, s
    metrics = ssh(gw, f"curl -s http://{gw['metrics']}/metrics")
    assert "haproxy_backend_http_responses_total" in metrics


def test_api_key_is_passed_through_to_the_servers(gw, tmp_path):
    key = tmp_path / "api-key"
    key.write_text("vf-gateway-key-1\n")
    key.chmod(0o600)
    try:
        assert deploy({"server_api_key_file": str(key)}, tmp_path).rc == 0
        body = "-d '{\"prompt\":\"hi\",\"n_predict\":2}'"
        assert ssh(gw, f"curl -s -o /dev/null -w '%{{http_code}}' {URL}/completion {body}") == "401"
        assert ssh(gw, f"curl -s -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer vf-gateway-key-1' "
                       f"{URL}/completion {body}") == "200"
    finally:
        assert deploy().rc == 0


def test_fleet_keeps_serving_through_a_rolling_rollout_of_every_instance(gw, tmp_path):
    hosts = lab()["hosts"]
    before = {(h["name"], i): main_pid(h, i) for h in hosts for i in (0, 1)}
    # pooled keep-alive clients (one httpx pool), streamed and non-streamed requests in turn, each client pausing
    # 0.1 s between requests as users do (a client that never pauses only slows, on two cores, the rollout it tests)
    load = Load(URL, clients=8, tokens=8, seconds=600, max_requests=20000, pause_s=0.1).start()
    try:
        # the load shares the lab's two cores with the smoke test: judge serving, not speed, here
        # one host a batch: the other two keep 16 slots for the 8 clients (no deliberate 503 either)
        run, report = rollout(["--batch", "1"], vars={"server_ctx_checkpoints": 16, "smoke_min_single_tps": 0.5,
                                                      "smoke_min_aggregate_tps": 0.5}, tmp=tmp_path)
    finally:
        s = load.stop()
    print(f"\nload through the gateway during a rolling rollout: {json.dumps(s)}")
    (REPO / "reports").mkdir(exist_ok=True)
    (REPO / "reports" / "load-during-rollout.json").write_text(json.dumps({**s, "rollout_s": report.get("seconds")}) + "\n")
    assert run.rc == 0, run
    assert all(main_pid(h, i) != before[(h["name"], i)] for h in hosts for i in (0, 1))  # every instance restarted
    # drained before every restart: nothing failed, no stream was cut, nothing was refused busy
    assert s["served"] > 100 and s["failed"] == 0 and s["cut"] == 0 and s["busy"] == 0, s
    assert {v["status"] for v in gateway_stat(gw).values()} == {"UP"}  # every instance back in rotation
    assert deploy().rc == 0


def test_a_rollback_under_pooled_keepalive_clients_loses_no_request(gw, tmp_path):
    """issue 28: a canary whose new flags make llama-server refuse to start is rolled back; the
    rollback restarts only the instance this run drained (drained again, confirmed), the other
    one keeps serving untouched, and a pooled keep-alive client loses nothing."""
    hosts = lab()["hosts"]
    canary = hosts[0]
    before = {i: main_pid(canary, i) for i in (0, 1)}
    load = Load(URL, clients=8, tokens=8, seconds=600, max_requests=20000, pause_s=0.1).start()
    try:
        run, report = rollout(["--canary", canary["name"], "--batch", "1"],
                              host_vars={canary["name"]: {"server_extra_flags": ["--rope-scaling nonsense"]}},
                              tmp=tmp_path)
    finally:
        s = load.stop()
    print(f"\nload through the gateway during a canary rollback: {json.dumps(s)}")
    assert run.rc == 1, run
    (c, *rest) = report["hosts"]
    assert c["host"] == canary["name"] and c["status"] == "rolled_back" and "did not start" in c["detail"], c
    assert c["restarted"] == [0] and [h["status"] for h in rest] == ["not_run", "not_run"]
    assert main_pid(canary, 1) == before[1]          # never drained, never restarted
    assert main_pid(canary, 0) != before[0]          # drained, restarted onto the restored flags
    assert s["served"] > 20 and s["failed"] == 0 and s["cut"] == 0 and s["busy"] == 0, s
    assert {v["status"] for v in gateway_stat(gw).values()} == {"UP"}  # every instance back in rotation


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_canary_stops_cleanly_under_pooled_keepalive_clients(gw, tmp_path, sig):
    """issue 28: SIGTERM to the driver, or SIGINT to its process group as Ctrl-C in a terminal
    sends it, while the canary restarts: the canary's pyinfra run finishes its host (drained,
    restarted, smoked, back in rotation), no later batch starts, no pyinfra run is left behind,
    no instance stays in DRAIN or MAINT, the report says interrupted, the exit code is 128 + the
    signal, and the pooled keep-alive client loses nothing."""
    hosts = lab()["hosts"]
    forget()
    env = run_env({"server_ctx_checkpoints": 16, "smoke_min_single_tps": 0.5, "smoke_min_aggregate_tps": 0.5},
                  None, tmp_path)
    latest = REPO / "reports" / "rollout-latest.json"
    latest.unlink(missing_ok=True)
    load = Load(URL, clients=8, tokens=8, seconds=600, max_requests=20000, pause_s=0.1).start()
    out = []
    try:
        proc = subprocess.Popen([sys.executable, "-m", "rollout", "inventory/lab.py", "--batch", "1"], cwd=REPO,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        for line in proc.stdout:  # the canary's run has started: its host is about to drain and restart
            out.append(line)
            if "canary: " in line:
                break
        time.sleep(3)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # a terminal's Ctrl-C: the driver's process group
        else:
            proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=600)
        out.append(rest)
    finally:
        s = load.stop()
    text = "".join(out)
    print(f"\nload through the gateway, {sig.name} mid-canary: {json.dumps(s)}")
    assert proc.returncode == 128 + sig, text
    report = json.loads(latest.read_text())
    assert report["interrupted"] == sig.name and "interrupted by" in report["stopped"] and not report["ok"]
    assert [h["status"] for h in report["hosts"]] == ["passed", "not_run", "not_run"], report["hosts"]
    assert "--ctx-checkpoints 16" in ssh(hosts[0], "cat /etc/voltafleet/llama-server/0.env")
    assert "--ctx-checkpoints 16" not in ssh(hosts[1], "cat /etc/voltafleet/llama-server/0.env")
    left = subprocess.run(["pgrep", "-f", "pyinfra -y inventory/lab.py"], capture_output=True, text=True).stdout
    assert left == "", left
    assert {v["status"] for v in gateway_stat(gw).values()} == {"UP"}  # nothing left in DRAIN or MAINT
    assert s["served"] > 20 and s["failed"] == 0 and s["cut"] == 0 and s["busy"] == 0, s
    prom = (REPO / "reports" / "voltafleet-rollout.prom").read_text()
    assert f'voltafleet_rollout_interrupted{{rollout="{report["rollout"]}",inventory="inventory/lab.py",' \
           f'signal="{sig.name}"}} 1' in prom
    assert deploy().rc == 0


def test_a_killed_server_cuts_only_its_open_streams_leaves_rotation_and_returns(gw):
    """kill -9 of an instance with streams open: those streams are counted `cut` (begun, then
    broken), told apart from failures; every other request, during and after, is served."""
    every = {f"{x['name']}-{n}": (x, n, main_pid(x, n)) for x in lab()["hosts"] for n in (0, 1)}
    # streams only (a request not yet answered is retried elsewhere by the gateway, never cut), long
    # enough that one picked open is still open when the kill lands: 256 tokens with n_probs, which
    # makes each of the tiny model's tokens slower (2-3 s a stream, not the 0.3-0.6 s in which one
    # picked open had once ended before the kill's ssh round trip)
    load = Load(URL, clients=8, tokens=256, seconds=120, max_requests=3000, streams_only=True,
                body={"n_probs": 100}).start()
    victim, deadline = None, time.time() + 30
    while victim is None and time.time() < deadline:  # an instance serving a stream right now
        open_now = {k: int(v["scur"]) for k, v in gateway_stat(gw).items() if int(v["scur"])}
        victim = max(open_now, key=open_now.get) if open_now else None
    assert victim, "no instance had a request open under the load"
    h, i, pid = every[victim]
    killed_at = time.time()  # the kill lands somewhere between this and kill_done (an ssh round trip)
    ssh(h, f"kill -9 {pid}")
    kill_done = time.time()
    seen_down = False
    deadline = time.time() + 90
    while time.time() < deadline:
        st = gateway_stat(gw)[victim]["status"]
        seen_down |= st.startswith("DOWN")
        if seen_down and st == "UP" and main_pid(h, i) not in (0, pid):
            break
        time.sleep(0.3)
    # a request begun after the kill has ended (on a busy 2-core machine every client can still be in a stream
    # begun before it), so that "every later one was served" has one to check
    deadline = time.time() + 60
    while time.time() < deadline and not any(r["start"] > killed_at + 0.5 for r in list(load.results)):
        time.sleep(0.5)
    time.sleep(2)
    s = load.stop()
    results = list(load.results)
    assert seen_down, "HAProxy never took the killed instance out of rotation"
    assert gateway_stat(gw)[victim]["status"] == "UP" and main_pid(h, i) not in (0, pid)
    cut = [r for r in results if r["outcome"] == "cut"]
    print(f"\nkill -9 of {victim} under load: {json.dumps(s)}")
    (REPO / "reports").mkdir(exist_ok=True)
    (REPO / "reports" / "kill-9-under-load.json").write_text(json.dumps({**s, "killed": victim}) + "\n")
    # the streams the crash broke are counted as cut, each one begun before the kill and ended by it
    assert s["cut"] >= 1 and all(r["stream"] and r["start"] < kill_done and r["end"] > killed_at for r in cut), s
    # nothing else failed: requests in flight without a response yet, and every later one, were served
    assert s["failed"] == 0 and s["busy"] == 0 and s["served"] == s["requests"] - s["cut"], s
    assert any(r["start"] > killed_at + 0.5 for r in results)


def test_an_invalid_configuration_leaves_the_running_gateway_untouched(gw, tmp_path):
    before_cfg = ssh(gw, "cat /etc/haproxy/haproxy.cfg")
    pid = ssh(gw, "systemctl show -P MainPID haproxy")
    bad = {"gateway_bind": "10.231.0.10:99999"}  # on the pair's address (both gateways agree), a port HAProxy refuses
    run = deploy(host_vars={g["name"]: bad for g in lab()["gateways"]}, tmp=tmp_path)
    assert run.rc != 0
    assert "the new HAProxy configuration is invalid; the running gateway is untouched" in run.out
    assert ssh(gw, "cat /etc/haproxy/haproxy.cfg") == before_cfg
    assert ssh(gw, "systemctl show -P MainPID haproxy") == pid
    assert ssh(gw, f"curl -s -o /dev/null -w '%{{http_code}}' {URL}/health") == "200"
    assert deploy().rc == 0
