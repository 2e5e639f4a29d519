"""The gateway console's sandboxes: the live ones, one sandbox's page (its session, template,
limits, usage history, events) and the guarded actions on a session: kill or pause its sandbox,
close it. A tenant key sees and acts on its own sessions only; another tenant's sandbox is "not
found", like one that does not exist. Every action is written to the session's timeline
(``operator_action``: what, by whom, the outcome; a kill that happened is also a
``sandbox_killed``) and to the console's audit log."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from sandhold.audit import CONSOLE_FIELDS, AuditLog, console_dir
from sandhold.console import queries
from sandhold.console.web import Handler, Principal, audited, fresh_sample, point, text, usage
from sandhold.errors import Conflict, InvalidRequest, SandboxNotFound
from sandhold.store.db import SessionRow

if TYPE_CHECKING:
    from sandhold.gateway.app import Gateway

MOST = 500  # live sandboxes listed at once


def handlers(gw: Gateway) -> dict[str, Handler]:
    db = gw.manager.db
    service = getattr(gw.provider, "service", None)  # the local provider's: usage and history
    audit = AuditLog(console_dir(gw.settings.data_dir), CONSOLE_FIELDS)

    async def owned(p: Principal, sandbox_id: str) -> SessionRow:
        """The session that has this sandbox, if the principal may see it."""
        row = await db(gw.store.session_with_sandbox, sandbox_id)
        if row is None or (p.kind != "admin" and row.tenant_id != p.tenant):
            raise SandboxNotFound(f"sandbox {sandbox_id!r} not found")
        return row

    async def template_of(tenant: str) -> str:
        return (await gw.manager.policy(tenant)).template

    async def sandboxes(p: Principal, body: dict[str, Any]) -> dict[str, Any]:
        tenant = p.scope(None)
        rows = await db(gw.store.sessions_with_sandboxes)
        live = [r for r in rows.values() if tenant is None or r.tenant_id == tenant][:MOST]
        now = time.time()

        async def row(r: SessionRow) -> dict[str, Any] | None:
            sbx = await gw.provider.get(r.sandbox_id or "")
            if sbx is None:
                return None
            out: dict[str, Any] = {
                "sandbox_id": sbx.id,
                "tenant": r.tenant_id,
                "session_id": r.session_id,
                "template": await template_of(r.tenant_id),
                "state": sbx.state,
                "age_s": round(now - sbx.started_at, 1),
            }
            if (
                service is not None
                and sbx.state == "running"  # (no thread hop for the others)
                and (s := await fresh_sample(service, await service.get(sbx.id)))
            ):
                out.update(usage(s))
            return out

        found = await asyncio.gather(*(row(r) for r in live))
        return {"sandboxes": [f for f in found if f is not None]}

    async def sandbox(p: Principal, body: dict[str, Any]) -> dict[str, Any]:
        sandbox_id = _id(body)
        row = await owned(p, sandbox_id)
        sbx = await gw.provider.get(sandbox_id)
        if sbx is None:
            raise SandboxNotFound(f"sandbox {sandbox_id!r} not found")
        policy = await gw.manager.policy(row.tenant_id)
        history = []
        if service is not None:
            if sbx.state == "running":
                await fresh_sample(service, await service.get(sandbox_id))  # joins the history
            history = [point(s) for s in service.history(sandbox_id, None, None)]
        events = await db(
            queries.sandbox_events, gw.store, row.tenant_id, row.session_id, sandbox_id
        )
        return {
            "sandbox": {
                **sbx.public(),
                "tenant": row.tenant_id,
                "session_id": row.session_id,
                "template": policy.template,
                "limits": {
                    "cpu": policy.cpu,
                    "memory_mib": policy.memory_mb,
                    "pids": policy.pids,
                    "keep_alive_s": policy.keep_alive_s,
                    "workspace_disk_mib": policy.workspace_disk_mb,
                },
                "age_s": round(time.time() - sbx.started_at, 1),
            },
            "history": history,
            "events": events,
        }

    async def act(
        p: Principal,
        action: str,
        asked: dict[str, str],
        find: Callable[[], Awaitable[SessionRow]],
        run: Callable[[SessionRow], Awaitable[dict[str, Any]]],
    ) -> dict[str, Any]:
        """Find what the action is on (another tenant's: not found), run it, and record the
        attempt however it ends: in the audit log always, in the session's timeline once the
        session is known to be the caller's."""
        record = {"actor": p.actor, "tenant": p.tenant, "action": action, **asked}
        record["reason"] = f"{action} from the console by {p.actor}"
        row: SessionRow | None = None
        try:
            async with audited(audit, record):
                row = await find()
                record.update(tenant=row.tenant_id, session=row.session_id)
                record["sandbox"] = row.sandbox_id
                return {"action": action, "status": "done", **(await run(row))}
        finally:
            if row is not None:
                await gw.timeline.record(
                    row.tenant_id,
                    row.session_id,
                    "operator_action",
                    sandbox_id=row.sandbox_id,
                    tool=action,
                    reason=record["reason"],
                )

    async def kill(p: Principal, body: dict[str, Any]) -> dict[str, Any]:
        sandbox_id = _id(body)

        async def run(row: SessionRow) -> dict[str, Any]:
            killed = await gw.provider.kill(sandbox_id)
            if killed:  # the sandbox's own end, which closes its span in the usage figures
                await gw.timeline.record(
                    row.tenant_id,
                    row.session_id,
                    "sandbox_killed",
                    sandbox_id=sandbox_id,
                    reason="killed from the console",
                )
            return {"killed": killed}

        return await act(p, "kill", {"sandbox": sandbox_id}, lambda: owned(p, sandbox_id), run)

    async def pause(p: Principal, body: dict[str, Any]) -> dict[str, Any]:
        sandbox_id = _id(body)

        async def run(row: SessionRow) -> dict[str, Any]:
            # as if its keep-alive ran out now, under the session's lock and with no tool call
            # running in it: a call is never frozen halfway by the console
            async with gw.manager.locked(row.pk):
                if await db(gw.store.live_uses, row.pk):
                    raise Conflict("a tool call is running in this sandbox: wait, or kill it")
                await gw.provider.set_timeout(sandbox_id, 0)
            return {}

        return await act(p, "pause", {"sandbox": sandbox_id}, lambda: owned(p, sandbox_id), run)

    async def close(p: Principal, body: dict[str, Any]) -> dict[str, Any]:
        tenant, session = p.scope(text(body, "tenant", 64)), text(body, "session", 128)
        if tenant is None or session is None:
            raise InvalidRequest("tenant and session are required")

        async def run(row: SessionRow) -> dict[str, Any]:
            return await gw.manager.close(tenant, session)

        # another tenant's session: not found (its key scopes the tenant to its own)
        find = lambda: gw.manager.session(tenant, session)  # noqa: E731
        return await act(p, "close", {"session": session}, find, run)

    return {
        "sandboxes": sandboxes,
        "sandbox": sandbox,
        "kill": kill,
        "pause": pause,
        "close": close,
    }


def _id(body: dict[str, Any]) -> str:
    sandbox_id = text(body, "sandbox_id", 64)
    if sandbox_id is None:
        raise InvalidRequest("sandbox_id is required")
    return sandbox_id
