"""The model mirror role (roles/mirror) on pyinfra's fake connector and in process: Debian's
nginx with the slice module, the configuration checked by `nginx -t` before it goes live
(an invalid one is put back), idempotent; server hosts fetch the model through the mirror
picked for them, with the same checksum."""
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

from pyinfra.facts.files import Sha1File

from roles import facts as F
from roles.mirror import LIVE, STAGED, install_command, installed
from tests.ops.fakes import FakeHost, FakeOp, commands
from tests.ops.test_toolchain import APT_INSTALL, host
from voltafleet.models import mirror

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
CMD = re.compile(r"\[fake\] simulating (command|put_file) on ([^:]+): (.*)")
URL = "http://127.0.0.1:9/models/Qwen3.6-27B-Q4_K_S.gguf"  # tests/ops/inventory.py's model_url
SHA = "a" * 64


def mirror_host(name, address, extra=()):
    return {"name": name, "responses": [*extra, ["^nameserver", "nameserver 10.0.0.53"]],
            "vars": {"mirror_address": address}}


def run_groups(groups):
    """pyinfra --debug on tests/ops/mirror_deploy.py: (rc, {host: [commands and uploads]}, output)."""
    proc = subprocess.run([PYINFRA, "--debug", "-y", "tests/ops/inventory.py", "tests/ops/mirror_deploy.py"],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "VOLTAFLEET_FAKE": json.dumps({"groups": groups})})
    out = proc.stdout + proc.stderr
    cmds: dict = {}
    for m in CMD.finditer(out):
        cmds.setdefault(m.group(2), []).append(m.group(3) if m.group(1) == "command" else "put " + m.group(3))
    return proc.returncode, cmds, out


def test_mirrors_get_nginx_and_server_hosts_fetch_through_them():
    servers = [host(f"gpu-{i}", extra=[["vf-fetch-model", ""]]) for i in range(4)]
    rc, cmds, out = run_groups({"mirror": [mirror_host("mirror-1", "10.0.0.5"), mirror_host("mirror-2", "10.0.0.6")],
                                "v100_16gb": servers})
    assert rc == 0, out[-3000:]
    for name in ("@fake/mirror-1", "@fake/mirror-2"):
        m = cmds[name]
        assert APT_INSTALL + "--no-install-recommends nginx ca-certificates" in m
        assert f"put {STAGED}" in m  # the template, staged
        install = next(i for i, c in enumerate(m) if c == install_command(STAGED, LIVE))
        assert install > m.index(f"put {STAGED}")
        assert "systemctl enable nginx.service" in m
        assert not [c for c in m if "vf-fetch-model" in c or "llama" in c]  # a mirror serves no model
    picked = set()
    for i in range(4):
        fetch = [c for c in cmds[f"@fake/gpu-{i}"] if c.startswith("/opt/voltafleet/bin/vf-fetch-model ")]
        assert len(fetch) == 1, cmds[f"@fake/gpu-{i}"]
        url = fetch[0].split()[1]
        m = mirror.pick(f"@fake/gpu-{i}", [mirror.Mirror("@fake/mirror-1", "10.0.0.5", 8880, "http://127.0.0.1:9"),
                                           mirror.Mirror("@fake/mirror-2", "10.0.0.6", 8880, "http://127.0.0.1:9")])
        assert url == f"http://{m.address}:8880/models/Qwen3.6-27B-Q4_K_S.gguf"
        assert fetch[0].endswith(" " + SHA)  # the same checksum, verified on the server host
        picked.add(url)
    assert len(picked) == 2  # the hosts spread over both mirrors (rendezvous hash of their names)
    assert not [c for h in range(4) for c in cmds[f"@fake/gpu-{h}"] if "nginx" in c]


def test_without_a_mirror_group_server_hosts_fetch_the_model_url():
    rc, cmds, out = run_groups({"v100_16gb": [host("gpu-0", extra=[["vf-fetch-model", ""]])]})
    assert rc == 0, out[-3000:]
    fetch = [c for c in cmds["@fake/gpu-0"] if c.startswith("/opt/voltafleet/bin/vf-fetch-model ")]
    assert fetch == [f"/opt/voltafleet/bin/vf-fetch-model {URL} /var/lib/voltafleet/models/aaaaaaaaaaaaaaaa/"
                     f"Qwen3.6-27B-Q4_K_S.gguf {SHA}"]


def test_the_configuration_is_installed_only_when_it_changed():
    same = FakeHost({Sha1File: {(("path", LIVE),): "1" * 40, (("path", STAGED),): "1" * 40}})
    assert commands(installed, same, STAGED, LIVE, staged_op=FakeOp(False), site_op=FakeOp(False)) == []
    assert commands(installed, same, STAGED, LIVE, staged_op=FakeOp(True)) == [install_command(STAGED, LIVE)]
    assert commands(installed, same, STAGED, LIVE, staged_op=FakeOp(False), site_op=FakeOp(True)) == [
        install_command(STAGED, LIVE)]  # Debian's default site went: reload, port 80 closes
    other = FakeHost({Sha1File: {(("path", LIVE),): "2" * 40, (("path", STAGED),): "1" * 40}})
    assert commands(installed, other, STAGED, LIVE, staged_op=FakeOp(False)) == [install_command(STAGED, LIVE)]


