"""The HTTP edge's small toolkit, one of each for every surface (`sandhold serve`, the gateway,
the console, tunnels): the bearer token of a request, its body read within a bound (413 naming
what sets the bound, from Content-Length before anything is read, else as soon as the stream
passes it: no handler reads a body whole without one), and a body that must be a JSON object."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request

from sandhold.errors import InvalidRequest, PayloadTooLarge


def bearer(headers: Mapping[str, str]) -> str | None:
    """The token of ``Authorization: Bearer <token>``; None without one."""
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


async def read_body(request: Request, limit: int, bound: str = "server_max_body_bytes") -> bytes:
    """``request``'s body, at most ``limit`` bytes (``bound``: the setting that says so);
    PayloadTooLarge past it."""
    refused = PayloadTooLarge(f"request body is larger than {limit} bytes (setting {bound})")
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


async def read_json_object(request: Request, limit: int, bound: str) -> dict[str, Any]:
    """``request``'s body (``read_body``) as a JSON object; an empty body is ``{}``."""
    raw = (await read_body(request, limit, bound)).strip() or b"{}"
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise InvalidRequest(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    return body
