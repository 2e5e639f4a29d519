"""The data plane: authorize a request for a sandbox and stream it to the sandbox's agent.

A request is for a sandbox when it carries ``E2b-Sandbox-Id`` (what the SDK sends, with
``E2b-Sandbox-Port``), when its Host is ``{port}-{sandboxID}.{domain}``, or when it is a signed
``/files`` URL (``download_url()``/``upload_url()`` carry no sandbox id, so the sandbox is the one
whose access token reproduces the signature).

Port 49983 is envd, served by the agent on its unix socket; any other port is a TCP service inside
the sandbox's network namespace, reached through a ``CONNECT`` tunnel the agent opens. Both
directions stream (h11 on a raw socket, no buffering): Connect server streams can last as long
as a command, uploads and downloads can be large.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import h11

from sandhold.config import Settings
from sandhold.e2b.agent_conns import AgentConnections
from sandhold.e2b.auth import EXPIRED, check_envd_access, check_traffic_access, signature_error
from sandhold.e2b.connect_stream import Envelopes, send_stream_error, start_envs
from sandhold.e2b.errors import e2b_status
from sandhold.e2b.file_audit import FileAudit, FileOpRecord, file_op
from sandhold.envd import ENVD_PORT
from sandhold.envd.transports import check_tunnel_reply, tunnel_request
from sandhold.errors import (
    Forbidden,
    InvalidRequest,
    PortClosed,
    SandboxGone,
    SandholdError,
    Unauthenticated,
)
from sandhold.service import Sandbox, SandboxService
from sandhold.service.limits import check_env

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Any
Send = Any

READ_CHUNK = 256 * 1024
HOST_RE = re.compile(r"^(\d{1,5})-([a-z0-9]+)(?:-[a-z0-9]+)?\.")
# Hop-by-hop headers: never passed on by a relay (this one, a fleet's edge).
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"expect",
    }
)
# Those, our routing headers and the tokens: none of them is for the sandbox.
DROP_REQUEST = HOP_BY_HOP | frozenset(
    {
        b"host",
        b"x-access-token",
        b"e2b-traffic-access-token",
        b"e2b-sandbox-id",
        b"e2b-sandbox-port",
    }
)
DROP_RESPONSE = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding"})
CONNECT_STREAM = b"application/connect+"  # the content type of Connect's streamed responses
HOST_ONLY = "/sandhold/"  # the agent's routes for the host alone (a checkpoint's quiesce)
START = "/process.Process/Start"  # commands.run, background commands and PTYs

log = logging.getLogger(__name__)
# Set when this request's response was cut off on purpose (see ``_exchange``), for
# ``DeliberateAbort``: the server's log then has our line, not the server's generic complaint.
aborted: contextvars.ContextVar[bool] = contextvars.ContextVar("sandhold_aborted", default=False)


@dataclass
class Target:
    sandbox_id: str | None  # None: a signed /files URL, whose sandbox the signature names
    port: int  # 0 when the request named an invalid port


def route(scope: Scope) -> Target | None:
    """Which sandbox and port a request is for, or None for the control plane."""
    sandbox_id = port = host = None
    for key, value in scope["headers"]:
        if key == b"e2b-sandbox-id":
            sandbox_id = value.decode("latin-1")
        elif key == b"e2b-sandbox-port":
            port = value.decode("latin-1")
        elif key == b"host":
            host = value.decode("latin-1")
    if sandbox_id is not None:
        return Target(sandbox_id, _port(port) if port is not None else ENVD_PORT)
    if host and (m := HOST_RE.match(host)):
        return Target(m.group(2), _port(m.group(1)))
    if scope["path"] == "/files" and b"signature=" in scope["query_string"]:
        return Target(None, ENVD_PORT)
    return None


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        return 0
    return port if 0 < port < 65536 else 0


def gone(sandbox_id: str) -> SandboxGone:
    return SandboxGone("The sandbox was not found", sandbox_id)


def answer(e: SandholdError, target: Target) -> tuple[int, dict[str, Any]]:
    """E2B's proxy answers: the SDK keys on "was not found" (is_running() -> False) and on
    "port is not open"."""
    if isinstance(e, SandboxGone):
        return 502, {"sandboxId": e.sandbox_id, "message": e.message, "code": 502}
    if isinstance(e, PortClosed):  # only for ports other than envd's, so for a named sandbox
        return 502, {
            "sandboxId": target.sandbox_id,
            "port": e.port,
            "code": 502,
            "message": "The sandbox is running but port is not open",
        }
    status = e2b_status(e)
    return status, {"code": status, "message": e.message}


async def open_tunnel(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int
) -> None:
    """Ask the agent for a raw byte stream to ``127.0.0.1:port`` inside the sandbox."""
    writer.write(tunnel_request(port))
    await writer.drain()
    check_tunnel_reply(await reader.readuntil(b"\r\n\r\n"), port)


async def send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


class DeliberateAbort(logging.Filter):
    """Drops uvicorn's "returned without completing response" for a response ``_exchange`` cut
    off on purpose: for a plain HTTP body that broke mid-way, closing the client's connection
    is the only signal HTTP has (and what E2B's proxy does), and ASGI has no other way to
    close it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (aborted.get() and "without completing response" in record.getMessage())


class DataPlane:
    def __init__(self, service: SandboxService, settings: Settings) -> None:
        self.service = service
        self.settings = settings
        self.file_audit = FileAudit(settings.data_dir)
        self.agents = AgentConnections(READ_CHUNK)

    async def __call__(self, scope: Scope, receive: Receive, send: Send, target: Target) -> None:
        try:
            sbx = await self._admit(scope, target)
            if target.port == ENVD_PORT and scope["path"].startswith(HOST_ONLY):
                raise Forbidden(f"{scope['path']} is the host's, not the sandbox API's")
            if target.port == ENVD_PORT and scope["method"] == "POST" and scope["path"] == START:
                try:
                    receive = await self._bounded_start(scope, receive)
                except InvalidRequest as e:  # as envd answers a stream's invalid argument
                    await send_stream_error(send, "invalid_argument", e.message)
                    return
            op = file_op(scope["method"], scope["path"]) if target.port == ENVD_PORT else None
            if op is None:
                await self._forward(scope, receive, send, sbx, target.port)
                return
            record = FileOpRecord(scope, sbx, op)
            try:
                await self._forward(
                    *_observed(scope, receive, send, record, self.file_audit), sbx, target.port
                )
            finally:
                self.file_audit.write(record)  # once: a no-op if the response completed
        except (SandboxGone, PortClosed, Unauthenticated, Forbidden, InvalidRequest) as e:
            await send_json(send, *answer(e, target))

    async def _admit(self, scope: Scope, target: Target) -> Sandbox:
        if not target.port:
            raise InvalidRequest("invalid sandbox port")
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        query = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
        method, path = scope["method"], scope["path"]
        if target.sandbox_id is None:
            sbx = await self._by_signature(method, query)
        else:
            # on the loop: a thread's round trip was a tenth of a command's
            found = self.service.peek(target.sandbox_id) or await self.service.get(
                target.sandbox_id
            )
            if found is None:
                raise gone(target.sandbox_id)
            sbx = found
            if target.port == ENVD_PORT:
                check_envd_access(sbx.life.access_token, method, path, headers, query)
            else:
                check_traffic_access(sbx.life.traffic_token, sbx.life.access_token, headers)
        if not sbx.running:
            resumed = await self.service.auto_resume(sbx.id)
            if resumed is None or not resumed.running:
                raise gone(sbx.id)
            sbx = resumed
        return sbx

    async def _bounded_start(self, scope: Scope, receive: Receive) -> Receive:
        """A command's environment gets the bounds of a create's (service/limits.py): the
        agent runs whatever it is given, and 3,000 variables of 1 KB fail at execve (E2BIG).
        The request is read whole (it is small) and passed on as it came."""
        limit, body = self.settings.server_max_body_bytes, bytearray()
        more = True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                break
            body += msg.get("body", b"")
            if len(body) > limit:
                raise InvalidRequest(
                    f"the request body is over {limit} bytes (setting server_max_body_bytes)"
                )
            more = msg.get("more_body", False)
        envs = start_envs(bytes(body), dict(scope["headers"]), limit)
        if envs is not None:
            check_env(envs, self.settings, "the command's environment (process.envs)")
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # the client's disconnect, when it comes
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        return replay

    async def _by_signature(self, method: str, query: dict[str, str]) -> Sandbox:
        for sbx in await self.service.query():
            why = signature_error(sbx.life.access_token, method, query)
            if why is None:
                return sbx
            if why == EXPIRED:  # its signature, then: only the time is wrong
                raise Unauthenticated(why)
        raise Unauthenticated("invalid signature")

    async def _forward(
        self, scope: Scope, receive: Receive, send: Send, sbx: Sandbox, port: int
    ) -> None:
        path = str(sbx.info.agent_socket)
        try:
            if port == ENVD_PORT:
                reader, writer = await self.agents.checkout(path)
            else:  # a tunnel's connection is the tunnel's
                reader, writer = await asyncio.open_unix_connection(path, limit=READ_CHUNK)
        except OSError:
            raise gone(sbx.id) from None
        clean = False
        try:
            if port != ENVD_PORT:
                try:
                    await open_tunnel(reader, writer, port)
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    raise gone(sbx.id) from None
            clean = await self._exchange(scope, receive, send, reader, writer, sbx, port)
        finally:
            if clean and port == ENVD_PORT:
                self.agents.checkin(path, (reader, writer))
            else:
                writer.close()

    async def _exchange(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        sbx: Sandbox,
        port: int,
    ) -> bool:
        """Pass one request and its response on; True if both ended whole and the connection
        may carry another (HTTP/1.1 keep-alive)."""
        headers = passed_on(scope, DROP_REQUEST)
        host = dict(scope["headers"]).get(b"host", b"sandbox")
        network = sbx.life.surface.get("network") or {}
        mask = network.get("maskRequestHost") if port != ENVD_PORT else None
        if mask:
            host = mask.replace("${PORT}", str(port)).encode()
        target = scope.get("raw_path") or scope["path"].encode()
        if scope["query_string"]:
            target += b"?" + scope["query_string"]
        return await exchange(
            scope, receive, send, reader, writer, [(b"host", host), *headers], target, sbx.id
        )


def passed_on(scope: Scope, drop: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
    """The request's headers but ``drop``; a body of unknown length goes on chunked (h11
    frames it)."""
    headers = [(k, v) for k, v in scope["headers"] if k not in drop]
    names = {k for k, _ in scope["headers"]}
    if b"transfer-encoding" in names and b"content-length" not in names:
        headers.append((b"transfer-encoding", b"chunked"))
    return headers


async def exchange(
    scope: Scope,
    receive: Receive,
    send: Send,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    headers: list[tuple[bytes, bytes]],
    target: bytes,
    sandbox_id: str,
) -> bool:
    """Pass one request (with ``headers``, to ``target``) and its response on over an open
    HTTP/1.1 connection; True if both ended whole and the connection may carry another. Used
    by the data plane (to a sandbox's agent) and by a fleet's edge (to a host)."""
    conn = h11.Connection(h11.CLIENT)

    async def send_event(event: Any) -> None:
        data = conn.send(event)
        if data:
            writer.write(data)
            await writer.drain()

    names = {k for k, _ in scope["headers"]}
    has_body = b"content-length" in names or b"transfer-encoding" in names
    client_gone = asyncio.Event()

    async def pump_request() -> None:
        """Stream the request body up, then watch for the client going away: that must end
        the upstream request too (e.g. a command's output stream)."""
        try:
            await send_event(h11.Request(method=scope["method"], target=target, headers=headers))
            more = has_body
            while more:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    break
                if msg.get("body"):
                    await send_event(h11.Data(data=msg["body"]))
                more = msg.get("more_body", False)
            else:
                await send_event(h11.EndOfMessage())
                while (await receive())["type"] != "http.disconnect":
                    pass
            client_gone.set()
            writer.close()
        except (OSError, h11.LocalProtocolError):
            pass  # upstream went away while we wrote; the response side reports it

    pump = asyncio.create_task(pump_request())
    started = False
    stream: Envelopes | None = None  # a Connect stream's framing
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(READ_CHUNK))
            elif isinstance(event, h11.Response):
                headers = [(k, v) for k, v in event.headers if k not in DROP_RESPONSE]
                ctype = dict(headers).get(b"content-type", b"")
                stream = Envelopes() if ctype.startswith(CONNECT_STREAM) else None
                await send(
                    {
                        "type": "http.response.start",
                        "status": event.status_code,
                        "headers": headers,
                    }
                )
                started = True
            elif isinstance(event, h11.Data):
                data = stream.feed(event.data) if stream else bytes(event.data)
                if data:
                    await send({"type": "http.response.body", "body": data, "more_body": True})
            elif isinstance(event, h11.EndOfMessage):
                rest = bytes(stream.buf) if stream else b""  # a stream that ends whole: b""
                await send({"type": "http.response.body", "body": rest, "more_body": False})
                return conn.our_state is h11.DONE and conn.their_state is h11.DONE
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionResetError("the agent closed the connection")
            # InformationalResponse (1xx): nothing to pass on
    except (OSError, h11.RemoteProtocolError):
        if client_gone.is_set():
            return False
        if not started:
            raise gone(sandbox_id) from None
        # Mid-response: the sandbox was killed (or its agent died) under an open stream.
        if stream is not None and stream.ended:  # (its end had come: nothing is lost)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return False
        # Cut off, a Connect stream too, as E2B's proxy resets the stream of a sandbox that
        # dies: returning without completing the response makes the server close the
        # client's connection, which is how both SDKs learn that the response broke (they
        # then probe /health, which answers 502 for a gone sandbox, and say it was killed;
        # the JavaScript SDK probes on a cut connection only, not on an error envelope).
        log.info(
            "sandbox %s: its side of %s %s ended mid-response; closing the client's connection",
            sandbox_id,
            scope["method"],
            scope["path"],
        )
        aborted.set(True)
        return False
    finally:
        pump.cancel()
        with contextlib.suppress(BaseException):
            await pump


def _observed(
    scope: Scope, receive: Receive, send: Send, record: FileOpRecord, file_audit: FileAudit
) -> tuple[Scope, Receive, Send]:
    """``receive`` and ``send`` that show the file operation's bytes to its audit record, which
    is written before the client sees the end of the response."""

    async def observed_receive() -> Message:
        msg: Message = await receive()
        if msg["type"] == "http.request":
            record.request_body(msg.get("body", b""))
        return msg

    async def observed_send(msg: Message) -> None:
        if msg["type"] == "http.response.start":
            record.response_start(msg["status"], msg.get("headers", []))
        elif msg["type"] == "http.response.body" and record.response_body(
            msg.get("body", b""), msg.get("more_body", False)
        ):
            file_audit.write(record)
        await send(msg)

    return scope, observed_receive, observed_send
