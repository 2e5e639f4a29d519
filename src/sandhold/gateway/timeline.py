"""The timeline: every event of a session, with its tenant, duration and what justified it.

Event kinds: ``session_opened``, ``session_closed``, ``sandbox_created``, ``sandbox_adopted``,
``sandbox_paused``, ``sandbox_failed``, ``sandbox_resumed``, ``sandbox_reclaimed``,
``sandbox_orphan_killed``, ``sandbox_network_updated``, ``sandbox_replaced``, ``tool_call``,
``tunnel_call`` (a tool of a tenant's MCP tunnel: ``reason`` names tunnel, channel, tool and
outcome; docs/tunnel.md), ``operator_action`` (a kill, pause or close asked for in the console:
``tool`` names it, ``reason`` who asked and how it ended), ``sandbox_killed`` (a kill from the
console that happened) and ``failure``. Writing is best effort: a store hiccup must not fail
a tool call that already ran.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from sandhold.store.db import Store
from sandhold.store.models import Event

log = logging.getLogger(__name__)

FIELDS = (
    "id",
    "at",
    "kind",
    "sandbox_id",
    "tool",
    "duration_ms",
    "exit_code",
    "bytes_in",
    "bytes_out",
    "error",
    "reason",
    "provider_state",
    "replica",
    "texts",
)


class Timeline:
    def __init__(self, store: Store, replica: str) -> None:
        self.store = store
        self.replica = replica

    def row(self, tenant_id: str, session_id: str, kind: str, **fields: Any) -> dict[str, Any]:
        """An event as a row to write later, in another transaction of the caller's."""
        return {
            "at": time.time(),
            "tenant_id": tenant_id,
            "session_id": session_id,
            "kind": kind,
            "replica": self.replica,
            **fields,
        }

    async def record(self, tenant_id: str, session_id: str, kind: str, **fields: Any) -> None:
        try:
            await asyncio.to_thread(
                self.store.add_event,
                tenant_id=tenant_id,
                session_id=session_id,
                kind=kind,
                replica=self.replica,
                **fields,
            )
        except Exception:
            log.exception("could not record %s event of session %s", kind, session_id)


def event_json(e: Event) -> dict[str, Any]:
    out = {k: getattr(e, k) for k in FIELDS}
    return {k: v for k, v in out.items() if v is not None}


def stop_event(failure: str | None) -> tuple[str, str]:
    """The timeline's kind and reason for a session's sandbox found stopped: paused by its
    keep-alive, or failed (a failed sandbox is listed as paused too)."""
    if failure is not None:
        return "sandbox_failed", f"the sandbox failed: {failure}"
    return "sandbox_paused", "keep-alive expired (on_timeout=pause)"
