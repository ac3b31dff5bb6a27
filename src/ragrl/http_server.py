"""What both HTTP services (`serve-retriever`, `serve-kg`) share: bounded request reading, safe
JSON decoding, and a uvicorn server with read timeouts.

Limits are enforced while a request is being read, not after:
- a `Content-Length` above `max_body_bytes` gets 413 before any of the body is read, and a
  chunked body is cut off with 413 as soon as it passes the limit, so a 100 MB body never sits
  in memory;
- a client that sends its request headers slower than `header_timeout_s` (slowloris) gets 408
  and its connection is closed; one whose body does not arrive within `body_timeout_s` gets 408;
- JSON nested deeper than the decoder's recursion limit, or integers over Python's 4300-digit
  conversion limit, are answered with 400 and a message instead of a 500.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ragrl.errors import InputError


@dataclass(frozen=True)
class HttpLimits:
    max_body_bytes: int = 8 * 1024 * 1024
    header_timeout_s: float = 10.0  # from connection (or the previous response) to complete headers
    body_timeout_s: float = 30.0  # from complete headers to complete body

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1 or self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise InputError(f"HTTP limits must be positive, got {self}")

    def as_dict(self) -> dict[str, float]:
        return {"max_body_bytes": self.max_body_bytes, "header_timeout_s": self.header_timeout_s,
                "body_timeout_s": self.body_timeout_s}


class BadBody(ValueError):
    """A request body that is not acceptable JSON; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def parse_json_body(raw: bytes) -> Any:
    """Decode a JSON body; every way it can fail is a BadBody with a message a client can act on.

    json.loads raises RecursionError on deep nesting and a plain ValueError on integers beyond
    Python's digit limit; both used to escape as 500s.
    """
    try:
        return json.loads(raw)
    except RecursionError:
        return _raise(BadBody("request body is nested too deeply to be a valid request"))
    except UnicodeDecodeError as exc:
        return _raise(BadBody(f"request body is not valid JSON: not UTF-8 ({exc.reason} at byte {exc.start})"))
    except ValueError as exc:  # JSONDecodeError and the integer digit limit
        return _raise(BadBody(f"request body is not valid JSON: {str(exc)[:200]}"))


def _raise(exc: Exception):
    raise exc


def unencodable_at(text: str) -> int | None:
    """Index of the first character that cannot be UTF-8 encoded (a lone surrogate), else None.

    Such a string is valid JSON ("\\ud800") but cannot be tokenized, searched or echoed back in a
    UTF-8 response, so it is rejected per item before it reaches shared work.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


# --------------------------------------------------------------------------- body limit + timeout


async def _send_error(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    """Reads each request body up front, within `max_body_bytes` and `body_timeout_s`, then hands
    the app a replay of it. Pure ASGI (no BaseHTTPMiddleware) so nothing buffers before the check."""

    def __init__(self, app: ASGIApp, limits: HttpLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits.max_body_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _send_error(send, 413, f"request body has {declared} bytes, limit {limit}")
            return
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + self.limits.body_timeout_s
        more = True
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                await _send_error(send, 408, f"request body not received within {self.limits.body_timeout_s:g} s")
                return
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _send_error(send, 413, f"request body exceeds the limit of {limit} bytes")
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _raw_response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


def header_timeout_protocol(timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol with a deadline for request headers.

    uvicorn times out idle keep-alive connections but not a request whose headers trickle in, so
    one slow client could hold a connection (and its memory) forever. The timer runs whenever the
    connection is between requests and is disarmed by the next request's headers.
    """
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class HeaderTimeoutProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None
        _waiting_after: Any = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._header_timer is None and self._between_requests():
                self._arm()
            super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            super().connection_lost(exc)

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            self._waiting_after = self.cycle  # a new cycle object means new headers arrived
            self._header_timer = self.loop.call_later(timeout_s, self._expire)

        def _expire(self) -> None:
            self._header_timer = None
            if self.cycle is self._waiting_after and self._between_requests() and not self.transport.is_closing():
                # Raw bytes: h11 is mid-request and cannot frame a response for it.
                self.transport.write(_raw_response(408, "Request Timeout",
                                                   f"request headers not received within {timeout_s:g} s"))
                self.transport.close()

    return HeaderTimeoutProtocol


def uvicorn_config(app, limits: HttpLimits, *, host: str = "127.0.0.1", port: int = 0, log_level: str = "info"):
    """The one uvicorn configuration both services run under (CLI and BackgroundServer alike)."""
    import uvicorn

    return uvicorn.Config(BodyLimitMiddleware(app, limits), host=host, port=port, log_level=log_level,
                          lifespan="on", workers=1, http=header_timeout_protocol(limits.header_timeout_s))


def run(app, limits: HttpLimits, host: str, port: int, log_level: str = "info") -> None:
    """Serve until interrupted."""
    import uvicorn

    uvicorn.Server(uvicorn_config(app, limits, host=host, port=port, log_level=log_level)).run()


class BackgroundServer:
    """Runs an app under uvicorn in a daemon thread (tests, or a trainer hosting its own service).

    Binds the socket itself, so port=0 gives a free ephemeral port with no race to find one.
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                 limits: HttpLimits | None = None) -> None:
        import uvicorn

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = self._sock.getsockname()[:2]
        limits = limits or getattr(getattr(app, "state", None), "http_limits", None) or HttpLimits()
        self.server = uvicorn.Server(uvicorn_config(app, limits, log_level=log_level))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server at {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
