"""Request bodies at the HTTP edge, bounded: a body past its limit is refused (413, naming the
setting) from its Content-Length before anything is read, else as soon as the stream passes the
limit. No handler reads a body whole without one (``request.body()`` would)."""

from __future__ import annotations

from starlette.requests import Request

from sandhold.errors import PayloadTooLarge


async def read_body(request: Request, limit: int, setting: str = "server_max_body_bytes") -> bytes:
    """``request``'s body, at most ``limit`` bytes; PayloadTooLarge past it."""
    refused = PayloadTooLarge(f"request body is larger than {limit} bytes (setting {setting})")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise refused
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise refused
        chunks.append(chunk)
    return b"".join(chunks)
