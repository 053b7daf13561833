"""pin_model against a real local HTTP server (http.server): a redirect, then the header."""
import http.server
import threading

import pytest

from voltafleet.inputs import pin_model

SHA = "a" * 64
OTHER = "b" * 64


class Handler(http.server.BaseHTTPRequestHandler):
    etag = f'"{SHA}"'

    def do_HEAD(self):  # noqa: N802
        if self.path.startswith("/org/model/resolve/main/"):
            # Hugging Face: the resolve URL redirects to the CDN and carries the LFS sha256
            self.send_response(302)
            self.send_header("Location", "/cdn/" + self.path.rsplit("/", 1)[1])
            if Handler.etag:
                self.send_header("X-Linked-Etag", Handler.etag)
            self.end_headers()
        elif self.path.startswith("/cdn/"):
            self.send_response(200)
            self.send_header("Content-Length", "15583516896")
            self.end_headers()
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *a):
        pass


@pytest.fixture()
def server():
    Handler.etag = f'"{SHA}"'
    s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=s.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{s.server_address[1]}"
    s.shutdown()


def vars_file(tmp_path, base, sha="null"):
    gv = tmp_path / "group_vars"
    gv.mkdir()
    f = gv / "all.yml"
    f.write_text(f"# top\nmodel_url: {base}/org/model/resolve/main/Qwen3.6-27B-Q4_K_S.gguf  # where\n"
                 f"model_sha256: {sha}                  # sha256 of the file\nmodel_dir: /m  # dir\n")
    return f


def test_reads_through_the_redirect_and_records_keeping_comments(server, tmp_path, capsys):
    f = vars_file(tmp_path, server)
    assert pin_model.main(["--root", str(tmp_path)]) == 0
    text = f.read_text()
    assert f"model_sha256: {SHA}                  # sha256 of the file\n" in text
    assert text.startswith("# top\nmodel_url: ") and text.endswith("model_dir: /m  # dir\n")
    assert SHA in capsys.readouterr().out
    assert pin_model.main(["--root", str(tmp_path), "--check"]) == 0


def test_check_fails_when_upstream_changed(server, tmp_path, capsys):
    vars_file(tmp_path, server, sha=OTHER)
    assert pin_model.main(["--root", str(tmp_path), "--check"]) == 1
    assert "changed" in capsys.readouterr().err


def test_no_header_is_an_error_with_the_fix(server, tmp_path, capsys):
    Handler.etag = None
    f = vars_file(tmp_path, server)
    assert pin_model.main(["--root", str(tmp_path)]) == 2
    assert "X-Linked-Etag" in capsys.readouterr().err and "null" in f.read_text()


def test_a_non_sha_etag_is_refused(server, tmp_path):
    Handler.etag = '"1234-abcd"'
    vars_file(tmp_path, server)
    assert pin_model.main(["--root", str(tmp_path)]) == 2


def test_record_adds_a_line_when_the_file_has_none():
    out = pin_model.record("model_url: http://x/m.gguf\nother: 1\n", SHA, "f.yml")
    assert out.splitlines()[1].startswith(f"model_sha256: {SHA}") and out.endswith("other: 1\n")
