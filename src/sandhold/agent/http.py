"""A small HTTP/1.1 server: h11 over the agent loop's unix-socket streams (``aio``).

Handlers get a :class:`Request` whose body they pull chunk by chunk (so uploads stream to disk
and client-streaming RPCs see each message as it arrives) and a :class:`Response` they either
send whole or stream (chunked transfer encoding when no length is given). Once a handler has
consumed the request body, the connection watches the socket for EOF so that a client going
away cancels a long stream instead of leaving it to find out on its next write.

``CONNECT`` goes to the router's ``tunnel`` handler, which answers and then takes the raw
connection over (``Request.take_over``); what may be tunnelled is that handler's business.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import h11

from . import aio, log

READ_SIZE = 65536
MAX_HEADER_BYTES = 65536
# How much of an unread request body we discard to keep a connection alive after a response.
DRAIN_LIMIT = 4 << 20

Handler = Callable[["Request", "Response"], Awaitable[None]]
Streams = tuple[aio.StreamReader, aio.StreamWriter]

_REASONS = {
    100: b"Continue",
    200: b"OK",
    204: b"No Content",
    400: b"Bad Request",
    401: b"Unauthorized",
    403: b"Forbidden",
    404: b"Not Found",
    405: b"Method Not Allowed",
    406: b"Not Acceptable",
    409: b"Conflict",
    413: b"Content Too Large",
    415: b"Unsupported Media Type",
    429: b"Too Many Requests",
    499: b"Client Closed Request",
    500: b"Internal Server Error",
    501: b"Not Implemented",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
    507: b"Insufficient Storage",
}


def percent_decode(s: str, plus: bool = False, encoding: str = "utf-8") -> str:
    """URL percent-decoding (and ``+`` → space in query strings), without urllib.parse, which
    would import ipaddress and more for nothing."""
    if plus:
        s = s.replace("+", " ")
    if "%" not in s:
        return s
    out = bytearray()
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == "%" and _is_hex(s[i + 1 : i + 3]):
            out.append(int(s[i + 1 : i + 3], 16))
            i += 3
        else:
            out += c.encode("utf-8")
            i += 1
    return out.decode(encoding, "replace")


def percent_encode(s: str) -> str:
    return "".join(
        chr(b) if (chr(b).isalnum() and b < 128) or chr(b) in "-._~" else f"%{b:02X}"
        for b in s.encode("utf-8")
    )


def _is_hex(s: str) -> bool:
    return len(s) == 2 and all(c in "0123456789abcdefABCDEF" for c in s)


class HttpError(Exception):
    """Raised by handlers for a plain JSON error response ``{"code": status, "message": ...}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ClientGone(Exception):
    """The client closed the connection while we were still reading or writing."""


