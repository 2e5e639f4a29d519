"""The internal MCP servers a connector relays to, one per channel.

Streamable HTTP: each JSON-RPC message is POSTed as it came (MCP's transport: ``Accept`` JSON or
an event stream, the caller's ``Mcp-Session-Id`` and ``Mcp-Protocol-Version`` passed on), and the
answer goes back with the target's status and its protocol headers. Stdio: one server process
(the ``mcp`` SDK's stdio client) that the connector initializes itself at start, since several
gateway replicas share it: their ``initialize`` is answered from the server's own result, their
``notifications/initialized`` acknowledged, and request ids rewritten so theirs cannot collide.

A failure to reach the server, or an answer above the size bound, becomes a JSON-RPC ``-32603``
error carrying ``error.data.tunnel_failure`` (the provenance shape of tunnel-client's protocol).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import re
from typing import Any

import anyio
import httpx
import mcp_types as types
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.message import SessionMessage

from sandhold.errors import PayloadTooLarge
from sandhold.tunnel.connector_config import UpstreamConfig, resolve

log = logging.getLogger(__name__)

# (and MCP 2026-07-28's routing headers, which a stateless server checks against the body)
PASSED_HEADERS = (
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
    "mcp-method",
    "mcp-name",
)
# a value passed on is visible ASCII (no CR/LF to split the request, nothing httpx cannot send)
HEADER_VALUE_RE = re.compile(r"^[\x21-\x7e][\x20-\x7e]{0,1023}$")
RETURNED_HEADERS = ("Content-Type", "Mcp-Session-Id", "Mcp-Protocol-Version")
CLIENT_INFO = {"name": "sandhold-tunnel-connector", "version": "0.1.0"}
MODERN = "2026-07-28"  # MCP's stateless era


def discover_request(rid: Any) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """A ``server/discover`` of MCP's stateless era (2026-07-28), and its HTTP headers."""
    meta = {
        types.PROTOCOL_VERSION_META_KEY: MODERN,
        types.CLIENT_CAPABILITIES_META_KEY: {},
        types.CLIENT_INFO_META_KEY: CLIENT_INFO,
    }
    message = {"jsonrpc": "2.0", "id": rid, "method": "server/discover", "params": {"_meta": meta}}
    return message, {"Mcp-Protocol-Version": [MODERN], "Mcp-Method": ["server/discover"]}


def failure(
    message: dict[str, Any], source: str, kind: str, text: str, status: int | None = None
) -> dict[str, Any]:
    """A synthesized JSON-RPC error for a message the target did not answer itself."""
    prov: dict[str, Any] = {
        "version": 1,
        "source": source,
        "transport_error_kind": kind,
        "upstream_response_received": status is not None,
    }
    if status is not None:
        prov["upstream_status"] = status
    body = {
        "jsonrpc": "2.0",
        "id": message.get("id"),
        "error": {"code": -32603, "message": text[:300], "data": {"tunnel_failure": prov}},
    }
    return {
        "resp_json": body,
        "resp_code": 502,
        "resp_type": "jsonrpc_response",
        "resp_headers": {"Content-Type": ["application/json"]},
    }


