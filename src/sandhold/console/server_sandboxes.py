"""A sandbox's page in ``sandhold serve``'s console, and the guarded actions on it, for a team's
own sandboxes only: its state, template, limits, age, metadata, its CPU, memory and disk history
(service/metrics.py: sampled every ``server_console_sample_interval_s``) and the newest events
of its log (runtime/sandbox_log.py); ``kill`` and ``pause`` through the same service calls as
E2B's ``DELETE /sandboxes/{id}`` and ``POST /sandboxes/{id}/pause``, each written to the
console's audit log (``data_dir/audit/console``). Another team's sandbox is "not found", in the
words a missing one gets (the service's ``not_found``)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from sandhold.audit import AuditLog
from sandhold.console.web import Handler, Principal, audited, fresh_sample, point
from sandhold.errors import InvalidRequest
from sandhold.runtime import sandbox_log
from sandhold.runtime.records import session_of
from sandhold.service import Sandbox, SandboxService

EVENTS, MOST_EVENTS = 200, 1000  # a page's newest log entries: by default, at most
MESSAGE_MOST = 4000  # characters of one log line shown (a service may print long ones)
ID_MOST = 128


def required(body: dict[str, Any], name: str, most: int = ID_MOST) -> str:
    """A string the body must carry (400 naming it when it is missing or not one)."""
    value = body.get(name)
    if not isinstance(value, str) or not 1 <= len(value) <= most:
        raise InvalidRequest(f"{name} is required: a string of 1 to {most} characters")
    return value


def whole(body: dict[str, Any], name: str, default: int, most: int) -> int:
    """An optional integer from 0 to ``most`` (400 for anything else, a bool or a float too)."""
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise InvalidRequest(f"{name} must be an integer from 0 to {most}")
    return value


def handlers(service: SandboxService, audit: AuditLog) -> dict[str, Handler]:
    async def mine(p: Principal, body: dict[str, Any]) -> Sandbox:
        return await service.owned(p.tenant or "", required(body, "sandbox_id"))

    async def sandbox(p: Principal, body: dict[str, Any]) -> dict[str, Any]:
        events = whole(body, "events", EVENTS, MOST_EVENTS)
        sbx = await mine(p, body)
        await fresh_sample(service, sbx)  # (it joins the history)
        logged = await service.offload.run(sandbox_log.read, sbx.info.dir, 0)
        template = await service.offload.run(
            service.runtime.templates.get_record, sbx.info.template
        )
        return {
            "sandbox": _page(sbx, template, time.time()),
            "history": [point(s) for s in service.history(sbx.id, None, None)],
            "events": [
                {"at": e.at_ms / 1000, "level": e.level, "message": e.message[:MESSAGE_MOST]}
                for e in reversed(logged[-events:] if events else [])
            ],
        }

    async def act(
        p: Principal, body: dict[str, Any], action: str, run: Callable[[str], Awaitable[None]]
    ) -> dict[str, Any]:
        sandbox_id = required(body, "sandbox_id")  # a bad body: 400, nothing done or logged
        record = {
            "actor": p.actor,
            "tenant": p.tenant,
            "action": action,
            "sandbox": sandbox_id,
            "reason": f"{action} from the console by {p.actor}",
        }
        async with audited(audit, record):
            sbx = await service.owned(p.tenant or "", sandbox_id)
            record["session"] = session_of(sbx.metadata)
            await run(sandbox_id)
        return {"action": action, "status": "done", "sandbox_id": sandbox_id}

    async def kill(p: Principal, body: dict[str, Any]) -> dict[str, Any]:
        return await act(p, body, "kill", lambda i: service.kill(p.tenant or "", i))

    async def pause(p: Principal, body: dict[str, Any]) -> dict[str, Any]:
        return await act(p, body, "pause", lambda i: service.pause(p.tenant or "", i))

    return {"sandbox": sandbox, "kill": kill, "pause": pause}


def _page(sbx: Sandbox, template: Any, now: float) -> dict[str, Any]:
    limits = sbx.info.spec.limits
    return {
        "sandbox_id": sbx.id,
        "tenant": sbx.owner,
        "state": sbx.state,
        "failure": sbx.info.failure if sbx.failed else None,
        "suspended": sbx.info.suspended,  # paused: None (in memory), "disk", "filesystem"
        "template": {
            "name": sbx.info.template,
            "template_id": (template.template_id or template.name) if template else None,
            "alias": (template.alias or template.name) if template else None,
            "build_id": template.build_id if template else None,
        },
        "limits": {
            "cpu": limits.cpu,
            "memory_mib": limits.memory_mb,
            "disk_mib": limits.disk_mb,  # None: not capped
            "pids": limits.pids,
            "timeout_s": sbx.life.timeout,
        },
        "lifecycle": {
            "on_timeout": "pause" if sbx.life.auto_pause else "kill",
            "auto_resume": sbx.life.auto_resume,
        },
        "started_at": sbx.info.created_at,
        "end_at": sbx.end_at,  # running: when it times out; paused: when it was paused
        "age_s": round(now - sbx.info.created_at, 1),
        "metadata": sbx.metadata,
        "session_id": session_of(sbx.metadata),
    }
