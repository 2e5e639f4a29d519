"""A session's scenario: a label the platform gives its sessions (``X-Sandhold-Scenario`` on a
REST or MCP request), by which the console groups usage and failures with the tenant. The last
label a session was called with is its own (sessions.scenario); unlabelled calls change nothing.

The header is read where the request is (rest.py: the REST handlers and the MCP identity) into
``SCENARIO``, which the tool call carries to its end, where ``label`` writes it once per
session and value (a cache spares the store the write on every warm call).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING

from sandhold.errors import InvalidRequest

if TYPE_CHECKING:
    from sandhold.gateway.sessions import SandboxSessionManager

HEADER = "x-sandhold-scenario"
MAX_LEN = 64
SCENARIO: ContextVar[str | None] = ContextVar("sandhold_scenario", default=None)
_written: OrderedDict[tuple[str, str, str], str] = OrderedDict()
CACHE = 10_000


def from_headers(headers: Mapping[str, str]) -> str | None:
    """The request's scenario (None: none given), checked; also set for the call."""
    value = headers.get(HEADER)
    if value is not None:
        value = value.strip()
        if not value or len(value) > MAX_LEN or not value.isprintable():
            raise InvalidRequest(f"{HEADER} must be 1-{MAX_LEN} printable characters")
    SCENARIO.set(value)
    return value


async def label(m: SandboxSessionManager, tenant_id: str, session_id: str) -> None:
    """Give the session the call's scenario, if it has one and the session not yet that."""
    scenario = SCENARIO.get()
    key = (m.store.url, tenant_id, session_id)
    if scenario is None or _written.get(key) == scenario:
        return
    if await m.db(m.store.label_session, tenant_id, session_id, scenario):
        _written[key] = scenario
        _written.move_to_end(key)
        while len(_written) > CACHE:
            _written.popitem(last=False)
