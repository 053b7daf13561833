"""llama-server units on the real lab fleet: restarts, API key, hardening, flag checks.
Each test starts from a converged fleet (the `converged` fixture)."""
import re
import time

import pytest

from tests.lab.helpers import SERVER_HOST, deploy, lab, main_pid, ssh, th

KEY = "vf-test-key-6c1b0e9f2a"


@pytest.fixture
def hosts(converged):
    return converged


def health(h, i=0):
    return ssh(h, f"curl -s -o /dev/null -w '%{{http_code}}' http://{SERVER_HOST}:{h['server_port_base'] + i}/health",
               check=False)


def test_kill_9_is_followed_by_a_restart_and_health(hosts):
    h = hosts[0]
    pid = main_pid(h, 0)
    restarts = int(ssh(h, "systemctl show -P NRestarts llama-server@0.service"))
    ssh(h, f"kill -9 {pid}")
    deadline = time.time() + 60
    while time.time() < deadline:
        if ssh(h, "systemctl is-active llama-server@0.service", check=False) == "active" \
                and main_pid(h, 0) not in (0, pid):
            break
        time.sleep(1)
    assert int(ssh(h, "systemctl show -P NRestarts llama-server@0.service")) == restarts + 1
    assert main_pid(h, 0) not in (0, pid)
    assert health(h) == "200"


def test_runs_as_an_unprivileged_user_without_a_shell(hosts):
    h = hosts[0]
    assert ssh(h, f"ps -o user= -p {main_pid(h, 0)}") == "llama"
    user = th(h).user("llama")
    assert user.shell == "/usr/sbin/nologin" and user.home == "/nonexistent"
    assert not th(h).file("/nonexistent").exists  # no home is made for it
    assert ssh(h, "grep -c '^CapEff:\\s*0*$' /proc/%d/status" % main_pid(h, 0)) == "1"


def test_every_server_runs_with_malloc_kept_to_its_heap(hosts):
    """server_malloc_heap (the V100 groups', the lab's): each instance's env file carries glibc's heap tunables and
    its running server got them. glibc 2.36 parses the variable in place, so /proc's copy of the server's
    environment may show it cut at the ':' (tests/unit/test_ckpt_copy.py checks that both tunables act)."""
    whole = "GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"
    for h in hosts:
        for i in (0, 1):
            env = ssh(h, f"cat /etc/voltafleet/llama-server/{i}.env").splitlines()
            assert whole in env, env
            got = ssh(h, f"tr '\\0' '\\n' < /proc/{main_pid(h, i)}/environ").splitlines()
            assert whole in got or ("GLIBC_TUNABLES=glibc.malloc.mmap_max=0" in got
                                    and "glibc.malloc.trim_threshold=68719476736" in got), got


def test_hardening_exposure_is_at_most_5(hosts):
    out = ssh(hosts[0], "systemd-analyze security --no-pager llama-server@0.service")
    level = float(re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out).group(1))
    print(f"\nsystemd-analyze security llama-server@0.service: exposure {level}")
    assert level <= 5.0


def test_one_host_flag_change_restarts_exactly_its_instances(hosts, tmp_path):
    a, b = hosts[0], hosts[1]
    before = {(h["name"], i): main_pid(h, i) for h in (a, b) for i in (0, 1)}
    run = deploy(host_vars={b["name"]: {"server_ctx_checkpoints": 16}}, tmp=tmp_path)
    assert run.rc == 0, run
    assert "--ctx-checkpoints 16" in ssh(b, "cat /etc/voltafleet/llama-server/0.env")
    assert main_pid(a, 0) == before[(a["name"], 0)] and main_pid(a, 1) == before[(a["name"], 1)]
    assert main_pid(b, 0) != before[(b["name"], 0)] and main_pid(b, 1) != before[(b["name"], 1)]
    assert "--ctx-checkpoints 16" in ssh(b, f"tr '\\0' ' ' < /proc/{main_pid(b, 0)}/cmdline")


