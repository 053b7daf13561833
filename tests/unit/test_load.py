"""bench/lab/load.py against a real local HTTP/1.1 server: every request served, each client
thread on its own keep-alive connection (reused, never one a request), streamed and not."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.lab.load import Load


class Completions(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    peers: set = set()
    lock = threading.Lock()

    def log_message(self, *a):
        pass

    def do_POST(self):
        with self.lock:
            self.peers.add(self.client_address[1])
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = body.get("n_predict") or body.get("max_tokens")
        if self.path == "/completion":
            chunks = [{"content": "x", "stop": False}] * n + [{"content": "", "stop": True}]
            whole = {"content": "x" * n, "tokens_predicted": n}
        else:  # the OpenAI SDK's /v1/completions
            choice = {"index": 0, "text": "x", "finish_reason": None, "logprobs": None}
            chunks = [{"id": "1", "object": "text_completion", "created": 0, "model": "m", "choices": [choice]}] * n
            chunks.append({"id": "1", "object": "text_completion", "created": 0, "model": "m",
                           "choices": [{**choice, "text": "", "finish_reason": "length"}]})
            whole = {"id": "1", "object": "text_completion", "created": 0, "model": "m",
                     "choices": [{**choice, "text": "x" * n, "finish_reason": "length"}],
                     "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}}
        if body.get("stream"):
            data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
            ctype = "text/event-stream"
        else:
            data, ctype = json.dumps(whole).encode(), "application/json"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server():
    Completions.peers = set()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Completions)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


@pytest.mark.parametrize("client", ["httpx", "openai"])
def test_every_request_is_served_over_one_reused_connection_a_client(server, client):
    load = Load(server, clients=4, tokens=5, seconds=60, max_requests=200, client=client).start()
    load.wait(timeout=60)
    s = load.stop()
    assert s["requests"] == 200 and s["served"] == 200 and s["failed"] == 0, s
    assert len(load.pools) == 4                         # a pool a client thread
    assert 1 <= len(Completions.peers) <= 4, Completions.peers  # keep-alive: 200 requests, at most 4 connections
    streamed = [r for r in load.results if r["stream"]]
    assert len(streamed) == 100 and all(r["tokens"] == 5 for r in streamed)


def test_load_refuses_anything_but_loopback():
    with pytest.raises(ValueError, match="loopback"):
        Load("http://10.0.0.1:8080")


def test_a_pause_spaces_a_clients_requests_on_its_one_pooled_connection(server):
    t0 = time.monotonic()
    load = Load(server, clients=1, tokens=2, seconds=60, max_requests=6, pause_s=0.2).start()
    load.wait(timeout=30)
    s = load.stop()
    assert s["requests"] == 6 and s["failed"] == 0 and len(Completions.peers) == 1, (s, Completions.peers)
    assert time.monotonic() - t0 >= 5 * 0.2  # five pauses between six requests
