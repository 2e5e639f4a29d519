"""The one envd client of the host side: envd's process and filesystem RPCs (Connect-JSON), its
``/files`` endpoint, and the code interpreter's ``/execute``, over any ``Channel`` (the agent's
unix socket, a tunnel through it, or an E2B data plane). The CLI, the tests, the benchmarks and
the gateway's tools all talk to sandboxes through it."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from sandhold.envd.framing import END_STREAM, envelope, iter_envelopes
from sandhold.envd.transports import Channel
from sandhold.errors import EnvdError, PortClosed, SandboxGone

CONNECT_HEADERS = {"Connect-Protocol-Version": "1"}
FILE_TYPES = {
    "FILE_TYPE_FILE": "file",
    "FILE_TYPE_DIRECTORY": "dir",
    "FILE_TYPE_SYMLINK": "symlink",
}


@dataclass
class CommandOutput:
    exit_code: int | None  # None: still running (background) or stopped by the timeout
    stdout: bytes
    stderr: bytes
    pid: int
    truncated: bool = False
    error: str | None = None
    status: str = ""

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")


@dataclass
class Execution:
    results: list[dict[str, Any]] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    error: dict[str, str] | None = None
    truncated: bool = False


def user_auth(user: str | None) -> dict[str, str]:
    """envd takes the user to act as from Basic auth's user name."""
    if user is None:
        return {}
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode()}


def raise_for(r: httpx.Response, body: bytes) -> None:
    if r.status_code == 502 and b"port is not open" in body:
        raise PortClosed(body.decode(errors="replace"))
    if r.status_code == 502 and b"was not found" in body:  # an E2B data plane's answer
        raise SandboxGone("the sandbox no longer exists")
    try:
        data = json.loads(body or b"{}")
        code, message = str(data.get("code", r.status_code)), str(data.get("message", ""))
    except (ValueError, AttributeError):
        code, message = str(r.status_code), body.decode(errors="replace")[:500]
    raise EnvdError(code, message)


@dataclass
class _Collected:
    """A process's stream as it comes: its pid, and its output bounded by ``limit`` bytes in
    all (the rest dropped, ``truncated``), each chunk also passed to ``on_output``."""

    limit: float
    on_output: Callable[[str, bytes], None] | None
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    pid: int = 0
    truncated: bool = False

    def event(self, event: dict[str, Any], background: bool) -> CommandOutput | None:
        """Take one event; the command's output once it is over (or, ``background``, started)."""
        if "start" in event:
            self.pid = int(event["start"].get("pid", 0))
            if background:
                return CommandOutput(None, b"", b"", self.pid)
        elif "data" in event:
            for key, buf in (("stdout", self.out), ("stderr", self.err)):
                if key in event["data"]:
                    self._add(key, buf, base64.b64decode(event["data"][key]))
        elif "end" in event:
            end = event["end"]
            return self.output(
                int(end.get("exitCode", 0)), end.get("error") or None, end.get("status", "")
            )
        return None

    def _add(self, key: str, buf: bytearray, chunk: bytes) -> None:
        if self.on_output is not None:
            self.on_output(key, chunk)
        room = self.limit - len(self.out) - len(self.err)
        self.truncated |= len(chunk) > room
        buf += chunk if room >= len(chunk) else chunk[: max(int(room), 0)]

    def stream_error(self, error: dict[str, Any], timeout_s: float | None) -> CommandOutput:
        """The stream ended with an error: the command's deadline is a timed-out output."""
        code = error.get("code", "")
        if code == "deadline_exceeded" and timeout_s is not None:
            return self.output(None, f"timed out after {timeout_s:g} s")
        raise EnvdError(code, error.get("message", ""))

    def output(self, exit_code: int | None, error: str | None, status: str = "") -> CommandOutput:
        return CommandOutput(
            exit_code, bytes(self.out), bytes(self.err), self.pid, self.truncated, error, status
        )


