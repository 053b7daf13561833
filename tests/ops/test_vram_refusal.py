"""The VRAM plan in preflight, on fake-connector V100 hosts: the model's GGUF header is
read over HTTP Range from a local server (as from Hugging Face); a plan that does not fit
is refused with its numbers before any change, an unset ctx/slots is picked from the ladder."""
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import gguf
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from tests.ops.test_toolchain import changes, run


def header_only_27b(path, qtype):
    """A GGUF header (no tensor data) with the seed's dense 27B tensor table."""
    w = gguf.GGUFWriter(str(path), "qwen2")
    for add, v in ((w.add_block_count, 64), (w.add_embedding_length, 5120), (w.add_feed_forward_length, 21760),
                   (w.add_head_count, 40), (w.add_head_count_kv, 8), (w.add_context_length, 32768)):
        add(v)
    block, size = GGML_QUANT_SIZES[qtype]

    def t(name, rows, cols, q=qtype):
        b, s = GGML_QUANT_SIZES[q]
        w.add_tensor_info(name, (rows, cols // b * s), np.dtype(np.uint8), rows * cols // b * s, raw_dtype=q)

    t("token_embd.weight", 152064, 5120)
    t("output.weight", 152064, 5120)
    for i in range(64):
        for name, rows, cols in (("attn_q", 5120, 5120), ("attn_k", 1024, 5120), ("attn_v", 1024, 5120),
                                 ("attn_output", 5120, 5120), ("ffn_gate", 21760, 5120),
                                 ("ffn_up", 21760, 5120), ("ffn_down", 5120, 21760)):
            t(f"blk.{i}.{name}.weight", rows, cols)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    header_only_27b(root / "qwen-27b-Q8_0.gguf", T.Q8_0)
    header_only_27b(root / "qwen-27b-Q4_K.gguf", T.Q4_K)

    class Ranged(BaseHTTPRequestHandler):
        def do_GET(self):
            data = (root / self.path.lstrip("/")).read_bytes()
            m = re.match(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
            if not m:
                self.send_response(200)
                chunk = data
            else:
                start, end = int(m.group(1)), min(int(m.group(2)), len(data) - 1)
                chunk = data[start:end + 1]
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.send_header("Content-Length", str(len(chunk)))
            self.end_headers()
            self.wfile.write(chunk)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Ranged)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_q8_0_27b_on_a_16gb_v100_is_refused_with_numbers(mirror):
    rc, cmds, out = run("v100-q8", vars={"model_url": f"{mirror}/qwen-27b-Q8_0.gguf"})
    assert rc != 0
    assert "the model does not fit one GPU: -c 8192 -np 2 K q8_0 V q8_0: weights" in out  # v100_16gb.yml
    assert re.search(r"of 16,384 MiB: short by [\d,]+ MiB", out)
    assert changes(cmds) == []


def test_unset_ctx_and_slots_come_from_the_ladder(mirror):
    rc, cmds, out = run("v100-q4k", vars={"model_url": f"{mirror}/qwen-27b-Q4_K.gguf",
                                          "server_ctx": None, "server_parallel": None})
    assert rc == 0, out
    # v100_16gb counts the H200's 610 MiB CUDA overhead: 8K x 8 slots no longer fits, 4K x 8 does
    assert "VRAM plan: -c 4096 -np 8 K q8_0 V q8_0" in out and ": fits" in out


@pytest.mark.parametrize("phase", ["preflight", "tune"])
def test_a_refusal_is_recorded_for_the_driver_not_only_printed(mirror, tmp_path, monkeypatch, phase):
    """The driver's runs (a rollout's preflight, a --tune trial) learn a refusal from the host's
    preflight record of the run (voltafleet.state.records.Preflight), never from pyinfra's output."""
    from voltafleet.state.records import Preflight
    from voltafleet.state.runctx import RunDir

    for k, v in {"VOLTAFLEET_PHASE": phase, "VOLTAFLEET_REPORT_DIR": str(tmp_path), "VOLTAFLEET_RUN": "t1"}.items():
        monkeypatch.setenv(k, v)
    rc, _, out = run("v100-q8", vars={"model_url": f"{mirror}/qwen-27b-Q8_0.gguf"})
    assert rc != 0 and "preflight refused the rollout" in out
    rec = RunDir(tmp_path).read(Preflight, "@fake/v100-q8", "t1")
    assert rec.refusals and "the model does not fit one GPU" in rec.refusals[0] and rec.entry() is None
    assert rec.refusals[0] in out  # the same words as printed
    if phase == "preflight":  # a host that fits: its fleet plan entry, no refusal
        rc, _, out = run("v100-q4k", vars={"model_url": f"{mirror}/qwen-27b-Q4_K.gguf", "server_ctx": None,
                                           "server_parallel": None})
        ok = RunDir(tmp_path).read(Preflight, "@fake/v100-q4k", "t1")
        assert ok.refusals == () and ok.entry().ports == (8080, 8081) and ok.entry().slots == 8


def test_a_plain_run_prints_its_refusals_and_records_none(mirror, tmp_path, monkeypatch):
    monkeypatch.setenv("VOLTAFLEET_REPORT_DIR", str(tmp_path))
    rc, _, out = run("v100-q8", vars={"model_url": f"{mirror}/qwen-27b-Q8_0.gguf"})
    assert rc != 0 and "the model does not fit one GPU" in out and not list(tmp_path.iterdir())