def test_retiring_one_instance_leaves_the_other_running(hosts, tmp_path):
    b = hosts[1]
    pid0 = main_pid(b, 0)
    run = deploy(host_vars={b["name"]: {"server_instances": 1}}, tmp=tmp_path)
    assert run.rc == 0, run
    assert main_pid(b, 0) == pid0
    assert ssh(b, "systemctl is-active llama-server@1.service", check=False) == "inactive"
    assert ssh(b, "ls /etc/voltafleet/llama-server/") == "0.env"


def test_unknown_flag_is_refused_and_the_old_server_keeps_serving(hosts, tmp_path):
    """The build-time check against the new binary's --help: on a ref whose --help
    voltafleet does not ship (lab-next), a stale flag passes the load-time check and is
    refused here. (For the pinned commit it is refused at load: tests/lab/test_inputs.py.)"""
    h = hosts[0]
    pid, env = main_pid(h, 0), ssh(h, "cat /etc/voltafleet/llama-server/0.env")
    run = deploy({"server_extra_flags": ["--draft-max 4"], "llama_cpp_ref": lab()["llama_cpp_next_ref"]}, tmp_path)
    assert run.rc != 0
    assert "llama-server flags refused, nothing restarted" in run.out
    assert "--draft-max: the pinned llama-server says: the argument has been removed. use --spec-draft-n-max" in run.out
    assert main_pid(h, 0) == pid and ssh(h, "cat /etc/voltafleet/llama-server/0.env") == env
    assert health(h) == "200"


def test_api_key_is_a_file_never_argv_unit_or_env(hosts, tmp_path):
    keyfile = tmp_path / "api-key"
    keyfile.write_text(KEY + "\n")
    keyfile.chmod(0o600)  # a key file others can read is refused at load
    run = deploy({"server_api_key_file": str(keyfile)}, tmp_path)
    assert run.rc == 0, run
    assert "smoke PASSED" in run.out  # the smoke client authenticates with the key file
    h = hosts[0]
    port = h["server_port_base"]
    assert ssh(h, "stat -c '%a %U' /etc/voltafleet/api-key") == "600 llama"
    assert KEY not in ssh(h, "ps -eo args")
    assert KEY not in ssh(h, "cat /etc/systemd/system/llama-server@.service /etc/voltafleet/llama-server/*.env")
    assert KEY not in ssh(h, "journalctl -u 'llama-server@*' --no-pager -o cat")
    assert KEY not in run.out
    body = "-d '{\"prompt\":\"hi\",\"n_predict\":2}'"
    assert ssh(h, f"curl -s -o /dev/null -w '%{{http_code}}' http://{SERVER_HOST}:{port}/completion {body}") == "401"
    assert ssh(h, f"curl -s -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer {KEY}' "
                  f"http://{SERVER_HOST}:{port}/completion {body}") == "200"


def test_fleet_converges_back(hosts):
    run = deploy()
    assert run.rc == 0, run
    for h in hosts:
        assert ssh(h, "systemctl is-active llama-server@0.service llama-server@1.service").split() == ["active"] * 2
    again = deploy()
    assert again.rc == 0 and again.changed == 0, again


def test_offload_line_is_read_from_a_units_journal(hosts):
    """CPU builds print no offload line, so a transient unit writes one to the real journal
    and the smoke client (as installed on the host) must find it."""
    h = hosts[0]
    ssh(h, "systemd-run --quiet --unit=vf-offload-probe --wait --collect "
           "/bin/echo 'load_tensors: offloaded 65/65 layers to GPU'")
    out = ssh(h, "python3 -c \"from importlib.machinery import SourceFileLoader as L; "
                 "m = L('smoke', '/opt/voltafleet/bin/voltafleet-smoke').load_module(); "
                 "print(m.offload_from_journal('vf-offload-probe.service'))\"")
    assert out == "{'offloaded': 65, 'total': 65}"