def test_nameservers_fact():
    assert F.Nameservers().process(["nameserver 10.0.0.53", "nameserver fd00::53", "nameserver fe80::1%eth0",
                                    "search x"]) == ["10.0.0.53", "[fd00::53]"]


def _fake_bin(tmp_path, nginx_ok: bool) -> dict:
    """`nginx` and `systemctl` stand-ins that log their calls: nginx -t fails when told to."""
    b = tmp_path / "bin"
    b.mkdir(exist_ok=True)
    log = tmp_path / "calls.log"
    (b / "nginx").write_text(f"#!/bin/sh\necho nginx \"$@\" >> {log}\n"
                             + ("exit 0\n" if nginx_ok else "echo 'unknown directive \"slice\"' >&2; exit 1\n"))
    (b / "systemctl").write_text(f"#!/bin/sh\necho systemctl \"$@\" >> {log}\n")
    for f in b.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{b}:{os.environ['PATH']}"}


def test_install_command_keeps_a_checked_configuration_and_reloads(tmp_path):
    staged, live = tmp_path / "staged.conf", tmp_path / "conf.d" / "mirror.conf"
    live.parent.mkdir()
    staged.write_text("new\n")
    live.write_text("old\n")
    r = subprocess.run(["bash", "-c", install_command(str(staged), str(live))], env=_fake_bin(tmp_path, True),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert live.read_text() == "new\n" and sorted(p.name for p in live.parent.iterdir()) == ["mirror.conf"]
    assert (tmp_path / "calls.log").read_text() == "nginx -t\nsystemctl reload-or-restart nginx\n"


def test_an_invalid_configuration_is_put_back_and_nothing_reloads(tmp_path):
    staged, live = tmp_path / "staged.conf", tmp_path / "conf.d" / "mirror.conf"
    live.parent.mkdir()
    staged.write_text("slice 16m;\n")
    live.write_text("old\n")
    r = subprocess.run(["bash", "-c", install_command(str(staged), str(live))], env=_fake_bin(tmp_path, False),
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "the new mirror configuration is invalid; the running mirror is untouched" in r.stderr
    assert 'unknown directive "slice"' in r.stderr
    assert live.read_text() == "old\n" and sorted(p.name for p in live.parent.iterdir()) == ["mirror.conf"]
    assert "systemctl" not in (tmp_path / "calls.log").read_text()
    live.unlink()  # a first install that fails leaves no configuration behind
    r = subprocess.run(["bash", "-c", install_command(str(staged), str(live))], env=_fake_bin(tmp_path, False),
                       capture_output=True, text=True)
    assert r.returncode == 1 and not list(live.parent.iterdir())


def test_a_plain_run_configures_the_mirror_before_any_server_host_fetches(tmp_path):
    """deploy.py itself on a lab-like fleet (a host both mirror and gateway, a CPU server): pyinfra
    runs each operation on every host before the next, and the mirror's steps come before the
    server host's fetch (the smoke test fails here: no llama-server answers the fake connector)."""
    both = mirror_host("gw", "10.0.0.9")
    proc = subprocess.run(
        [PYINFRA, "--debug", "-y", "tests/ops/inventory.py", "deploy.py"], cwd=REPO, capture_output=True, text=True,
        timeout=300, env={**os.environ, "VOLTAFLEET_REPORT_DIR": str(tmp_path), "VOLTAFLEET_FAKE": json.dumps({"groups": {
            "mirror": [both], "gateway": [both],
            # per_host: the fake connector's get_file brings no release archive back to ship
            "lab": [host("srv-1", os_id="debian-12", extra=[["vf-fetch-model", ""], ["uname -s", "Linux"]],
                         vars={"llama_cpp_build_strategy": "per_host"})]}})})
    out = proc.stdout + proc.stderr
    ops = [line[len("--> Starting operation: "):].strip() for line in out.splitlines()
           if line.startswith("--> Starting operation: ")]
    fetch = next(i for i, op in enumerate(ops) if op.startswith("Model | Fetch and verify"))
    assert ops[fetch].endswith("(through 10.0.0.9:8880)"), ops[fetch]
    assert ops.index("Mirror | nginx running and enabled") < fetch
    assert ops.index("Gateway | HAProxy running and enabled") < fetch
    assert "/opt/voltafleet/bin/vf-fetch-model http://10.0.0.9:8880/models/Qwen3.6-27B-Q4_K_S.gguf " in out
    assert "simulating command on @fake/gw: /opt/voltafleet" not in out  # neither a build nor a model there
