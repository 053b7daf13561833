"""A rollout never reports a false pass (issue 17), on the real lab fleet: a server that
does not start is rolled back; an unreachable gateway stops a batch before any restart; a
new model under the same file name is rolled back to the old one; one rollout at a time;
a --limit run keeps every host's backends; each host's verdict is its own record."""
import hashlib
import http.server
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from lab import qwen35gen
from tests.lab.helpers import PYINFRA, REPO, SERVER_HOST, deploy, env_file, lab, pids, rollout, run_env, ssh
from voltafleet.state.lock import FleetLock

MODELS = "/var/lib/voltafleet/models"


def serves(h, i=0) -> bool:
    """The instance answers a real completion (not only /health)."""
    out = ssh(h, f"curl -s -m 30 http://{SERVER_HOST}:{h['server_port_base'] + i}/completion "
                 "-d '{\"prompt\":\"hi\",\"n_predict\":4}'", check=False)
    return '"tokens_predicted":4' in out


def test_a_server_that_does_not_start_is_rolled_back_with_its_own_error(three, tmp_path):
    canary, others = three[0], three[1:]
    before = {i: env_file(canary, i) for i in (0, 1)}
    others_pids = pids(others)
    run, report = rollout(["--batch", "1"], vars={"server_extra_flags": ["--rope-scaling", "bogus"]}, tmp=tmp_path)
    assert run.rc == 1, run
    first = report["hosts"][0]
    assert first["host"] == canary["name"] and first["status"] == "rolled_back", run
    assert "llama-server@0 did not start" in first["detail"] and "rolled back" in first["detail"]
    assert "bogus" in first["detail"] or "rope" in first["detail"].lower(), first["detail"]  # the server's own line
    assert "Traceback" not in first["detail"] and "Unexpected error in Python callback" not in run.out
    assert {i: env_file(canary, i) for i in (0, 1)} == before      # both instances' flags are the old ones
    for i in (0, 1):
        assert ssh(canary, f"systemctl is-active llama-server@{i}.service") == "active" and serves(canary, i)
    assert [h["status"] for h in report["hosts"][1:]] == ["not_run", "not_run"] and pids(others) == others_pids


def test_an_unreachable_gateway_stops_the_rollout_before_any_restart(three, tmp_path):
    gw = lab()["gateway"]
    before, envs = pids(three), {h["name"]: env_file(h) for h in three}
    cut_off = {gw["name"]: {"ssh_port": 1}}  # the controller cannot reach the gateway
    change = {"server_ctx_checkpoints": 16}  # restarts every instance; costs no CPU (the lab has two cores)
    run, report = rollout(["--batch", "1"], vars=change, host_vars=cut_off, tmp=tmp_path)
    assert run.rc == 2, run
    assert pids(three) == before and {h["name"]: env_file(h) for h in three} == envs
    # a plain deploy with the gateway out of reach refuses the same way
    run = deploy(change, tmp_path, host_vars=cut_off)
    assert run.rc != 0 and "is not reachable in this run" in run.out and "--no-gateway" in run.out
    assert pids(three) == before
    # said explicitly, the rollout goes on without draining
    run, report = rollout(["--batch", "2", "--no-gateway"], vars=change, host_vars=cut_off, tmp=tmp_path)
    assert run.rc == 0 and report["ok"], run
    assert all("--ctx-checkpoints 16" in env_file(h) for h in three) and pids(three) != before
    assert deploy().rc == 0


class SameName(http.server.BaseHTTPRequestHandler):
    """Serves another model's bytes under the lab model's file name, with Range (resume). The other model is
    the lab's own with another name in its metadata (another file, another sha256, 12 MB: not the 253 MB gemma,
    which cost 15 s more and nothing this test needs)."""
    data: bytes = b""

    def do_GET(self):
        start = int(self.headers.get("Range", "bytes=0-").split("=")[1].split("-")[0] or 0)
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(self.data) - start))
        self.end_headers()
        self.wfile.write(self.data[start:])

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.data)))
        self.end_headers()

    def log_message(self, *a):
        pass


def test_a_new_model_under_the_same_file_name_is_rolled_back_to_the_old_one(three, tmp_path):
    st, h = lab(), three[0]
    name = Path(st["model_url"]).name
    ours, tiny = (Path(st["mirror_root"]) / "models" / name).read_bytes(), qwen35gen.TINY_NAME.encode()
    assert ours.count(tiny) == 1  # general.name's value
    SameName.data = ours.replace(tiny, tiny.upper())  # same length: the file stays a valid GGUF
    other_sha = hashlib.sha256(SameName.data).hexdigest()
    assert other_sha != st["model_sha256"]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 18902), SameName)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    old_model = ssh(h, "sed -n 's/.*-m \\([^ ]*\\).*/\\1/p' /etc/voltafleet/llama-server/0.env")
    try:
        run, report = rollout(["--batch", "1"], tmp=tmp_path,
                              vars={"model_url": f"http://127.0.0.1:18902/models/{name}", "model_sha256": other_sha,
                                    "smoke_probe": False, "smoke_min_single_tps": 1000000})
    finally:
        server.shutdown()
    assert run.rc == 1 and report["hosts"][0]["status"] == "rolled_back", run
    assert old_model.endswith("/" + name) and old_model in env_file(h)          # the old file serves again
    new = f"{MODELS}/{other_sha[:16]}/{name}"
    assert ssh(h, f"test -f {new} && echo kept") == "kept"                      # both kept, by content
    assert ssh(h, f"sha256sum {old_model} | cut -d' ' -f1") == st["model_sha256"]
    assert serves(h, 0) and serves(h, 1)
    assert deploy().rc == 0


