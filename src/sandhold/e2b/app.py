"""One ASGI application for both planes: sandbox traffic (see ``proxy.route``) goes to the data
plane, everything else to the control plane (which also owns the lifespan: template warm-up and
the lifecycle timer)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette

from sandhold.config import Settings
from sandhold.e2b.auth import Teams
from sandhold.e2b.control import ControlPlane
from sandhold.e2b.proxy import DataPlane, route
from sandhold.e2b.volumes import VolumeStore
from sandhold.runtime import prebuild
from sandhold.runtime.runtime import Runtime
from sandhold.service import SandboxService


class E2bApp:
    def __init__(self, settings: Settings, runtime: Runtime | None = None) -> None:
        self.settings = settings
        self.runtime = runtime or Runtime(settings)
        self.volumes = VolumeStore(settings)
        self.service = SandboxService(self.runtime, settings)
        self.data_plane = DataPlane(self.service, settings)
        control = ControlPlane(self.service, settings, self.volumes, Teams(settings.api_keys))
        self.control_plane = control.app(self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.service.open()
        # Templates that take long to build (code-interpreter-v1: about a minute on a fresh
        # machine) are built in the background, by processes stopped with the server; a create
        # that needs one meanwhile waits for it.
        builds = [await prebuild.start(self.runtime.templates.root, self.settings.uid_base, name)
                  for name in self.settings.prebuild_templates]  # fmt: skip
        try:
            yield
        finally:
            await asyncio.gather(*(prebuild.stop(p) for p in builds))  # (they log their failures)
            await self.service.close()
            self.data_plane.file_audit.close()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and (target := route(scope)) is not None:
            await self.data_plane(scope, receive, send, target)
        else:
            await self.control_plane(scope, receive, send)


def create_app(settings: Settings, runtime: Runtime | None = None) -> E2bApp:
    return E2bApp(settings, runtime)
