"""The Connect protocol (v1, JSON codec) as the e2b SDK speaks it to envd.

Unary: ``application/json`` body in, JSON out; errors are a non-200 status with
``{"code", "message"}``. Streams (``application/connect+json``): every message is an envelope
``[flags:1][len:u32 BE][json]``; a response stream ends with one envelope flagged 0x02 holding
``{}`` or ``{"error": {...}}`` and the HTTP status stays 200.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

from . import aio, log
from .config import AgentConfig
from .http import ClientGone, HttpError, Request, Response
from .rpc import Message, RpcError
from .users import User, lookup_user

FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02
MAX_MESSAGE = 16 << 20
DEFAULT_KEEPALIVE = 90.0

# https://connectrpc.com/docs/protocol/#error-codes
HTTP_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}


# What connect-go answers when the Connect-Timeout-Ms deadline passes (Go's ctx error text).
DEADLINE_EXCEEDED = RpcError("deadline_exceeded", "context deadline exceeded")


def dumps(msg: Message) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode()


def envelope(msg: Message, flags: int = 0) -> bytes:
    payload = dumps(msg)
    return struct.pack(">BI", flags, len(payload)) + payload


class EnvelopeReader:
    """Splits a byte stream into ``(flags, payload)`` envelopes."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        out: list[tuple[int, bytes]] = []
        while len(self._buf) >= 5:
            flags, size = struct.unpack_from(">BI", self._buf)
            if size > MAX_MESSAGE:
                raise RpcError("resource_exhausted", f"message of {size} bytes is too large")
            if len(self._buf) < 5 + size:
                break
            out.append((flags, bytes(self._buf[5 : 5 + size])))
            del self._buf[: 5 + size]
        return out

    @property
    def pending(self) -> bool:
        return bool(self._buf)


# -- per-call context -------------------------------------------------------------------------


def user_from_authorization(header: str | None, default_user: str) -> User:
    """``Authorization: Basic base64("<user>:")`` as the SDK sends it; absent → the default.

    Here rather than in ``users``: reading the header and failing as Connect does belong to
    the protocol; ``users`` only knows /etc/passwd."""
    name = default_user
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            raise RpcError("unauthenticated", "unsupported authorization scheme")
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise RpcError("unauthenticated", "malformed basic authorization") from None
        name = decoded.partition(":")[0]
    user = lookup_user(name)
    if user is None:
        raise RpcError("unauthenticated", f"invalid username: '{name}'")
    return user


class Call:
    """What a method may need from the HTTP request besides its message."""

    def __init__(self, req: Request, config: AgentConfig) -> None:
        self.req = req
        self.config = config
        self._user: User | None = None

    def authenticate(self) -> None:
        """Like envd's authn middleware: a Basic user that does not exist fails any call."""
        if self.req.header("authorization"):
            _ = self.user

    @property
    def user(self) -> User:
        """The caller's user: ``Authorization: Basic base64("<user>:")`` or the default."""
        if self._user is None:
            self._user = user_from_authorization(
                self.req.header("authorization") or None, self.config.default_user
            )
        return self._user

    @property
    def timeout(self) -> float | None:
        raw = self.req.header("connect-timeout-ms")
        try:
            ms = int(raw)
        except ValueError:
            return None
        return ms / 1000 if ms > 0 else None

    @property
    def keepalive_interval(self) -> float:
        try:
            seconds = int(self.req.header("keepalive-ping-interval"))
        except ValueError:
            return DEFAULT_KEEPALIVE
        return float(seconds) if seconds > 0 else DEFAULT_KEEPALIVE


UnaryMethod = Callable[[Message, Call], Awaitable[Message]]
ServerStreamMethod = Callable[[Message, Call], AsyncGenerator[Message, None]]
ClientStreamMethod = Callable[[AsyncIterator[Message], Call], Awaitable[Message]]
HttpHandler = Callable[[Request, Response], Awaitable[None]]


def _media_type(req: Request) -> str:
    return req.header("content-type").split(";", 1)[0].strip().lower()


def _decode(payload: bytes) -> Message:
    if not payload:
        return {}
    try:
        msg = json.loads(payload)
    except ValueError as e:
        raise RpcError("invalid_argument", f"unmarshal message: {e}") from None
    if not isinstance(msg, dict):
        raise RpcError("invalid_argument", "message must be a JSON object")
    return msg


def _check_encoding(req: Request, header: str) -> bool:
    """True for a gzip-compressed body; identity otherwise; anything else is refused."""
    enc = req.header(header).strip().lower()
    if enc in ("", "identity"):
        return False
    if enc == "gzip":
        return True
    raise RpcError("unimplemented", f"unknown compression {enc!r}: supported: gzip, identity")


def _gunzip(data: bytes) -> bytes:
    import zlib

    try:
        return zlib.decompress(data, 47)
    except zlib.error as e:
        raise RpcError("invalid_argument", f"decompress message: {e}") from None


