"""The worker's side of the Sandhold gateway: its REST tools, called for one session.

The gateway's session id is the Managed Agents session id, so whichever worker serves a work
item reaches the same sandbox and workspace (the gateway creates the sandbox on the first call
and resumes it after a pause; its session lock keeps two callers from making two sandboxes).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
from anthropic.lib.tools import ToolError

from sandhold.gateway.policy import SESSION_ID_RE

log = logging.getLogger("sandhold.worker")

# The gateway's answers that the same call may get past by waiting: the session is locked by a
# call being set up (another worker's, say), or the provider failed for a moment.
RETRYABLE = {"session_busy", "provider_error"}
RETRY_DELAYS_S = (0.2, 0.5, 1.0, 2.0)


class Gateway:
    """An HTTP client of one gateway, authenticated as one tenant."""

    def __init__(self, url: str, key: str, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self.http = httpx.AsyncClient(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {key}"},
            timeout=httpx.Timeout(timeout_s, connect=10.0),
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def call(
        self, name: str, session_id: str, tool: str, budget_s: float = 0.0, **arguments: Any
    ) -> dict[str, Any]:
        """One tool call (``POST /v1/sessions/{id}/tools/{tool}``) for the agent's tool ``name``;
        ``budget_s``: how long the tool itself may run, on top of the HTTP timeout. A refusal or
        failure raises the SDK's ``ToolError`` with the gateway's message (``name: message``),
        which the SDK's runner posts as an ``is_error`` result."""
        _check_session(name, session_id)
        timeout = httpx.Timeout(self.timeout_s + budget_s, connect=10.0)
        for attempt, delay in enumerate((*RETRY_DELAYS_S, None)):
            try:
                r = await self.http.post(
                    f"/v1/sessions/{session_id}/tools/{tool}", json=arguments, timeout=timeout
                )
            except httpx.TransportError as e:
                raise ToolError(f"{name}: the gateway is unreachable: {type(e).__name__}") from e
            if r.status_code == 200:
                result: dict[str, Any] = r.json()
                return result
            code, message = _error_of(r)
            if code in RETRYABLE and delay is not None:
                log.info("gateway %s for %s, retry %d: %s", code, tool, attempt + 1, message)
                await asyncio.sleep(delay)
                continue
            raise ToolError(f"{name}: {message or code}")
        raise AssertionError("unreachable")

    async def prepare(self, session_id: str) -> None:
        """Ask for the session's sandbox now (created or resumed in the background), so the
        first tool call finds it ready. Best effort: the first call would make it anyway."""
        try:
            _check_session("prepare", session_id)
        except ToolError as e:
            log.warning("%s", e)
            return
        try:
            r = await self.http.post(f"/v1/sessions/{session_id}/prepare", params={"wait": "false"})
        except httpx.TransportError as e:
            log.warning("prepare of session %s failed: %s", session_id, e)
            return
        if r.status_code != 202:
            log.warning("prepare of session %s: %s %s", session_id, *_error_of(r))


def _check_session(name: str, session_id: str) -> None:
    """The control plane's session id goes into the gateway's URL path: it must be one of the
    gateway's ids (no ``/``, ``..``, ``?`` or ``#`` to take the call to another path)."""
    if not SESSION_ID_RE.match(session_id):
        raise ToolError(f"{name}: session id {session_id[:80]!r} is not a valid gateway session id")


def _error_of(r: httpx.Response) -> tuple[str, str]:
    try:
        body = r.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        return body["code"], str(body.get("message", ""))
    return f"http_{r.status_code}", r.text[:500]