class HttpUpstream:
    def __init__(self, cfg: UpstreamConfig, max_bytes: int, timeout_s: float) -> None:
        assert cfg.url is not None
        self.cfg, self.url, self.max_bytes = cfg, cfg.url, max_bytes
        self.headers = {
            k: resolve(v, f"upstream {cfg.channel} header {k}") for k, v in cfg.headers.items()
        }
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=5.0), trust_env=False
        )
        self.reachable: bool | None = None

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        await self.http.aclose()

    async def forward(
        self, message: dict[str, Any], headers: dict[str, list[str]]
    ) -> dict[str, Any]:
        out = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            **self.headers,
        }
        for name, values in headers.items() if isinstance(headers, dict) else ():
            if (
                isinstance(name, str)
                and name.lower() in PASSED_HEADERS
                and isinstance(values, list)
                and values
                and isinstance(values[0], str)
                and HEADER_VALUE_RE.match(values[0])
            ):
                out[name.lower()] = values[0]
        try:
            async with self.http.stream(
                "POST", self.url, content=json.dumps(message), headers=out
            ) as r:
                self.reachable = True
                body = await self._answer(r, message)
        except PayloadTooLarge:
            return failure(
                message,
                "protocol",
                "response_body_too_large",
                f"the internal MCP server's answer is more than {self.max_bytes} bytes",
            )
        except httpx.ConnectError as e:
            self.reachable = False
            return failure(message, "connect", "connection_refused", f"cannot connect: {e}")
        except httpx.TimeoutException:
            return failure(message, "timeout", "timeout", "the internal MCP server timed out")
        except httpx.HTTPError as e:
            self.reachable = False
            return failure(message, "transport_closed", "connection_closed", str(e) or "closed")
        returned = {h: [r.headers[h]] for h in RETURNED_HEADERS if h in r.headers}
        if "id" not in message:  # a notification: nothing to answer but an acknowledgement
            return {"resp_type": "notify_ack", "resp_code": r.status_code, "resp_headers": returned}
        if body is None:
            return failure(
                message,
                "target_http",
                "http_status",
                f"HTTP {r.status_code} without a JSON-RPC answer",
                r.status_code,
            )
        return {
            "resp_json": body,
            "resp_code": r.status_code,
            "resp_headers": returned,
            "resp_type": "jsonrpc_response",
        }

    async def _read(self, r: httpx.Response) -> bytes:
        data = b""
        async for chunk in r.aiter_bytes():
            data += chunk
            if len(data) > self.max_bytes:
                raise PayloadTooLarge("answer too large")
        return data

    async def _answer(self, r: httpx.Response, message: dict[str, Any]) -> dict[str, Any] | None:
        ctype = r.headers.get("content-type", "")
        if ctype.startswith("text/event-stream"):
            return await self._from_events(r, message.get("id"))
        data = await self._read(r)
        if not ctype.startswith("application/json") or not data.strip():
            return None
        try:
            body = json.loads(data)
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    async def _lines(self, r: httpx.Response) -> Any:
        """The stream's lines, counting bytes as they arrive: a line that never ends must not
        grow past the bound in memory."""
        size, pending = 0, b""
        async for chunk in r.aiter_bytes():
            size += len(chunk)
            if size > self.max_bytes:
                raise PayloadTooLarge("answer too large")
            *lines, pending = (pending + chunk).replace(b"\r\n", b"\n").split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r").decode(errors="replace")
        if pending:
            yield pending.rstrip(b"\r").decode(errors="replace")

    async def _from_events(self, r: httpx.Response, rid: Any) -> dict[str, Any] | None:
        """The answer to ``rid`` in an SSE stream (notifications before it are dropped)."""
        data_lines: list[str] = []
        async for line in self._lines(r):
            if line.startswith("data:"):
                data_lines.append(line[5:].lstrip())
            elif line == "" and data_lines:
                with contextlib.suppress(ValueError):
                    event = json.loads("\n".join(data_lines))
                    if (
                        isinstance(event, dict)
                        and event.get("id") == rid
                        and ("result" in event or "error" in event)
                    ):
                        return event
                data_lines = []
        return None


