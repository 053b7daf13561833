"""Inputs that cannot hurt, on the real lab fleet (issue 13): a canary command embedded in
a value never runs, neither on a lab host nor on the controller; the value is refused when
the inventory loads (exit code 2, one block naming file, key and fix) and the servers keep
serving. Runs on the converged fleet test_rollout.py leaves."""
import os
import subprocess
from pathlib import Path

import pytest

from tests.lab.helpers import PYINFRA, REPO, Run, deploy, lab, pids, ssh

CANARY = "/tmp/vf-canary"
TOUCH = f"touch {CANARY}"


@pytest.fixture(scope="module")
def hosts():
    return lab()["hosts"]


@pytest.fixture(autouse=True)
def clean_canary(hosts):
    Path(CANARY).unlink(missing_ok=True)
    for h in hosts:
        ssh(h, f"rm -f {CANARY}")
    yield


def assert_no_canary(hosts):
    assert not Path(CANARY).exists(), "the canary ran on the controller"
    for h in hosts:
        assert ssh(h, f"test -e {CANARY} && echo ran || echo absent") == "absent", f"the canary ran on {h['name']}"


def mirror_url(name: str) -> str:
    return lab()["model_url"].rsplit("/", 1)[0] + "/" + name


@pytest.mark.parametrize("key, value", [
    ("model_url", "MIRROR/$(touch /tmp/vf-canary).gguf"),
    ("model_url", "MIRROR/`touch /tmp/vf-canary`.gguf"),
    ("model_draft_url", "MIRROR/x.gguf;touch /tmp/vf-canary"),
    ("llama_cpp_repo", f"--upload-pack={TOUCH}"),
    ("llama_cpp_ref", f"--upload-pack={TOUCH}"),
    ("server_extra_flags", [f"--alias $({TOUCH})"]),
    ("server_extra_flags", ["--alias", f"`{TOUCH}`"]),
    ("server_host", f"127.0.0.1;{TOUCH}"),
    ("model_dir", f"/var/lib/voltafleet/$({TOUCH})"),
])
def test_a_canary_in_a_value_is_refused_at_load_and_never_runs(hosts, tmp_path, key, value):
    if isinstance(value, str) and value.startswith("MIRROR/"):
        value = mirror_url(value[len("MIRROR/"):])
    before = pids(hosts)
    run = deploy({key: value}, tmp_path)
    assert run.rc == 2, run
    assert "configuration refused, no host was touched" in run.out
    assert f"voltafleet-test-vars.yml (VOLTAFLEET_VARS): {key}:" in run.out and "\n  Fix: " in run.out
    assert "Traceback" not in run.out
    assert_no_canary(hosts)
    assert pids(hosts) == before


def test_a_group_readable_key_file_is_refused_at_load(hosts, tmp_path):
    key = tmp_path / "api-key"
    key.write_text("vf-test-key\n")
    key.chmod(0o640)
    run = deploy({"server_api_key_file": str(key)}, tmp_path)
    assert run.rc == 2, run
    assert f"server_api_key_file: {key} is open to its group (mode 640)" in run.out
    assert f"Fix: chmod 600 {key}." in run.out


def test_protected_flag_is_refused_at_load(hosts, tmp_path):
    before = pids(hosts)
    run = deploy({"server_extra_flags": ["--port 9000"]}, tmp_path)
    assert run.rc == 2, run
    assert "server_extra_flags: --port is set by voltafleet from server_port_base" in run.out
    assert pids(hosts) == before


def data_run(*data: str) -> Run:
    """The lab rollout with pyinfra's own `--data key=value` overrides."""
    env = {k: v for k, v in os.environ.items() if k not in ("VOLTAFLEET_VARS", "VOLTAFLEET_LAB_HOST_VARS")}
    args = [PYINFRA, "-y"] + [a for d in data for a in ("--data", d)] + ["inventory/lab.py", "deploy.py"]
    return Run(subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=3000))


@pytest.mark.parametrize("data, text", [
    ("server_port_base=70000", "pyinfra --data: server_port_base: is 70000, above the maximum 65535"),
    ("server_flash_attn=off", "pyinfra --data: server_flash_attn: is off, but server_cache_type_v"),
    (f"model_url=MIRROR/$({TOUCH}).gguf", "pyinfra --data: model_url: is"),
    (f"server_extra_flags=[\"--alias $({TOUCH})\"]", "pyinfra --data: server_extra_flags: has the item"),
])
def test_pyinfra_data_overrides_get_the_same_checks(hosts, data, text):
    """Needs roles/run.config() to call validate_values (issue 13 wiring)."""
    if "MIRROR/" in data:
        data = data.replace("MIRROR/", mirror_url(""))
    before = pids(hosts)
    run = data_run(data)
    assert run.rc != 0, run
    assert text in run.out and "\n  Fix: " in run.out, run
    assert "Traceback" not in run.out
    assert_no_canary(hosts)
    assert pids(hosts) == before
