"""The served-judge client never hangs: every request has a total deadline, whatever the server does."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentcap.judges.served import JudgeUnavailable, ServedClient

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n" + b"{" * 1000


class Loopback:
    """A TCP server on 127.0.0.1 that accepts and then either trickles a response one byte every
    0.2 s (``trickle``) or never sends anything (``silent``); ``accepted`` counts connections."""

    def __init__(self, mode: str):
        self.mode, self.accepted, self.stop = mode, 0, threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/v1"
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        self.server.settimeout(0.1)
        while not self.stop.is_set():
            try:
                connection, _ = self.server.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            for byte in RESPONSE if self.mode == "trickle" else ():
                if self.stop.wait(0.2):
                    return
                try:
                    connection.sendall(bytes([byte]))
                except OSError:  # the client gave up
                    return
            self.stop.wait()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.server.close()


@pytest.fixture
def loopback():
    servers = []

    def make(mode: str) -> Loopback:
        servers.append(Loopback(mode))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def test_a_server_trickling_bytes_cannot_outlast_the_deadline(loopback):
    """One byte every 0.2 s resets any per-read timeout; the total deadline still ends the request."""
    server = loopback("trickle")
    client = ServedClient(server.url, "judge", timeout=1.0, retries=0)
    start = time.monotonic()
    with pytest.raises(JudgeUnavailable, match=r"/v1/chat/completions \(model 'judge'\) .*after 1 attempts "
                                               r"\(no whole answer within timeout=1\.0 s\)"):
        client.post("/chat/completions", {"model": "judge", "messages": []})
    assert 1.0 <= time.monotonic() - start < 2.5


def test_a_silent_server_costs_each_attempt_its_deadline_and_the_backoff(loopback):
    server = loopback("silent")
    client = ServedClient(server.url, "judge", timeout=0.5, retries=1, backoff=0.2)
    start = time.monotonic()
    with pytest.raises(JudgeUnavailable, match="after 2 attempts"):
        client.map("/chat/completions", [{"model": "judge", "messages": []}] * 3)
    elapsed = time.monotonic() - start
    assert 2 * 0.5 + 0.2 <= elapsed < 2 * 0.5 + 0.2 + 1.5, elapsed
    assert server.accepted == 6  # three requests in parallel, each tried twice


def test_the_deadline_starts_when_a_request_goes_out(loopback):
    """``batch_size`` requests in flight: the later ones do not use up their deadline queueing."""
    server = loopback("silent")
    client = ServedClient(server.url, "judge", timeout=0.4, retries=0, batch_size=2)
    start = time.monotonic()
    with pytest.raises(JudgeUnavailable):
        client.map("/completions", [{"prompt": [1]}] * 2)
    assert time.monotonic() - start < 0.4 + 1.0
    assert server.accepted == 2


class Flaky(BaseHTTPRequestHandler):
    """503 on the first request, then the JSON it was sent; 400 for ``/bad``."""

    calls = 0

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).calls += 1
        status = 400 if self.path.endswith("/bad") else 503 if type(self).calls == 1 else 200
        reply = body if status == 200 else b"busy" if status == 503 else b"no such model"
        self.send_response(status)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def test_a_5xx_is_retried_and_a_4xx_is_refused_at_once():
    Flaky.calls = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = ServedClient(f"http://127.0.0.1:{server.server_port}/v1", "judge", timeout=5, retries=1, backoff=0.01)
        assert client.post("/chat/completions", {"x": [1, "é"]}) == {"x": [1, "é"]}
        assert Flaky.calls == 2
        with pytest.raises(ValueError, match=r"/v1/bad refused the request \(400\): no such model"):
            client.post("/bad", {})
        assert Flaky.calls == 3
    finally:
        server.shutdown()
        server.server_close()


def test_the_client_works_from_async_code(loopback):
    """Inside a running event loop (a notebook) the requests run on a loop of their own."""
    import asyncio

    server = loopback("trickle")
    client = ServedClient(server.url, "judge", timeout=0.3, retries=0)

    async def ask():
        return client.post("/chat/completions", {})

    with pytest.raises(JudgeUnavailable, match="timeout=0.3 s"):
        asyncio.run(ask())


def test_a_non_positive_timeout_is_refused():
    with pytest.raises(ValueError, match="judge timeout must be > 0 seconds, got 0"):
        ServedClient("http://127.0.0.1:8000/v1", "judge", timeout=0)
