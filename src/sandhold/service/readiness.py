"""Readiness (``GET /ready``): whether this server can create a sandbox now. A Kubernetes
readiness probe and a fleet's edge ask it; ``GET /health`` stays liveness (the process answers).

Four checks, each cheap (the answer is kept ``TTL_S``):
- ``data_dir``: a file can be written there (not read-only, not full);
- ``cgroups``: the backend has every controller a sandbox needs (``cgroups.missing_controllers``);
- ``criu``: CRIU works, counted only where the settings suspend to disk (``suspend_after_s`` >= 0);
- ``base_template``: ``base`` is built. A missing one is built in the background, started by
  the first probe that finds it missing.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from dataclasses import dataclass, field

from sandhold.config import Settings
from sandhold.runtime import cgroups
from sandhold.runtime.checkpoint.criu import criu_status
from sandhold.runtime.runtime import Runtime
from sandhold.service.offload import Offload

TTL_S = 2.0
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Readiness:
    checks: dict[str, bool]
    reasons: dict[str, str] = field(default_factory=dict)  # of the failed ones, for the log

    @property
    def ready(self) -> bool:
        return all(self.checks.values())


class ReadinessProbe:
    def __init__(self, runtime: Runtime, settings: Settings, offload: Offload) -> None:
        self.runtime = runtime
        self.settings = settings
        self.offload = offload
        self._last: tuple[float, Readiness] | None = None
        self._building: asyncio.Task[object] | None = None

    async def check(self) -> Readiness:
        now = time.monotonic()
        if self._last is None or now - self._last[0] > TTL_S:
            was = self._last[1].ready if self._last else True
            got = await self.offload.run(self._check)
            if was and not got.ready:
                log.warning("not ready: %s", "; ".join(f"{k}: {v}" for k, v in got.reasons.items()))
            self._last = (now, got)
            if not got.checks["base_template"]:
                self._build_base()
        return self._last[1]

    def _check(self) -> Readiness:
        reasons: dict[str, str] = {}
        try:
            with tempfile.TemporaryFile(dir=self.settings.data_dir) as f:
                f.write(b"ready")
        except OSError as e:
            reasons["data_dir"] = f"{self.settings.data_dir}: {e.strerror}"
        missing = cgroups.missing_controllers()
        if missing:
            reasons["cgroups"] = f"{cgroups.kind()} controllers missing: {' '.join(missing)}"
        if self.settings.suspend_after_s >= 0:
            ok, detail = criu_status(self.settings.criu_path)
            if not ok:
                reasons["criu"] = f"suspend_after_s is set, and {detail}"
        if not self.runtime.templates.built("base"):
            reasons["base_template"] = "base is not built yet (building)"
        names = ("data_dir", "cgroups", "criu", "base_template")
        return Readiness({n: n not in reasons for n in names}, reasons)

    def _build_base(self) -> None:
        if self._building is None or self._building.done():
            self._building = asyncio.ensure_future(
                self.offload.run(self.runtime.templates.get, "base")
            )
