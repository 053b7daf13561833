"""Model fetch on a real lab host from the real nginx mirror (HTTP Range): resume after a
broken transfer, a wrong checksum, a 404; and the GGUF header read by Range alone."""
import re
from pathlib import Path
import shlex

import pytest

from lab.fleet import STATE
from tests.lab.helpers import REPO, lab, ssh, th
from voltafleet.models.gguf_header import read_url

DEST = "/var/tmp/vf-fetch-test/model.gguf"


@pytest.fixture(scope="module")
def h():
    host = lab()["hosts"][0]
    ssh(host, "rm -rf /var/tmp/vf-fetch-test")
    return host


FETCH = REPO / "roles/model/files/vf-fetch-model.sh"


def fetch(host, url, dest, sha, timeout=None):
    """Run the role's own fetch script on the host (its copy in /tmp, quoted arguments)."""
    th(host).run("cat > /tmp/vf-fetch-model <<'VF_EOF'\n" + FETCH.read_text() + "VF_EOF")
    args = " ".join(shlex.quote(a) for a in (url, dest, sha))
    return th(host).run((f"timeout {timeout} " if timeout else "") + f"bash /tmp/vf-fetch-model {args}")


def access_log_since(mark: int) -> list[str]:
    with open(STATE / "nginx-access.log") as f:
        f.seek(mark)
        return f.read().splitlines()


def log_mark() -> int:
    return (STATE / "nginx-access.log").stat().st_size


def test_interrupted_download_resumes_and_never_leaves_a_half_model(h):
    st = lab()
    slow = st["model_url"].replace("/models/", "/slow/models/")
    r = fetch(h, slow, DEST, st["model_sha256"], timeout=3)
    assert r.rc == 124  # killed mid-transfer
    part = int(ssh(h, f"stat -c %s {DEST}.part"))
    assert 0 < part < st["model_size"]
    assert ssh(h, f"test -e {DEST} && echo yes || echo no") == "no"
    mark = log_mark()
    r = fetch(h, st["model_url"], DEST, st["model_sha256"])
    assert r.rc == 0, r.stderr
    assert ssh(h, f"sha256sum < {DEST} | cut -d' ' -f1") == st["model_sha256"]
    assert ssh(h, f"test -e {DEST}.part && echo yes || echo no") == "no"
    resumed = [l for l in access_log_since(mark) if "tiny-qwen35" in l]
    assert len(resumed) == 1 and '" 206 ' in resumed[0]
    sent = int(re.search(r'" 206 (\d+)', resumed[0]).group(1))
    assert sent == st["model_size"] - part  # only the missing bytes came again
    sha, size, _ = ssh(h, f"cat {DEST}.verified").split()
    assert (sha, int(size)) == (st["model_sha256"], st["model_size"])


def test_wrong_checksum_never_replaces_the_good_file(h):
    st = lab()
    before = ssh(h, f"stat -c '%i %Y' {DEST}")
    ssh(h, f"rm -f {DEST}.verified")  # force a fetch: the file is no longer recorded as verified
    r = fetch(h, st["model_url"], DEST, "0" * 64)
    assert r.rc == 1
    assert "model_sha256 says 0000" in r.stderr and "untouched" in r.stderr
    assert ssh(h, f"stat -c '%i %Y' {DEST}") == before
    assert ssh(h, f"test -e {DEST}.part && echo yes || echo no") == "no"


def test_404_leaves_the_good_file_alone(h):
    st = lab()
    before = ssh(h, f"stat -c '%i %Y' {DEST}")
    r = fetch(h, st["model_url"].replace("tiny", "missing"), DEST + ".other", st["model_sha256"])
    assert r.rc == 1 and "download of" in r.stderr
    assert ssh(h, f"stat -c '%i %Y' {DEST}") == before
    assert ssh(h, f"test -s {DEST}.other && echo yes || echo no") == "no"


def test_header_is_read_with_range_requests_only():
    """The planner reads a model's header by HTTP Range, a growing window, never the file:
    Gemma 3 270M (253 MB) from the mirror; the lab's tiny qwen35 is the hybrid shape."""
    st = lab()
    tiny = read_url(st["model_url"], chunk=1 << 20)
    # 4 trunk blocks and the MTP block (nextn), which the latency tier drafts with
    assert tiny.arch == "qwen35" and tiny.get("block_count") == 5 and tiny.get("nextn_predict_layers") == 1
    assert tiny.get("full_attention_interval") == 4
    mark = log_mark()
    header = read_url(st["gemma"]["url"], chunk=1 << 20)
    assert header.arch == "gemma3" and header.get("block_count") > 0
    lines = [l for l in access_log_since(mark) if "gemma" in l]
    assert lines and all('" 206 ' in l for l in lines)
    sent = sum(int(re.search(r'" 206 (\d+)', l).group(1)) for l in lines)
    size = (Path(st["mirror_root"]) / "models" / Path(st["gemma"]["url"]).name).stat().st_size
    assert header.header_bytes <= sent <= 2 * header.header_bytes + (1 << 20) and sent < size / 10


def test_mirror_answers_with_the_lfs_sha256_and_pin_model_reads_it(tmp_path):
    """The lab mirror sends X-Linked-Etag like Hugging Face; pin_model records and checks it."""
    from voltafleet.inputs import pin_model

    st = lab()
    sha, _ = pin_model.linked_sha256(st["model_url"])
    assert sha == st["model_sha256"]
    f = tmp_path / "all.yml"
    f.write_text(f"model_url: {st['model_url']}  # lab\nmodel_sha256: null  # pinned below\n")
    assert pin_model.main(["--vars", str(f)]) == 0
    assert f"model_sha256: {sha}  # pinned below" in f.read_text()
    assert pin_model.main(["--vars", str(f), "--check"]) == 0