def test_a_second_rollout_refuses_at_once_naming_the_holder(three, tmp_path):
    names = [h["name"] for h in lab()["hosts"]] + [g["name"] for g in lab().get("gateways") or []]
    path = FleetLock.for_hosts(names, "x").path
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, %r)\n"
        "from voltafleet.state.lock import FleetLock\n"
        "FleetLock(%r, 'python -m rollout inventory/lab.py (test holder)').acquire(); print('held', flush=True)\n"
        "time.sleep(120)") % (str(REPO), str(path))], stdout=subprocess.PIPE, text=True)
    before = pids(three)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        run, report = rollout(["--batch", "2"], vars={"server_ctx_checkpoints": 16}, tmp=tmp_path)
        assert run.rc == 2 and f"pid {holder.pid}" in run.out and "test holder" in run.out and "since" in run.out
        assert time.monotonic() - t0 < 60 and report == {}
        run = deploy({"server_ctx_checkpoints": 16}, tmp_path)  # a plain deploy of the same fleet too
        assert run.rc != 0 and "holds the fleet lock" in run.out
        assert pids(three) == before
    finally:
        holder.kill()
        holder.wait()
    run, report = rollout(["--batch", "2"], tmp=tmp_path)  # its process is gone: a stale lock, taken over
    assert run.rc == 0 and "taking over a stale fleet lock" in run.out, run


def test_a_limited_run_keeps_every_hosts_backends_on_the_gateway(three, tmp_path):
    want = sorted(f"{h['name']}-{i}" for h in lab()["hosts"] for i in (0, 1))
    e = run_env(None, None, tmp_path)
    proc = subprocess.run([PYINFRA, "-y", "--limit", three[0]["name"], "--limit", "gateway", "inventory/lab.py",
                           "deploy.py"], cwd=REPO, env=e, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    for gw in lab()["gateways"]:  # both gateways of the pair (a run must reach every one: drains)
        listed = sorted(line.split()[1] for line in ssh(gw, "grep -E '^ +server ' /etc/haproxy/haproxy.cfg").splitlines())
        assert listed == want, gw["name"]


def test_every_host_is_judged_on_its_own_record_of_the_run(three, tmp_path):
    """A converged fleet rolls without a change or a restart; every host passes on its own
    record; the table and the JSON report agree; the fleet plan and the textfile metrics."""
    before = pids(three)
    run, report = rollout(["--batch", "2"])
    assert run.rc == 0 and report["ok"], run
    assert [h["status"] for h in report["hosts"]] == ["passed"] * 3 and pids(three) == before
    # every pyinfra run of the rollout (preflight, gateway, each batch) changed nothing: its log says so, and
    # the screen's one line per host and step says ok, never changed
    run_dir = REPO / "reports" / f"rollout-{report['rollout']}"
    logs = "".join((run_dir / f).read_text() for f in ("preflight.log", "gateway.log", "batch-0.log", "batch-1.log"))
    totals = re.findall(r"Grand total\s+\S+\s+(\S+)", logs)
    assert len(totals) == 4 and set(totals) == {"-"}, logs
    steps = [line.split() for line in run.out.splitlines() if re.match(r"  (canary|batch \d|gateway) ", line)]
    assert steps and {w[-3] for w in steps} == {"ok"}, run
    assert report["batches"] == [[three[0]["name"]], [h["name"] for h in three[1:]]]
    # the printed table and the JSON report agree, row by row
    table = run.out[run.out.index("host             batch"):].splitlines()[1:4]
    for row, h in zip(table, report["hosts"]):
        assert row.split()[:4] == [h["host"], str(h["batch"]), h["status"], h["fingerprint"] or "-"]
    run_dir = REPO / "reports" / f"rollout-{report['rollout']}"
    for h in report["hosts"]:
        rec = json.loads((run_dir / f"outcome-{h['host']}.json").read_text())
        assert rec["status"] == h["status"] == "passed" and rec["rollout"] == report["rollout"]
        assert rec["probe"] == h["probe"] == "match"   # converged hosts are probed against the golden probe
    plan = json.loads((run_dir / "fleet-plan.json").read_text())
    assert set(plan["commits"].values()) == {lab()["llama_cpp_ref"]}
    assert [s["host"] for s in plan["servers"]] == [h["name"] for h in lab()["hosts"]]
    prom = (REPO / "reports" / "voltafleet-rollout.prom").read_text()
    assert f'voltafleet_rollout_passed{{rollout="{report["rollout"]}",inventory="inventory/lab.py"}} 1' in prom
    assert f'status="passed"}} {len(report["hosts"])}' in prom
