"""A small host-side client of the in-sandbox agent, over its unix socket.

The E2B server only forwards bytes to the agent; this client is for the CLI, tests and benchmarks,
which talk to a sandbox without any HTTP server in between.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

END_STREAM = 0x02


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    payload = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(payload)) + payload


async def iter_envelopes(chunks: AsyncIterator[bytes]) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    buf = b""
    async for chunk in chunks:
        buf += chunk
        while len(buf) >= 5:
            flags, size = struct.unpack(">BI", buf[:5])
            if len(buf) < 5 + size:
                break
            yield flags, json.loads(buf[5 : 5 + size] or b"{}")
            buf = buf[5 + size :]


class AgentError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass
class CommandResult:
    exit_code: int
    stdout: bytes
    stderr: bytes
    status: str
    pid: int

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")


def _basic(user: str | None) -> dict[str, str]:
    if user is None:
        return {}
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode()}


class AgentClient:
    def __init__(self, socket_path: Path | str, timeout: float = 60.0) -> None:
        # No TLS on a unix socket; verify=False skips loading a CA bundle (~26 ms).
        transport = httpx.AsyncHTTPTransport(uds=str(socket_path), verify=False)
        self.http = httpx.AsyncClient(
            transport=transport, base_url="http://sandbox", timeout=timeout
        )

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def health(self) -> bool:
        r = await self.http.get("/health")
        return r.status_code == 204

    async def unary(self, method: str, body: dict[str, Any], user: str | None = None) -> Any:
        r = await self.http.post(
            f"/{method}",
            json=body,
            headers={"Connect-Protocol-Version": "1", **_basic(user)},
        )
        data = r.json() if r.content else {}
        if r.status_code != 200:
            raise AgentError(data.get("code", "unknown"), data.get("message", r.text))
        return data

    async def run(
        self,
        cmd: str,
        *,
        user: str | None = None,
        envs: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run ``bash -l -c cmd`` to completion, like the SDK's ``commands.run``."""
        return await self.run_argv(
            ["/bin/bash", "-l", "-c", cmd], user=user, envs=envs, cwd=cwd, timeout=timeout
        )

    async def run_argv(
        self,
        argv: list[str],
        *,
        user: str | None = None,
        envs: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run a program to completion and collect its output."""
        process: dict[str, Any] = {"cmd": argv[0], "args": argv[1:], "envs": envs or {}}
        if cwd:
            process["cwd"] = cwd
        body = envelope({"process": process, "stdin": False})
        headers = {
            "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1",
            **_basic(user),
        }
        out, err, pid = bytearray(), bytearray(), 0
        result: CommandResult | None = None
        async with self.http.stream(
            "POST", "/process.Process/Start", content=body, headers=headers, timeout=timeout
        ) as r:
            if r.status_code != 200:
                data = json.loads(await r.aread() or b"{}")
                raise AgentError(data.get("code", "unknown"), data.get("message", ""))
            async for flags, msg in iter_envelopes(r.aiter_bytes()):
                if flags & END_STREAM:
                    if "error" in msg:
                        raise AgentError(
                            msg["error"].get("code", ""), msg["error"].get("message", "")
                        )
                    break
                event = msg.get("event", {})
                if "start" in event:
                    pid = int(event["start"].get("pid", 0))
                elif "data" in event:
                    data = event["data"]
                    if "stdout" in data:
                        out += base64.b64decode(data["stdout"])
                    if "stderr" in data:
                        err += base64.b64decode(data["stderr"])
                elif "end" in event:
                    end = event["end"]
                    result = CommandResult(
                        int(end.get("exitCode", 0)), bytes(out), bytes(err),
                        end.get("status", ""), pid,
                    )  # fmt: skip
        if result is None:
            raise AgentError("unavailable", "the process stream ended without an end event")
        return result

    async def read_file(self, path: str, user: str | None = None) -> bytes:
        params = {"path": path}
        if user:
            params["username"] = user
        r = await self.http.get("/files", params=params)
        if r.status_code != 200:
            raise AgentError(str(r.status_code), r.text)
        return r.content

    async def write_file(self, path: str, data: bytes, user: str | None = None) -> None:
        params = {"path": path}
        if user:
            params["username"] = user
        r = await self.http.post(
            "/files", params=params, content=data,
            headers={"Content-Type": "application/octet-stream"},
        )  # fmt: skip
        if r.status_code != 200:
            raise AgentError(str(r.status_code), r.text)
