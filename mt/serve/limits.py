"""The limits of `mt serve` beneath its checks of a request: how long a client may take to send a request, how many
connections the server holds at once, and how large a request's body may be.

uvicorn bounds the idle time between a connection's requests (`timeout_keep_alive`, 5 s) and the size of a
request's head (h11's 16 KiB), but not the time a request takes to arrive: a client that sends its head or its
body a byte at a time holds its connection for ever, and a few hundred such clients hold the server (ASGI
middleware cannot help with the head: the app is called only once the head is in). So each connection here runs
uvicorn's h11 protocol with a deadline: a request must arrive whole, head and body, within `client_timeout` of
its first byte, or of the connection's opening for its first request. A client past it is answered 408 when its
head is incomplete, and its connection closed either way (the app, reading the body, sees the client gone).

Nor does anything beneath the app bound a body's size: a fast client could send gigabytes for the server to hold.
`BodyLimit` answers 413 to a body larger than the longest request the line limits allow (`max_body`), or, for an
upload to /translate_file, than --max-file-bytes and `FORM_ROOM`, before reading it when its Content-Length says
so, as soon as it is past the limit when it comes in chunks.

A connection closed while its client is still sending a body it was answered before (a 413) would be reset by the
kernel, with the unread bytes, before most clients have read the answer: they send the whole body first. So, as
nginx's lingering close does, the server then shuts its side down after the answer and reads on, discarding, until
the client closes or `LINGER` seconds have passed.
"""

from __future__ import annotations

import asyncio
import functools
import http
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from mt.errors import ApiError
from mt.options import ServeOptions
from mt.serve.errors import answer

# The most bytes JSON spells one character in: past U+FFFF, as two \uXXXX escapes.
JSON_BYTES_PER_CHARACTER = 12
FORM_ROOM = 64 * 2 ** 10  # an upload's body besides its file: the multipart heads, source, target, a key
FILE_PATH = "/translate_file"
LINGER = 5.0  # seconds a connection answered mid-body reads on, discarding, so that its client sees the answer


def protocol(options: ServeOptions) -> functools.partial:
    """What uvicorn builds each connection with (its `http` setting)."""
    return functools.partial(Deadlined, client_timeout=options.client_timeout,
                             max_connections=options.max_connections)


class Deadlined(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline on each request's arrival and a cap on open connections; what
    it refuses itself is answered `{"error": ...}` as the app's refusals are."""

    def __init__(self, config, server_state, app_state, _loop=None, *, client_timeout: float, max_connections: int):
        super().__init__(config, server_state, app_state, _loop)
        self.client_timeout, self.max_connections = client_timeout, max_connections
        self.deadline: asyncio.TimerHandle | None = None
        self.lingering = False

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(Lingering(transport, self))
        if len(self.connections) > self.max_connections:  # this one included
            self.refuse(503, f"the server holds {self.max_connections} connections, its limit (--max-connections): "
                             f"retry shortly", [(b"retry-after", b"1")])
            return
        self.deadline = self.loop.call_later(self.client_timeout, self.expire)  # one that sends nothing goes too

    def data_received(self, data: bytes) -> None:
        if self.lingering:  # the rest of a body already answered: read only to be discarded
            return
        super().data_received(data)
        self.watch()

    def linger(self, transport: asyncio.Transport) -> None:
        """Close the connection, reading on first (see the module's docstring) while a body is still coming."""
        self.disarm()
        if self.lingering or self.conn.their_state is not h11.SEND_BODY or not transport.can_write_eof():
            transport.close()
            return
        self.lingering = True
        transport.write_eof()  # once the answer is out: the client reads it, then the end
        transport.resume_reading()
        self.loop.call_later(LINGER, transport.close)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.watch()  # a pipelined request may be on its way already

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        super().connection_lost(exc)

    def watch(self) -> None:
        """Arm the deadline while a request is on its way (its first bytes are in, its last are not); disarm it
        once the request is in, so that translating it and answering take what time they take."""
        their, (buffered, _) = self.conn.their_state, self.conn.trailing_data
        if their is h11.SEND_BODY or (their is h11.IDLE and buffered):
            if self.deadline is None:
                self.deadline = self.loop.call_later(self.client_timeout, self.expire)
        elif their is not h11.IDLE:
            self.disarm()

    def disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def expire(self) -> None:
        self.deadline = None
        if self.transport.is_closing():
            return
        who = f"{self.client[0]}:{self.client[1]} - " if self.client else ""  # as uvicorn prefixes its lines
        self.logger.warning("%sdropped: the request did not arrive within %g s (--client-timeout)", who,
                            self.client_timeout)
        if self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE:  # no head yet: nothing answered
            self.refuse(408, f"the request did not arrive within {self.client_timeout:g} s (--client-timeout): "
                             f"send it whole, at once")
        else:
            self.transport.close()

    def send_400_response(self, msg: str) -> None:  # uvicorn's answer to a head h11 cannot parse
        self.refuse(400, "the request is not valid HTTP/1.1, or its head is over 16 KiB: send a valid request")

    def refuse(self, status: int, message: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
        """Answer `status` and `{"error": message}` from here, then close the connection."""
        self.disarm()
        body = json.dumps({"error": message}).encode()
        head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"), *headers]
        try:
            for event in (h11.Response(status_code=status, headers=head, reason=http.HTTPStatus(status).phrase),
                          h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:  # h11's state forbids an answer now: closing says enough
            pass
        self.transport.close()


class Lingering:
    """The connection's transport as uvicorn sees it: its `close` lingers (`Deadlined.linger`)."""

    def __init__(self, transport: asyncio.Transport, protocol: Deadlined):
        self.transport, self.protocol = transport, protocol

    def close(self) -> None:
        self.protocol.linger(self.transport)

    def is_closing(self) -> bool:
        return self.protocol.lingering or self.transport.is_closing()

    def __getattr__(self, name: str):
        return getattr(self.transport, name)


def max_body(options: ServeOptions) -> int:
    """The most bytes a request's body may hold: `max_lines` lines of `max_chars` characters, each spelled as long as
    JSON can spell it, and a MiB for the rest (the other fields, a glossary)."""
    return options.max_lines * options.max_chars * JSON_BYTES_PER_CHARACTER + 2 ** 20


class BodyLimit:
    """An ASGI middleware that answers 413 to a request whose body is over `limit` bytes (`file_limit` for an
    upload to FILE_PATH): at once when its Content-Length says so, and when the bytes read pass it otherwise (a
    chunked body), reading no further."""

    def __init__(self, app, limit: int, file_limit: int):
        self.app, self.limit, self.file_limit = app, limit, file_limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        upload = scope["path"] == FILE_PATH
        limit = self.file_limit if upload else self.limit
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            return await answer(413, refusal(int(declared), limit, upload), {"connection": "close"})(
                scope, receive, send)
        received = 0

        async def counted():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:  # FastAPI answers it (mt/serve/errors.py)
                raise ApiError(413, refusal(received, limit, upload, "at least "), {"connection": "close"})
            return message
        await self.app(scope, counted, send)


def refusal(size: int, limit: int, upload: bool, bound: str = "") -> str:
    if upload:
        return (f"the upload is {bound}{size:,} bytes; the limit is {limit:,} (--max-file-bytes, and "
                f"{FORM_ROOM // 1024} KiB for the form): send a smaller file")
    return (f"the body is {bound}{size:,} bytes; the limit is {limit:,} (from --max-lines and --max-chars): "
            f"send the lines in several requests")
