"""What the tools do inside a sandbox, over a provider ``Channel``: envd's process and
filesystem RPCs (Connect-JSON), its ``/files`` endpoint, and the code interpreter's ``/execute``.
The same requests whether the channel is the agent's unix socket or an E2B data plane."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from sandhold.errors import EnvdError, PortClosed
from sandhold.gateway.providers.base import Channel
from sandhold.runtime.client import END_STREAM, envelope, iter_envelopes

INTERPRETER_PORT = 49999
CONNECT_HEADERS = {"Connect-Protocol-Version": "1"}


@dataclass
class CommandOutput:
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    pid: int
    truncated: bool = False
    error: str | None = None


def _user_auth(user: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode()}


def _raise_for(r: httpx.Response, body: bytes) -> None:
    if r.status_code == 502 and b"port is not open" in body:
        raise PortClosed(body.decode(errors="replace"))
    try:
        data = json.loads(body or b"{}")
        raise EnvdError(str(data.get("code", r.status_code)), str(data.get("message", "")))
    except ValueError:
        raise EnvdError(str(r.status_code), body.decode(errors="replace")[:500]) from None


async def run(
    ch: Channel,
    cmd: str,
    *,
    user: str,
    cwd: str | None,
    env: dict[str, str],
    timeout_s: float,
    background: bool,
    max_output: int,
) -> CommandOutput:
    """``bash -l -c cmd``; in the background it returns once the process started (envd
    processes outlive the stream that started them)."""
    process: dict[str, Any] = {"cmd": "/bin/bash", "args": ["-l", "-c", cmd], "envs": env}
    if cwd:
        process["cwd"] = cwd
    headers = {
        **ch.headers,
        **CONNECT_HEADERS,
        **_user_auth(user),
        "Content-Type": "application/connect+json",
    }
    if not background:
        headers["Connect-Timeout-Ms"] = str(int(timeout_s * 1000))
    out, err = bytearray(), bytearray()
    pid, truncated = 0, False
    async with ch.client.stream(
        "POST",
        ch.base + "/process.Process/Start",
        content=envelope({"process": process, "stdin": False}),
        headers=headers,
        timeout=httpx.Timeout(timeout_s + 10, connect=30),
    ) as r:
        if r.status_code != 200:
            _raise_for(r, await r.aread())
        async for flags, msg in iter_envelopes(r.aiter_bytes()):
            if flags & END_STREAM:
                if "error" in msg:
                    code = msg["error"].get("code", "")
                    if code == "deadline_exceeded":
                        return CommandOutput(None, bytes(out), bytes(err), pid, truncated,
                                             f"timed out after {timeout_s:g} s")  # fmt: skip
                    raise EnvdError(code, msg["error"].get("message", ""))
                break
            event = msg.get("event", {})
            if "start" in event:
                pid = int(event["start"].get("pid", 0))
                if background:
                    return CommandOutput(None, b"", b"", pid)
            elif "data" in event:
                for key, buf in (("stdout", out), ("stderr", err)):
                    if key in event["data"]:
                        chunk = base64.b64decode(event["data"][key])
                        room = max_output - len(out) - len(err)
                        truncated |= len(chunk) > room
                        buf += chunk[: max(room, 0)]
            elif "end" in event:
                end = event["end"]
                return CommandOutput(int(end.get("exitCode", 0)), bytes(out), bytes(err), pid,
                                     truncated, end.get("error") or None)  # fmt: skip
    raise EnvdError("unavailable", "the process stream ended without an end event")


async def read_file(ch: Channel, path: str, *, user: str, max_bytes: int) -> bytes:
    async with ch.client.stream(
        "GET", ch.base + "/files", params={"path": path, "username": user}, headers=ch.headers,
        timeout=httpx.Timeout(120, connect=30),
    ) as r:  # fmt: skip
        if r.status_code != 200:
            _raise_for(r, await r.aread())
        data = bytearray()
        async for chunk in r.aiter_bytes():
            data += chunk
            if len(data) > max_bytes:
                raise EnvdError("too_large", f"{path} is larger than {max_bytes} bytes")
        return bytes(data)


async def write_file(ch: Channel, path: str, data: bytes, *, user: str) -> None:
    r = await ch.client.post(
        ch.base + "/files", params={"path": path, "username": user}, content=data,
        headers={**ch.headers, "Content-Type": "application/octet-stream"},
        timeout=httpx.Timeout(120, connect=30),
    )  # fmt: skip
    if r.status_code != 200:
        _raise_for(r, r.content)


async def list_dir(ch: Channel, path: str, *, user: str, depth: int) -> list[dict[str, Any]]:
    r = await ch.client.post(
        ch.base + "/filesystem.Filesystem/ListDir", json={"path": path, "depth": depth},
        headers={**ch.headers, **CONNECT_HEADERS, **_user_auth(user)},
        timeout=httpx.Timeout(60, connect=30),
    )  # fmt: skip
    if r.status_code != 200:
        _raise_for(r, r.content)
    return [
        {"name": e.get("name"), "path": e.get("path"), "type": _TYPES.get(e.get("type"), "other"),
         "size": int(e.get("size") or 0)}
        for e in r.json().get("entries", [])
    ]  # fmt: skip


_TYPES = {"FILE_TYPE_FILE": "file", "FILE_TYPE_DIRECTORY": "dir", "FILE_TYPE_SYMLINK": "symlink"}


@dataclass
class Execution:
    results: list[dict[str, Any]] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    error: dict[str, str] | None = None
    truncated: bool = False


async def execute(
    ch: Channel, code: str, *, language: str, timeout_s: float, max_output: int
) -> Execution:
    """The code interpreter's ``/execute`` (NDJSON lines until ``end_of_execution``)."""
    out = Execution()
    size = 0
    async with ch.client.stream(
        "POST", ch.base + "/execute", json={"code": code, "language": language},
        headers=ch.headers, timeout=httpx.Timeout(timeout_s, connect=30),
    ) as r:  # fmt: skip
        if r.status_code != 200:
            _raise_for(r, await r.aread())
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
