"""The one way a time goes on a wire: RFC 3339 in UTC with a ``Z`` (E2B's API, the gateway's
calls to one, tunnel records). Log lines have their own, millisecond one (logs/setup.py)."""

from __future__ import annotations

from datetime import UTC, datetime


def iso(ts: float) -> str:
    """``ts`` (seconds since the epoch) as ``2026-12-05T09:55:28.123456Z``."""
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")
