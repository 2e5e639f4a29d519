"""The edge's listing (``GET /sandboxes``, ``GET /v2/sandboxes``): from the catalog, never a
fan-out to hosts, with E2B's filters (state, metadata, template, startedAfter), order and pages
(``nextToken``, ``X-Next-Token``, ``X-Total-Running``)."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime
from typing import Any

from sandhold.e2b.control import MAX_PAGE, decode_token, encode_token, parse_metadata_filter
from sandhold.e2b.proxy import send_json
from sandhold.errors import InvalidRequest
from sandhold.fleet.catalog import Row


async def answer(send: Any, rows: list[Row], q: dict[str, str], v1: bool) -> None:
    """``GET /sandboxes`` (v1: running only, one page) or ``GET /v2/sandboxes`` of ``rows``."""
    states = {"running"} if v1 else {"running", "paused"}
    if q.get("state") and not v1:
        states = set(q["state"].split(","))
        if bad := states - {"running", "paused"}:
            raise InvalidRequest(f"invalid state {sorted(bad)[0]!r}: use running or paused")
    metadata = parse_metadata_filter(q["metadata"]) if q.get("metadata") else {}
    after = _started_after(q.get("startedAfter"))
    desc = (q.get("order") or "desc") == "desc"
    if (q.get("order") or "desc") not in ("asc", "desc"):
        raise InvalidRequest(f"invalid order {q['order']!r}: use asc or desc")
    try:
        limit = int(q.get("limit") or MAX_PAGE)
    except ValueError:
        raise InvalidRequest(f"invalid limit {q['limit']!r}") from None
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidRequest(f"limit must be between 1 and {MAX_PAGE}")
    running = sum(1 for r in rows if r.listed.get("state") == "running")
    items = sorted(
        (
            r
            for r in rows
            if r.listed.get("state", r.state) in states
            and all((r.listed.get("metadata") or {}).get(k) == v for k, v in metadata.items())
            and (not q.get("template") or r.listed.get("templateID") == q["template"])
            and (after is None or _started(r) >= after)
        ),
        key=lambda r: (_started(r), r.sandbox_id),
        reverse=desc,
    )
    if v1:
        return await send_json(send, 200, [r.listed for r in items])  # type: ignore[arg-type]
    if q.get("nextToken"):
        cursor = decode_token(q["nextToken"])
        keep = (lambda k: k < cursor) if desc else (lambda k: k > cursor)
        items = [r for r in items if keep((_started(r), r.sandbox_id))]
    page = items[:limit]
    headers = [(b"x-total-running", str(running).encode())]
    if len(items) > limit:
        headers.append(
            (b"x-next-token", encode_token(_started(page[-1]), page[-1].sandbox_id).encode())
        )
    payload = json.dumps([r.listed for r in page]).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def _started_after(raw: str | None) -> float | None:
    if not raw:
        return None
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        raise InvalidRequest(f"invalid startedAfter {raw!r}") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def _started(row: Row) -> float:
    """When the host started it (what the wire says), else when the edge placed it."""
    with contextlib.suppress(KeyError, ValueError, TypeError):
        return datetime.fromisoformat(row.listed["startedAt"]).timestamp()
    return row.started_at
