"""Connect-protocol client helpers for talking to the agent in tests."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

END_STREAM = 0x02
STREAM_HEADERS = {
    "Content-Type": "application/connect+json",
    "Connect-Protocol-Version": "1",
}


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    payload = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(payload)) + payload


def basic(user: str | None) -> dict[str, str]:
    if user is None:
        return {}
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode()}


def b64(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode()


class EnvelopeStream:
    """Parses envelopes out of a byte stream."""

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, chunk: bytes) -> list[tuple[int, dict[str, Any]]]:
        self.buf += chunk
        out = []
        while len(self.buf) >= 5:
            flags, size = struct.unpack(">BI", self.buf[:5])
            if len(self.buf) < 5 + size:
                break
            out.append((flags, json.loads(self.buf[5 : 5 + size])))
            self.buf = self.buf[5 + size :]
        return out


async def unary(
    client: httpx.AsyncClient,
    method: str,
    body: dict[str, Any],
    user: str | None = None,
) -> tuple[int, dict[str, Any]]:
    r = await client.post(
        f"/{method}",
        content=json.dumps(body),
        headers={
            "Content-Type": "application/json",
            "Connect-Protocol-Version": "1",
            **basic(user),
        },
    )
    return r.status_code, (r.json() if r.content else {})


async def ok(client: httpx.AsyncClient, method: str, body: dict[str, Any], user: str | None = None):
    status, data = await unary(client, method, body, user)
    assert status == 200, (status, data)
    return data


@dataclass
class StreamResult:
    status: int
    messages: list[dict[str, Any]] = field(default_factory=list)  # flags 0
    end: dict[str, Any] | None = None  # the end-of-stream envelope
    raw: bytes = b""

    @property
    def events(self) -> list[dict[str, Any]]:
        return [m.get("event", m) for m in self.messages]

    def output(self, kind: str = "stdout") -> bytes:
        out = b""
        for ev in self.events:
            data = ev.get("data", {})
            if kind in data:
                out += base64.b64decode(data[kind])
        return out

    @property
    def end_event(self) -> dict[str, Any]:
        for ev in self.events:
            if "end" in ev:
                return ev["end"]
        raise AssertionError(f"no end event in {self.events}")

    @property
    def pid(self) -> int:
        return int(self.events[0]["start"]["pid"])


async def stream(
    client: httpx.AsyncClient,
    method: str,
    body: dict[str, Any],
    user: str | None = None,
    headers: dict[str, str] | None = None,
) -> StreamResult:
    """A server-stream call, read to the end."""
    hdrs = {**STREAM_HEADERS, **basic(user), **(headers or {})}
    parser = EnvelopeStream()
    async with client.stream("POST", f"/{method}", content=envelope(body), headers=hdrs) as r:
        result = StreamResult(r.status_code)
        async for chunk in r.aiter_raw():
            result.raw += chunk
            for flags, msg in parser.feed(chunk):
                if flags & END_STREAM:
                    result.end = msg
                else:
                    result.messages.append(msg)
    assert parser.buf == b"", "trailing bytes after the last envelope"
    return result


async def open_stream(
    client: httpx.AsyncClient,
    method: str,
    body: dict[str, Any],
    user: str | None = None,
    headers: dict[str, str] | None = None,
) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    """A server-stream call yielding ``(flags, message)`` as they arrive."""
    hdrs = {**STREAM_HEADERS, **basic(user), **(headers or {})}
    parser = EnvelopeStream()
    async with client.stream("POST", f"/{method}", content=envelope(body), headers=hdrs) as r:
        assert r.status_code == 200
        async for chunk in r.aiter_raw():
            for item in parser.feed(chunk):
                yield item


def command(cmd: str, **extra: Any) -> dict[str, Any]:
    """A StartRequest like the SDK's ``commands.run``, minus ``-l``: on a host, root's login
    shell runs whatever the host's profile does (and killing it mid-way can leave state)."""
    process: dict[str, Any] = {"cmd": "/bin/bash", "args": ["-c", cmd], "envs": {}}
    process.update(extra.pop("process", {}))
    return {"process": process, "stdin": False, **extra}


async def run(client: httpx.AsyncClient, cmd: str, user: str | None = None, **extra: Any):
    result = await stream(client, "process.Process/Start", command(cmd, **extra), user=user)
    assert result.status == 200
    assert result.end == {}, result.end
    return result


def gone(pid: int) -> bool:
    """The process no longer runs (absent, or a zombie waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