def _internal(e: BaseException) -> RpcError:
    log.exception("rpc failed", exc_info=e)
    return RpcError("internal", f"{type(e).__name__}: {e}")


def unary(method: UnaryMethod, config: AgentConfig) -> HttpHandler:
    async def handle(req: Request, resp: Response) -> None:
        if _media_type(req) != "application/json":
            raise HttpError(415, f"unsupported content type {req.header('content-type')!r}")
        try:
            gz = _check_encoding(req, "content-encoding")
            body = await req.read_body(MAX_MESSAGE)
            msg = _decode(_gunzip(body) if gz else body)
            call = Call(req, config)
            call.authenticate()
            async with aio.timeout(call.timeout):
                out = await method(msg, call)
        except TimeoutError:
            await resp.send_json(504, DEADLINE_EXCEEDED.to_json())
            return
        except RpcError as e:
            await resp.send_json(HTTP_STATUS.get(e.code, 500), e.to_json())
            return
        except HttpError:
            raise
        except Exception as e:
            err = _internal(e)
            await resp.send_json(500, err.to_json())
            return
        await resp.send(200, dumps(out), "application/json")

    return handle


async def _read_single(req: Request) -> Message:
    gz = _check_encoding(req, "connect-content-encoding")
    reader = EnvelopeReader()
    messages: list[tuple[int, bytes]] = []
    while chunk := await req.read_chunk():
        messages += reader.feed(chunk)
    if reader.pending:
        raise RpcError("invalid_argument", "incomplete envelope")
    if len(messages) != 1:
        raise RpcError("invalid_argument", f"expected one request message, got {len(messages)}")
    flags, payload = messages[0]
    if flags & FLAG_COMPRESSED:
        if not gz:
            raise RpcError("internal", "compressed message without connect-content-encoding")
        payload = _gunzip(payload)
    return _decode(payload)


class _StreamWriter:
    """Starts the chunked 200 response lazily and frames messages."""

    def __init__(self, resp: Response) -> None:
        self.resp = resp

    async def _start(self) -> None:
        if not self.resp.started:
            await self.resp.start(200, [("Content-Type", "application/connect+json")])

    async def message(self, msg: Message) -> None:
        await self._start()
        await self.resp.write(envelope(msg))

    async def finish(self, error: RpcError | None) -> None:
        await self._start()
        end: Message = {"error": error.to_json()} if error else {}
        await self.resp.write(envelope(end, FLAG_END_STREAM))
        await self.resp.end()


def _check_stream_type(req: Request) -> None:
    if _media_type(req) != "application/connect+json":
        raise HttpError(415, f"unsupported content type {req.header('content-type')!r}")


def server_stream(method: ServerStreamMethod, config: AgentConfig) -> HttpHandler:
    async def handle(req: Request, resp: Response) -> None:
        _check_stream_type(req)
        out = _StreamWriter(resp)
        error: RpcError | None = None
        try:
            msg = await _read_single(req)
            call = Call(req, config)
            call.authenticate()
            gen = method(msg, call)
            try:
                async with aio.timeout(call.timeout):
                    async for item in gen:
                        await out.message(item)
            finally:
                await gen.aclose()
        except TimeoutError:
            error = DEADLINE_EXCEEDED
        except RpcError as e:
            error = e
        except (aio.CancelledError, HttpError, ClientGone, ConnectionError):
            raise
        except Exception as e:
            error = _internal(e)
        await out.finish(error)

    return handle


def client_stream(method: ClientStreamMethod, config: AgentConfig) -> HttpHandler:
    async def handle(req: Request, resp: Response) -> None:
        _check_stream_type(req)

        async def messages() -> AsyncIterator[Message]:
            gz = _check_encoding(req, "connect-content-encoding")
            reader = EnvelopeReader()
            while chunk := await req.read_chunk():
                for flags, payload in reader.feed(chunk):
                    if flags & FLAG_END_STREAM:
                        return
                    if flags & FLAG_COMPRESSED:
                        if not gz:
                            raise RpcError("internal", "compressed message without encoding")
                        payload = _gunzip(payload)
                    yield _decode(payload)
            if reader.pending:
                raise RpcError("invalid_argument", "incomplete envelope")

        out = _StreamWriter(resp)
        try:
            call = Call(req, config)
            call.authenticate()
            async with aio.timeout(call.timeout):
                result = await method(messages(), call)
        except TimeoutError:
            await out.finish(DEADLINE_EXCEEDED)
            return
        except RpcError as e:
            await out.finish(e)
            return
        except (aio.CancelledError, HttpError, ClientGone, ConnectionError):
            raise
        except Exception as e:
            await out.finish(_internal(e))
            return
        await out.message(result)
        await out.finish(None)

    return handle