class Request:
    def __init__(self, conn: _Connection, event: h11.Request) -> None:
        self._conn = conn
        self.method = event.method.decode("ascii", "replace")
        target = event.target.decode("utf-8", "replace")
        raw_path, _, query = target.partition("?")
        self.path = percent_decode(raw_path)
        self.query: dict[str, str] = {}
        for pair in query.split("&"):
            if pair:
                k, _, v = pair.partition("=")
                self.query.setdefault(percent_decode(k, plus=True), percent_decode(v, plus=True))
        self.headers: dict[str, str] = {}
        for name, value in event.headers:
            key = name.decode("latin-1").lower()
            val = value.decode("latin-1")
            self.headers[key] = f"{self.headers[key]}, {val}" if key in self.headers else val
        self.body_done = False
        self.body_done_event = aio.Event()

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)

    def header_utf8(self, name: str, default: str = "") -> str:
        """A header value decoded as UTF-8 (h11 hands us bytes; we keep latin-1 by default)."""
        value = self.headers.get(name.lower())
        if value is None:
            return default
        return value.encode("latin-1").decode("utf-8", "surrogateescape")

    async def read_chunk(self) -> bytes:
        """The next piece of the request body; ``b""`` once it is complete."""
        while not self.body_done:
            event = await self._conn.next_event()
            if isinstance(event, h11.Data):
                if event.data:
                    return bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._finish_body()
            else:
                raise ClientGone("connection closed while reading the request body")
        return b""

    async def read_body(self, limit: int) -> bytes:
        parts: list[bytes] = []
        size = 0
        while chunk := await self.read_chunk():
            size += len(chunk)
            if size > limit:
                raise HttpError(413, f"request body larger than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    def _finish_body(self) -> None:
        self.body_done = True
        self.body_done_event.set()

    def take_over(self) -> tuple[Streams, bytes]:
        """For a CONNECT handler that has answered: the connection's raw streams, and the bytes
        the client sent right after the request (the first bytes of the tunnel)."""
        conn = self._conn
        leftover, _closed = conn.h11.trailing_data
        return (conn.reader, conn.writer), leftover

    async def drain(self, limit: int) -> bool:
        """Discard the rest of the body; False if it was too long to bother."""
        size = 0
        while chunk := await self.read_chunk():
            size += len(chunk)
            if size > limit:
                return False
        return True


class Response:
    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self.started = False
        self.finished = False
        self.status = 0

    async def start(self, status: int, headers: Iterable[tuple[str, str]] = ()) -> None:
        """Send the status line and headers. Without Content-Length the body is chunked."""
        self.started = True
        self.status = status
        hdrs = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        reason = _REASONS.get(status, b"")
        await self._conn.send(h11.Response(status_code=status, headers=hdrs, reason=reason))

    async def write(self, data: bytes) -> None:
        if data:
            await self._conn.send(h11.Data(data=data))

    async def end(self) -> None:
        self.finished = True
        await self._conn.send(h11.EndOfMessage())

    async def send(
        self,
        status: int,
        body: bytes = b"",
        content_type: str | None = None,
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        hdrs = list(headers)
        if content_type:
            hdrs.append(("Content-Type", content_type))
        if status != 204:  # a 204 carries no body and must not announce one
            hdrs.append(("Content-Length", str(len(body))))
        await self.start(status, hdrs)
        await self.write(body)
        await self.end()

    async def send_json(
        self, status: int, obj: Any, headers: Iterable[tuple[str, str]] = ()
    ) -> None:
        body = json.dumps(obj, separators=(",", ":")).encode()
        await self.send(status, body, "application/json", headers)

    async def send_error(self, status: int, message: str) -> None:
        await self.send_json(status, {"code": status, "message": message})


class Router:
    def __init__(self) -> None:
        self._routes: dict[str, dict[str, Handler]] = {}
        self.tunnel: Handler | None = None  # serves CONNECT, whatever the authority

    def add(self, method: str, path: str, handler: Handler) -> None:
        self._routes.setdefault(path, {})[method] = handler

    async def dispatch(self, req: Request, resp: Response) -> None:
        methods = self._routes.get(req.path)
        if methods is None:
            raise HttpError(404, f"no route for {req.path}")
        handler = methods.get(req.method)
        if handler is None:
            raise HttpError(405, f"method {req.method} not allowed for {req.path}")
        await handler(req, resp)


class _Connection:
    def __init__(self, router: Router, reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
        self.router = router
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        self.closing = False

    async def next_event(self) -> Any:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            if self.h11.they_are_waiting_for_100_continue:
                await self.send(h11.InformationalResponse(status_code=100, headers=[]))
            try:
                data = await self.reader.read(READ_SIZE)
            except ConnectionError:
                data = b""
            self.h11.receive_data(data)

    async def send(self, event: Any) -> None:
        data = self.h11.send(event)
        if data:
            self.writer.write(data)
            try:
                await self.writer.drain()
            except ConnectionError as e:
                raise ClientGone(str(e)) from None

    async def serve(self) -> None:
        try:
            while not self.closing:
                try:
                    event = await self.next_event()
                except h11.RemoteProtocolError as e:
                    await self._protocol_error(e)
                    return
                if isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                    return
                if not isinstance(event, h11.Request):
                    return
                req, resp = Request(self, event), Response(self)
                if req.method == "CONNECT":
                    await self._tunnel(req, resp)
                    return
                await self._run(req, resp)
                if self.closing or self.h11.our_state is not h11.DONE:
                    return
                if not req.body_done and not await req.drain(DRAIN_LIMIT):
                    return
                if self.h11.their_state is not h11.DONE:
                    return
                self.h11.start_next_cycle()
        except (ClientGone, ConnectionError, h11.ProtocolError):
            pass
        except aio.CancelledError:
            raise
        except Exception:
            log.exception("connection failed")
        finally:
            self.writer.close()

    async def _run(self, req: Request, resp: Response) -> None:
        task = aio.ensure_future(self._handle(req, resp))
        try:
            while not task.done():
                if not req.body_done:
                    # The handler owns the socket reader until the body is consumed.
                    body = aio.ensure_future(req.body_done_event.wait())
                    await aio.wait({task, body}, return_when=aio.FIRST_COMPLETED)
                    body.cancel()
                    continue
                watch = aio.ensure_future(self._watch_disconnect())
                await aio.wait({task, watch}, return_when=aio.FIRST_COMPLETED)
                if task.done():
                    watch.cancel()
                    await aio.gather(watch, return_exceptions=True)
                    break
                # The client went away mid-response: stop the handler (a running command
                # keeps running; only its stream ends) and drop the connection.
                task.cancel()
                await aio.gather(task, return_exceptions=True)
                self.closing = True
                return
            await task
        except aio.CancelledError:
            task.cancel()
            await aio.gather(task, return_exceptions=True)
            raise

    async def _tunnel(self, req: Request, resp: Response) -> None:
        """CONNECT: not through ``_run``, whose disconnect watch would read the socket the
        tunnel now owns; the connection closes when the handler returns."""
        await req.drain(DRAIN_LIMIT)
        if self.router.tunnel is None:
            await resp.send_error(405, f"method {req.method} not allowed")
            return
        await self.router.tunnel(req, resp)

    async def _watch_disconnect(self) -> None:
        """Returns once the peer closes; pipelined bytes are kept for the next request."""
        while True:
            try:
                data = await self.reader.read(READ_SIZE)
            except ConnectionError:
                data = b""
            self.h11.receive_data(data)
            if not data:
                return
            # A pipelining client: keep its bytes buffered, stop watching (nothing to lose).
            await aio.Event().wait()

    async def _handle(self, req: Request, resp: Response) -> None:
        try:
            await self.router.dispatch(req, resp)
        except HttpError as e:
            await self._fail(resp, e.status, e.message)
        except h11.RemoteProtocolError as e:  # e.g. a malformed chunked body
            self.closing = True
            await self._fail(resp, e.error_status_hint or 400, str(e))
        except (ClientGone, aio.CancelledError):
            raise
        except Exception as e:
            log.exception("%s %s failed", req.method, req.path)
            await self._fail(resp, 500, f"internal error: {e}")
        if resp.started and not resp.finished:
            self.closing = True  # handler left a response half-sent

    async def _fail(self, resp: Response, status: int, message: str) -> None:
        if resp.started:
            self.closing = True
            return
        await resp.send_error(status, message)

    async def _protocol_error(self, e: h11.RemoteProtocolError) -> None:
        if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            status = e.error_status_hint or 400
            body = json.dumps({"code": status, "message": str(e)}).encode()
            hdrs = [
                (b"Content-Type", b"application/json"),
                (b"Content-Length", str(len(body)).encode()),
                (b"Connection", b"close"),
            ]
            try:
                response = h11.Response(
                    status_code=status, headers=hdrs, reason=_REASONS.get(status, b"")
                )
                self.writer.write(self.h11.send(response))
                self.writer.write(self.h11.send(h11.Data(data=body)))
                self.writer.write(self.h11.send(h11.EndOfMessage()))
                await self.writer.drain()
            except (h11.ProtocolError, ConnectionError):
                pass


class HttpServer:
    """Accepts connections on a unix socket and serves each with the router."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self._tasks: set[aio.Task[None]] = set()
        self._server: aio.Server | None = None

    async def _on_connect(self, reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
        task = aio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await _Connection(self.router, reader, writer).serve()
        finally:
            self._tasks.discard(task)

    async def listen_unix(self, sock: socket.socket) -> None:
        """Serve on an already bound and listening unix socket."""
        self._server = await aio.start_unix_server(self._on_connect, sock=sock, limit=READ_SIZE)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await aio.gather(*self._tasks, return_exceptions=True)
