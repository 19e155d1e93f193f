"""The connection limits of `mt serve` on a real server over loopback: a client too slow to send its request (head
or body), or one that sends nothing, is dropped after --client-timeout; one past --max-connections is refused at
once; a request that arrived in time may take as long as its translation takes; a body too large is refused."""

import json
import select
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import pytest

pytest.importorskip("fastapi")
import uvicorn  # noqa: E402

from mt.options import ServeOptions  # noqa: E402
from mt.serve.limits import max_body, protocol  # noqa: E402

from .test_app import free_port, held, run, serve_app, until  # noqa: E402

TIMEOUT = 0.5  # --client-timeout of these tests: every wait below is a few of these
HEAD = b"POST /v1/translate HTTP/1.1\r\nHost: mt\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n"


@contextmanager
def serving(app):
    options = app.state.options
    config = uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning", http=protocol(options))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        run(until(lambda: server.started, "the server to start"))
        yield config.port
    finally:
        server.should_exit = True
        thread.join(30)


def trickle(port: int, at_once: bytes, slowly: bytes, every: float = 0.05) -> tuple[float, bytes]:
    """Send `at_once`, then `slowly` a byte at a time until the server answers or closes; the seconds that took,
    and the answer."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(at_once)
        for byte in slowly:
            if select.select([sock], [], [], every)[0]:  # the server has answered or closed: stop sending
                break
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
        return time.monotonic() - started, read_to_end(sock)


def read_to_end(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (a test failure if it has not within 5 s)."""
    sock.settimeout(5)
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except ConnectionResetError:
        pass
    return answer


def error_of(answer: bytes) -> tuple[int, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


def test_slow_and_silent_clients_are_dropped_and_a_slow_translation_is_not(checkpoint):
    app = serve_app(checkpoint, client_timeout=TIMEOUT)
    with serving(app) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as silent:
            started = time.monotonic()
            status, error = error_of(read_to_end(silent))
        assert status == 408 and "--client-timeout" in error and time.monotonic() - started < 4 * TIMEOUT

        took, answer = trickle(port, b"", HEAD)  # a head a byte at a time: 5 s if never cut
        assert error_of(answer)[0] == 408 and took < 4 * TIMEOUT

        took, answer = trickle(port, HEAD, b" " * 400)  # a whole head, then its body a byte at a time: 20 s
        assert answer == b"" and took < 4 * TIMEOUT  # the app was reading its body: the connection is closed

        inside, release = held(app.state.models["de-en"].batcher)
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.get("/health").status_code == 200
            time.sleep(2 * TIMEOUT)  # idle on a kept-alive connection: the deadline runs from a request's first byte
            assert client.get("/health").status_code == 200
            threading.Timer(3 * TIMEOUT, release.set).start()  # the model holds the request past the timeout
            assert client.post("/v1/translate", json={"text": ["der hund"]}).status_code == 200
        assert inside.is_set()


def test_a_connection_past_the_limit_is_refused_at_once(checkpoint):
    app = serve_app(checkpoint, client_timeout=10 * TIMEOUT, max_connections=3)
    with serving(app) as port:
        held_open = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as extra:
                status, error = error_of(read_to_end(extra))
            assert status == 503 and "--max-connections" in error
        finally:
            for sock in held_open:
                sock.close()
        for _ in range(100):  # room again once the server has seen them closed
            if (answer := httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)).status_code == 200:
                break
            time.sleep(0.05)
        assert answer.status_code == 200


def test_a_body_over_the_limit_is_refused_without_reading_it(checkpoint):
    """A body larger than the longest request the line limits allow is answered 413, before it is sent when its
    Content-Length says so, as soon as it is past the limit when it comes in chunks; the server serves on."""
    app = serve_app(checkpoint, max_lines=2, max_chars=10)
    limit = max_body(app.state.options)
    with serving(app) as port:
        for path in ("/v1/translate", "/translate"):
            declared = (f"POST {path} HTTP/1.1\r\nHost: mt\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {100 * limit}\r\n\r\n").encode()
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(declared + b"{")  # none of the rest: the answer must not wait for it
                status, error = error_of(read_to_end(sock))
            assert status == 413 and "--max-lines and --max-chars" in error, (path, error)

        chunked = (b"POST /v1/translate HTTP/1.1\r\nHost: mt\r\nContent-Type: application/json\r\n"
                   b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
        sent = 0
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(chunked)
            while sent < 100 * limit and not select.select([sock], [], [], 0)[0]:
                try:
                    sock.sendall(chunk)
                except OSError:  # the server has answered and closed, with what was sent unread
                    break
                sent += 65536
            status, error = error_of(read_to_end(sock))
        assert status == 413 and "at least" in error
        read = int(error.split("at least ")[1].split()[0].replace(",", ""))
        assert limit < read <= limit + 2 ** 20  # it stopped reading soon after the limit

        answer = httpx.post(f"http://127.0.0.1:{port}/v1/translate", json={"text": ["der hund"]}, timeout=10)
        assert answer.status_code == 200


def test_the_longest_request_the_line_limits_allow_fits_the_body_limit():
    """max_lines lines of max_chars characters, each spelled as long as JSON spells one, pass the body limit."""
    options = ServeOptions()
    widest = json.dumps({"text": ["\U0001F600" * options.max_chars] * options.max_lines,
                         "glossary": {"Hund": "dog"}, "format": "lines"})
    assert options.max_chars * options.max_lines * 12 <= len(widest) <= max_body(options)


def test_a_client_sending_a_body_far_over_the_limit_reads_its_413_rather_than_a_reset(checkpoint):
    """Clients send a whole body before they read the answer: the server, having answered 413 without reading it,
    reads on (discarding it) until the client is done, so that the client sees the 413, not a reset connection;
    whether it declared its length or sent it in chunks (requests, as deep-translator sends; and a bare socket)."""
    import requests

    app = serve_app(checkpoint, max_lines=2, max_chars=10)
    limit = max_body(app.state.options)
    body = b" " * (40 * limit)  # 40 MiB

    def chunks():
        for start in range(0, len(body), 2 ** 20):
            yield body[start:start + 2 ** 20]

    with serving(app) as port:
        url = f"http://127.0.0.1:{port}/v1/translate"
        for content in (body, chunks()):
            answer = requests.post(url, data=content, headers={"Content-Type": "application/json"}, timeout=30)
            assert answer.status_code == 413 and "the limit is" in answer.json()["error"]
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: mt\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            assert error_of(read_to_end(sock))[0] == 413
        assert requests.post(url, json={"text": ["der hund"]}, timeout=30).status_code == 200