class StdioUpstream:
    def __init__(self, cfg: UpstreamConfig, max_bytes: int, timeout_s: float) -> None:
        assert cfg.command is not None
        self.cfg, self.max_bytes, self.timeout_s = cfg, max_bytes, timeout_s
        self.init_result: dict[str, Any] | None = None
        self.reachable: bool | None = None
        self._ids = itertools.count(1)
        self._waiting: dict[int, anyio.Event] = {}
        self._answers: dict[int, dict[str, Any]] = {}
        self._write: Any = None
        self._stack = contextlib.AsyncExitStack()
        self._tg: Any = None

    async def start(self) -> None:
        c = self.cfg
        assert c.command is not None
        env = {k: resolve(v, f"upstream {c.channel} env {k}") for k, v in c.env.items()}
        params = StdioServerParameters(command=c.command[0], args=c.command[1:], env=env, cwd=c.cwd)
        read, self._write = await self._stack.enter_async_context(stdio_client(params))
        self._tg = await self._stack.enter_async_context(anyio.create_task_group())
        self._tg.start_soon(self._reader, read)
        # A server of the stateless era (MCP 2026-07-28) answers server/discover: the connection
        # is then of that era, without a handshake (the gateway discovers too); else the
        # handshake, which the gateway's own initialize is answered from.
        found = (await self._request(discover_request(0)[0])).get("result")
        if isinstance(found, dict) and MODERN in (found.get("supportedVersions") or []):
            self.reachable = True
            return
        init = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": CLIENT_INFO,
            },
        }
        answer = await self._request(init)
        if "result" not in answer:
            raise RuntimeError(f"stdio server {c.channel!r} refused initialize: {answer}")
        self.init_result = answer["result"]
        await self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.reachable = True

    async def close(self) -> None:
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
        await self._stack.aclose()

    async def _reader(self, read: Any) -> None:
        async for item in read:
            if isinstance(item, Exception):
                continue
            msg = item.message.model_dump(by_alias=True, exclude_unset=True)
            rid = msg.get("id")
            if isinstance(rid, int) and rid in self._waiting and "method" not in msg:
                self._answers[rid] = msg
                self._waiting[rid].set()
        self.reachable = False  # the server's stdout closed: it exited
        for event in self._waiting.values():
            event.set()

    async def _send(self, message: dict[str, Any]) -> None:
        parsed = types.jsonrpc_message_adapter.validate_python(message)
        await self._write.send(SessionMessage(parsed))

    async def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        ours = next(self._ids)
        event = self._waiting[ours] = anyio.Event()
        try:
            await self._send({**message, "id": ours})
            with anyio.fail_after(self.timeout_s):
                await event.wait()
        except BaseException:  # timed out or cancelled: nothing of it is kept, not a late answer
            self._answers.pop(ours, None)
            raise
        finally:
            self._waiting.pop(ours, None)
        answer = self._answers.pop(ours, None)
        if answer is None:
            raise ConnectionError("the stdio MCP server exited")
        return answer

    async def forward(
        self, message: dict[str, Any], headers: dict[str, list[str]]
    ) -> dict[str, Any]:
        method, rid = message.get("method"), message.get("id")
        ok = {"Content-Type": ["application/json"]}
        if "id" not in message:
            if method != "notifications/initialized":  # sent once, at start
                with contextlib.suppress(Exception):
                    await self._send(message)
            return {"resp_type": "notify_ack", "resp_code": 202, "resp_headers": {}}
        if method == "initialize" and self.init_result is not None:
            body = {"jsonrpc": "2.0", "id": rid, "result": self.init_result}
            return {"resp_json": body, "resp_code": 200, "resp_headers": ok}
        try:
            answer = await self._request(message)
        except TimeoutError:
            return failure(message, "timeout", "timeout", "the stdio MCP server timed out")
        except (ConnectionError, anyio.ClosedResourceError, anyio.BrokenResourceError) as e:
            self.reachable = False
            return failure(message, "transport_closed", "closed_pipe", str(e) or "closed pipe")
        if len(json.dumps(answer)) > self.max_bytes:
            return failure(
                message,
                "protocol",
                "response_body_too_large",
                f"the internal MCP server's answer is more than {self.max_bytes} bytes",
            )
        return {
            "resp_json": {**answer, "id": rid},
            "resp_code": 200,
            "resp_headers": ok,
            "resp_type": "jsonrpc_response",
        }


def make_upstream(
    cfg: UpstreamConfig, max_bytes: int, timeout_s: float
) -> HttpUpstream | StdioUpstream:
    return (HttpUpstream if cfg.url else StdioUpstream)(cfg, max_bytes, timeout_s)
