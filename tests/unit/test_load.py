"""bench/lab/load.py against a real local HTTP/1.1 server: every request served, each client
thread on its own keep-alive connection (reused, never one a request), streamed and not."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.lab.load import Load


def sse(chunk: dict) -> bytes:
    """One server-sent event, as llama-server streams a chunk."""
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


class Completions(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    peers: set = set()
    lock = threading.Lock()
    delay_s = 0.0  # how long each answer takes
    chunk_s = 0.0  # a streamed answer's time between two chunks (each written on its own)
    sent: list = []  # a streamed answer each, how many chunks it wrote before it ended or its client went

    def log_message(self, *a):
        pass

    def do_POST(self):
        with self.lock:
            self.peers.add(self.client_address[1])
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = body.get("n_predict") or body.get("max_tokens")
        time.sleep(self.delay_s)
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
        if body.get("stream") and self.chunk_s:
            return self.slow_stream(chunks)
        if body.get("stream"):
            data = b"".join(sse(c) for c in chunks)
            ctype = "text/event-stream"
        else:
            data, ctype = json.dumps(whole).encode(), "application/json"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def slow_stream(self, chunks):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        n = 0
        try:
            for c in chunks:
                data = sse(c)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                n += 1
                time.sleep(self.chunk_s)
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        with self.lock:
            self.sent.append(n)


@pytest.fixture
def server():
    Completions.peers, Completions.delay_s, Completions.chunk_s, Completions.sent = set(), 0.0, 0.0, []
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


def test_the_moment_to_break_something_has_a_request_in_flight_by_the_loads_own_records(server):
    """bench/lab/failover.py breaks a gateway only once a request has just begun: the clients can all be
    between two requests at one instant (a long pause here), and a move then would cut nothing."""
    Completions.delay_s = 0.2
    load = Load(server, clients=2, tokens=2, seconds=60, max_requests=1000, pause_s=0.3).start()
    moments = []
    try:
        for _ in range(5):
            load.wait_in_flight(began_within_s=0.05, seconds=5)
            moments.append(time.time())
            time.sleep(0.25)
    finally:
        load.stop()
    for m in moments:  # each moment, judged as failover.judge does: a request began before it and ended after it
        assert any(r["start"] < m < r["end"] for r in load.results), (m, load.results)
    assert load.in_flight(began_within_s=60) == 0 and not load.running  # every request's entry went at its end
    with pytest.raises(TimeoutError, match="no request began in flight within 0.05 s for 0.1 s"):
        load.wait_in_flight(began_within_s=0.05, seconds=0.1)


@pytest.mark.parametrize("client", ["httpx", "openai"])
def test_abort_closes_each_stream_in_its_own_thread_and_the_server_sees_its_client_go(server, client):
    """Load.abort (a load that only kept the fleet busy): every client's stream is closed by the thread reading it,
    at its next chunk; the server's writes then fail and it stops (as llama-server stops generating). 200 chunks
    of 20 ms each would take 4 s a stream; every pool is closed once no thread is left reading."""
    Completions.chunk_s = 0.02
    load = Load(server, clients=3, tokens=200, seconds=60, max_requests=100, client=client, streams_only=True).start()
    deadline = time.monotonic() + 10
    while len(load.running) < 3 and time.monotonic() < deadline:  # every client in its stream
        time.sleep(0.01)
    time.sleep(0.3)
    assert load.abort(seconds=10) == 0 and not any(t.is_alive() for t in load.threads)
    deadline = time.monotonic() + 10
    while len(Completions.sent) < 3 and time.monotonic() < deadline:  # the server notices at its next write
        time.sleep(0.05)
    assert len(Completions.sent) == 3 and all(n < 200 for n in Completions.sent), Completions.sent
    assert all(p.is_closed for p in load.pools)
    cut = [r for r in load.results if not r["ok"]]  # each one ended by its own thread, none by a closed socket
    assert len(cut) == 3 and all("stream closed by the client (Load.abort)" in r["error"] for r in cut), cut
