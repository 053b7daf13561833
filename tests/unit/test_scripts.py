"""The helper scripts the roles run on hosts: shellcheck-clean, and the atomic helper
really never leaves a half-switched link or directory."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from roles.helpers import scripts

REPO = Path(__file__).resolve().parents[2]
SHELLCHECK = str(Path(sys.executable).with_name("shellcheck"))
SHELL_SCRIPTS = sorted(p for p in scripts().values() if p.suffix == ".sh")
ATOMIC = REPO / "roles/helpers/files/vf-atomic.sh"


def test_every_role_script_is_installed():
    names = set(scripts())
    assert {"vf-atomic", "vf-build-release", "vf-release", "vf-fetch-model", "vf-good", "voltafleet-smoke",
            "vf-memory-textfile"} <= names


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_shellcheck_clean(script):
    r = subprocess.run([SHELLCHECK, "-x", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_atomic_link_switches_in_one_rename(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    link = tmp_path / "current"
    subprocess.run(["bash", ATOMIC, "link", str(link), "a"], check=True)
    assert os.readlink(link) == "a"
    subprocess.run(["bash", ATOMIC, "link", str(link), "b"], check=True)
    assert os.readlink(link) == "b" and not (tmp_path / "current.tmp").exists()


def test_atomic_dir_replaces_a_snapshot_whole(tmp_path):
    src, dest = tmp_path / "env", tmp_path / "good"
    src.mkdir()
    (src / "0.env").write_text("A=1\n")
    dest.mkdir()
    (dest / "stale.env").write_text("old\n")
    subprocess.run(["bash", ATOMIC, "dir", str(src), str(dest)], check=True)
    assert sorted(p.name for p in dest.iterdir()) == ["0.env"]
    assert not (tmp_path / "good.tmp").exists() and not (tmp_path / "good.old").exists()


def test_atomic_refuses_bad_usage(tmp_path):
    r = subprocess.run(["bash", ATOMIC, "link", str(tmp_path / "x")], capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stderr


def test_a_failed_fetch_returns_at_once_and_leaves_nothing_holding_its_output(tmp_path):
    """The progress ticker's sleep must not keep the caller's pipe open: a fetch that fails in
    a second used to hold pyinfra (and every test) for the ticker's 30 s sleep."""
    import http.server
    import threading
    import time

    class Slow404(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            time.sleep(0.5)  # the ticker has started its sleep by now
            self.send_error(404)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow404)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/m.gguf"
        # capture_output waits for every holder of stdout/stderr to close them
        r = subprocess.run(["bash", str(REPO / "roles/model/files/vf-fetch-model.sh"), url,
                            str(tmp_path / "m.gguf"), "a" * 64], capture_output=True, text=True, timeout=15)
    finally:
        server.shutdown()
    assert r.returncode == 1 and "failed (curl exit 22)" in r.stderr and "untouched" in r.stderr