class EnvdClient:
    def __init__(self, channel: Channel) -> None:
        self.ch = channel

    def _headers(self, *extra: dict[str, str]) -> dict[str, str]:
        out = dict(self.ch.headers)
        for e in extra:
            out.update(e)
        return out

    async def health(self) -> bool:
        r = await self.ch.client.get(self.ch.base + "/health", headers=self.ch.headers)
        return r.status_code == 204

    async def unary(self, method: str, body: dict[str, Any], user: str | None = None) -> Any:
        """A unary Connect RPC, e.g. ``filesystem.Filesystem/Stat``."""
        r = await self.ch.client.post(
            f"{self.ch.base}/{method}",
            json=body,
            headers=self._headers(CONNECT_HEADERS, user_auth(user)),
        )
        if r.status_code != 200:
            raise_for(r, r.content)
        return r.json() if r.content else {}

    async def run(
        self,
        argv: list[str],
        *,
        user: str | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
        background: bool = False,
        max_output: int | None = None,
        on_output: Callable[[str, bytes], None] | None = None,
    ) -> CommandOutput:
        """Run a program; to completion, or in the background until it started (envd processes
        outlive the stream that started them). A timeout stops it: exit_code None, error set.
        Output past ``max_output`` bytes is dropped (``truncated``); ``on_output`` gets each
        chunk as it comes ("stdout" or "stderr", bytes)."""
        process: dict[str, Any] = {"cmd": argv[0], "args": argv[1:], "envs": env or {}}
        if cwd:
            process["cwd"] = cwd
        headers = self._headers(
            CONNECT_HEADERS, user_auth(user), {"Content-Type": "application/connect+json"}
        )
        if timeout_s is not None and not background:
            headers["Connect-Timeout-Ms"] = str(int(timeout_s * 1000))
        got = _Collected(max_output if max_output is not None else float("inf"), on_output)
        http_timeout = httpx.Timeout(None if timeout_s is None else timeout_s + 10, connect=30)
        async with self.ch.client.stream(
            "POST",
            self.ch.base + "/process.Process/Start",
            content=envelope({"process": process, "stdin": False}),
            headers=headers,
            timeout=http_timeout,
        ) as r:
            if r.status_code != 200:
                raise_for(r, await r.aread())
            async for flags, msg in iter_envelopes(r.aiter_bytes()):
                if flags & END_STREAM:
                    if "error" in msg:
                        return got.stream_error(msg["error"], timeout_s)
                    break
                done = got.event(msg.get("event", {}), background)
                if done is not None:
                    return done
        raise EnvdError("unavailable", "the process stream ended without an end event")

    async def sh(self, cmd: str, **kw: Any) -> CommandOutput:
        """``bash -l -c cmd``, as the SDK's ``commands.run``."""
        return await self.run(["/bin/bash", "-l", "-c", cmd], **kw)

    async def read_file(
        self, path: str, *, user: str | None = None, max_bytes: int | None = None
    ) -> bytes:
        params = {"path": path, **({"username": user} if user else {})}
        async with self.ch.client.stream(
            "GET",
            self.ch.base + "/files",
            params=params,
            headers=self.ch.headers,
            timeout=httpx.Timeout(120, connect=30),
        ) as r:
            if r.status_code != 200:
                raise_for(r, await r.aread())
            data = bytearray()
            async for chunk in r.aiter_bytes():
                data += chunk
                if max_bytes is not None and len(data) > max_bytes:
                    raise EnvdError("too_large", f"{path} is larger than {max_bytes} bytes")
            return bytes(data)

    async def write_file(self, path: str, data: bytes, *, user: str | None = None) -> None:
        params = {"path": path, **({"username": user} if user else {})}
        r = await self.ch.client.post(
            self.ch.base + "/files",
            params=params,
            content=data,
            headers=self._headers({"Content-Type": "application/octet-stream"}),
            timeout=httpx.Timeout(120, connect=30),
        )
        if r.status_code != 200:
            raise_for(r, r.content)

    async def list_dir(self, path: str, *, user: str | None, depth: int) -> list[dict[str, Any]]:
        data = await self.unary(
            "filesystem.Filesystem/ListDir", {"path": path, "depth": depth}, user
        )
        return [
            {
                "name": e.get("name"),
                "path": e.get("path"),
                "type": FILE_TYPES.get(e.get("type"), "other"),
                "size": int(e.get("size") or 0),
            }
            for e in data.get("entries", [])
        ]

    async def execute(
        self, code: str, *, language: str, timeout_s: float, max_output: int
    ) -> Execution:
        """The code interpreter's ``/execute`` (NDJSON lines until ``end_of_execution``); the
        channel is to the interpreter's port."""
        out = Execution()
        size = 0
        async with self.ch.client.stream(
            "POST",
            self.ch.base + "/execute",
            json={"code": code, "language": language},
            headers=self.ch.headers,
            timeout=httpx.Timeout(timeout_s, connect=30),
        ) as r:
            if r.status_code != 200:
                raise_for(r, await r.aread())
            async for raw in r.aiter_lines():
                if not raw.strip():
                    continue
                size += len(raw)
                if size > max_output:
                    out.truncated = True
                    continue
                ev = json.loads(raw)
                kind = ev.get("type")
                if kind == "stdout":
                    out.stdout += ev.get("text", "")
                elif kind == "stderr":
                    out.stderr += ev.get("text", "")
                elif kind == "result":
                    out.results.append({k: v for k, v in ev.items() if k != "type"})
                elif kind == "error":
                    out.error = {k: ev.get(k, "") for k in ("name", "value", "traceback")}
                elif kind == "end_of_execution":
                    break
        return out
