"""One ASGI application for both planes: sandbox traffic (see ``proxy.route``) goes to the data
plane, everything else to the control plane (which also owns the lifespan: template warm-up and
the lifecycle timer).

Every HTTP request goes through ``sandhold.logs.RequestLog`` first: a request id, and one log
line with the tenant (the API key's team on the control plane, the sandbox's owner on the data
plane), the sandbox (of the path, the routing headers or the Host, or the one a create made) and
the session (the gateway's ``session_id`` tag in the sandbox's metadata)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette

from sandhold.config import Settings
from sandhold.e2b import wire
from sandhold.e2b.auth import Teams
from sandhold.e2b.control import ControlPlane
from sandhold.e2b.fleet_host import FleetGate
from sandhold.e2b.proxy import DataPlane, route
from sandhold.e2b.volumes import VolumeStore
from sandhold.errors import Unauthenticated
from sandhold.logs import Ids, RequestLog
from sandhold.runtime.records import session_of
from sandhold.runtime.runtime import Runtime
from sandhold.runtime.templates import prebuild
from sandhold.service import SandboxService

SANDBOX_PATH = re.compile(r"^/(?:v2/)?sandboxes/([^/]+)")
SANDBOX_ID = re.compile(r"^[a-z0-9]{1,64}$")
CREATES = frozenset({"/sandboxes", "/v2/sandboxes"})
OWNERS_CACHED = 10_000


class E2bApp:
    def __init__(self, settings: Settings, runtime: Runtime | None = None) -> None:
        self.settings = settings
        self.runtime = runtime or Runtime(settings)
        self.volumes = VolumeStore(settings)
        self.service = SandboxService(self.runtime, settings)
        self.data_plane = DataPlane(self.service, settings)
        self.teams = Teams(settings.api_keys)
        control = ControlPlane(self.service, settings, self.volumes, self.teams)
        self.control_plane = control.app(self._lifespan)
        self.fleet = FleetGate(self.service, settings) if settings.fleet_host_id else None
        # sandbox id -> (owner, session): neither changes in a sandbox's life
        self._owners: OrderedDict[str, tuple[str, str | None]] = OrderedDict()
        self._logged = RequestLog(
            self._route, identify=self._identify, finish=self._finish, capture=_is_create
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.service.open()
        if self.fleet is not None:
            self.fleet.jobs.start()
        # Templates that take long to build (code-interpreter-v1: about a minute on a fresh
        # machine) are built in the background, by processes stopped with the server; a create
        # that needs one meanwhile waits for it.
        builds = [
            await prebuild.start(self.runtime.templates.root, self.settings.uid_base, name)
            for name in self.settings.prebuild_templates
        ]
        try:
            yield
        finally:
            await asyncio.gather(*(prebuild.stop(p) for p in builds))  # they log their failures
            if self.fleet is not None:
                await self.fleet.jobs.stop()
            self.data_plane.agents.close()
            await self.service.close()
            self.data_plane.file_audit.close()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await self._logged(scope, receive, send)
        else:
            await self.control_plane(scope, receive, send)

    async def _route(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.fleet is not None:
            await self.fleet(scope, receive, send, self._serve)
        else:
            await self._serve(scope, receive, send)

    async def _serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (target := route(scope)) is not None:
            await self.data_plane(scope, receive, send, target)
        else:
            await self.control_plane(scope, receive, send)

    # -- the ids of a request's log line ---------------------------------------------------------
    def _identify(self, scope: dict[str, Any], ids: Ids) -> None:
        target = route(scope)
        if target is not None:  # data plane: the sandbox's owner, once known
            ids.sandbox = _sandbox_id(target.sandbox_id)
        else:  # control plane: the API key's team
            key = next((v for k, v in scope["headers"] if k == b"x-api-key"), None)
            try:
                ids.tenant = self.teams.team_of(
                    {"x-api-key": key.decode("latin-1")} if key is not None else {}
                )
            except Unauthenticated:
                pass
            if (m := SANDBOX_PATH.match(scope["path"])) is not None and m.group(1) != "metrics":
                ids.sandbox = _sandbox_id(m.group(1))
        if ids.sandbox is not None and (known := self._owners.get(ids.sandbox)) is not None:
            self._own(ids, *known)

    async def _finish(
        self, scope: dict[str, Any], status: int | None, ids: Ids, body: bytes | None
    ) -> None:
        if body is not None and status is not None and status < 300:  # a create: its sandbox
            with contextlib.suppress(ValueError, AttributeError):
                ids.sandbox = _sandbox_id(json.loads(body).get("sandboxID"))
        if ids.sandbox is None or ids.sandbox in self._owners or (status or 500) >= 400:
            return
        sbx = await self.service.get(ids.sandbox)  # once per sandbox
        if sbx is None:
            return
        known = self._owners[ids.sandbox] = (sbx.owner, session_of(sbx.info.metadata))
        if len(self._owners) > OWNERS_CACHED:
            self._owners.popitem(last=False)
        self._own(ids, *known)

    @staticmethod
    def _own(ids: Ids, owner: str, session: str | None) -> None:
        """The sandbox's owner is the tenant of a data-plane request; its session is named only
        to its owner's requests."""
        ids.tenant = ids.tenant or owner
        if ids.tenant == owner:
            ids.session = session


def _is_create(scope: dict[str, Any]) -> bool:
    return scope["method"] == "POST" and scope["path"] in CREATES


def _sandbox_id(raw: Any) -> str | None:
    if not isinstance(raw, str):
        return None
    sid = wire.short_id(raw)
    return sid if SANDBOX_ID.match(sid) else None


def create_app(settings: Settings, runtime: Runtime | None = None) -> E2bApp:
    return E2bApp(settings, runtime)
