"""The build and the model download leave typed records on the controller (build-<host>.json,
fetch-<host>.json: voltafleet.state.records.Build and Fetch), read from what the host's scripts kept
(vf-build-release's build/<fp>.seconds, vf-fetch-model's <dest>.fetched), never from the text
they print: voltafleet/state/calibrate.py reads these records only."""
import shutil
import subprocess
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import roles.llama_cpp as lc
import roles.model as model_role
from voltafleet.planning.hostplan import HostFacts, make_plan
from voltafleet.state.records import Build, Download, Fetch
from voltafleet.state.runctx import RunContext, RunDir

REPO = Path(__file__).resolve().parents[2]
COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


class Out:
    def __init__(self, stdout=""):
        self.stdout, self.stderr = stdout, ""


class Host:
    """A host answering each command from a script: {command substring: stdout}."""

    def __init__(self, answers, name="gpu-01"):
        self.name, self.data, self.answers, self.sent = name, {}, answers, []

    def run_shell_command(self, command, **kw):
        self.sent.append(command)
        return True, Out(next((v for k, v in self.answers.items() if k in command), ""))


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    for mod in (lc, model_role):
        monkeypatch.setattr(mod, "run_context", lambda: RunContext(run="r1"))
        monkeypatch.setattr(mod, "report_dir", lambda cfg: tmp_path)
    monkeypatch.setattr(model_role, "config", lambda: {})
    return RunDir(tmp_path)


@pytest.fixture
def plan(cfg):
    cfg = cfg.replace(voltafleet_backend="cpu", server_instances=1, llama_cpp_targets=["llama-server"])
    return make_plan("gpu-01", cfg, HostFacts(os="debian-12", systemd=252), None, COMMIT)


def test_a_compile_records_its_release_and_the_seconds_its_script_kept(run_dir, plan):
    h = Host({"build/fp1.seconds": "228\n"})
    assert lc._built(None, h, plan, "fp1")
    assert h.sent == [f"cat -- {plan.root}/build/fp1.seconds"]
    assert run_dir.read(Build, "gpu-01", "r1") == Build(host="gpu-01", run="r1", fingerprint="fp1", built=True,
                                                        seconds=228.0)
    assert lc._built(None, Host({}), plan, "fp2")  # no figure: the build is recorded all the same
    assert run_dir.read(Build, "gpu-01", "r1").seconds is None


def test_an_installed_release_is_recorded_as_not_built(run_dir, plan, monkeypatch, tmp_path):
    monkeypatch.setattr(lc, "_ship", lambda state, host, plan, fp: True)
    monkeypatch.setattr(lc, "builder_of", lambda fp: "this-batch-first")  # not who compiled it
    monkeypatch.setattr(lc, "RELEASE_CACHE", tmp_path)
    (tmp_path / "fp1.tar.builder").write_text("builder\n")  # noted when the archive reached the cache
    assert lc._installed(None, Host({}), plan, "fp1")
    rec = run_dir.read(Build, "gpu-01", "r1")
    assert (rec.built, rec.source, rec.fingerprint) == (False, "builder", "fp1") and rec.seconds >= 0
    monkeypatch.setattr(lc, "_ship", lambda state, host, plan, fp: False)  # a lost builder: no record, a failure
    assert not lc._installed(None, Host({}, name="gpu-02"), plan, "fp1")
    assert run_dir.read(Build, "gpu-02", "r1") is None


def test_each_download_of_a_run_is_added_to_the_hosts_record(run_dir):
    h = Host({"/m/a.gguf.fetched": "209715200 2000000\n"})
    assert model_role._downloaded(None, h, "/m/a.gguf")
    assert "rm -f -- /m/a.gguf.fetched" in h.sent[0]  # read once, then gone
    h.answers = {"/m/draft.gguf.fetched": "1048576 500000"}
    assert model_role._downloaded(None, h, "/m/draft.gguf")
    rec = run_dir.read(Fetch, "gpu-01", "r1")
    assert rec.downloads == (Download("/m/a.gguf", 209715200, 2.0), Download("/m/draft.gguf", 1048576, 0.5))
    assert [d.mib_s for d in rec.downloads] == [100.0, 2.0]
    assert model_role._downloaded(None, Host({}, name="gpu-02"), "/m/a.gguf")  # verified only: nothing fetched
    assert run_dir.read(Fetch, "gpu-02", "r1") is None


def test_the_fetch_script_keeps_what_it_downloaded_and_how_long(tmp_path):
    """vf-fetch-model itself: <dest>.fetched holds the bytes of this download and curl's microseconds."""
    if not shutil.which("curl"):
        pytest.skip("no curl")
    (tmp_path / "www").mkdir()
    data = b"x" * 300000
    (tmp_path / "www" / "m.gguf").write_bytes(data)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(tmp_path / "www")))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        dest = tmp_path / "models" / "m.gguf"
        script = REPO / "roles/model/files/vf-fetch-model.sh"
        url = f"http://127.0.0.1:{srv.server_address[1]}/m.gguf"
        r = subprocess.run(["bash", str(script), url, str(dest)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        size, micros = (int(v) for v in (tmp_path / "models" / "m.gguf.fetched").read_text().split())
        assert size == len(data) and 0 < micros < 60_000_000
    finally:
        srv.shutdown()
