"""Keeping a fleet host's templates and the fleet's store in step (service/fleet_templates.py),
every ``SYNC_S``, for the templates the fleet shares (a team's builds and images):

- one here that the store lacks is published: a new build (its files, then its record); or,
  if it had been in the store, it was deleted elsewhere and goes here too, once no sandbox of
  this host runs on it;
- one the store has newer (``updated_at``) is learnt: a stub, or its new record (tags, public)
  over this host's files; one newer here is published (its record alone);
- the first warm start checkpoint made of a template, on any host, is published;
- one the store has that this host had at the last pass and has no more (deleted here) leaves
  the store.

Last writer wins: the edges send every template call to one host, so the writes come from one
host at a time, and the others learn them within a pass or two.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sandhold.errors import SandholdError
from sandhold.service.fleet_templates import SharedTemplates, shared
from sandhold.service.timers import Periodic

if TYPE_CHECKING:
    from sandhold.config import Settings
    from sandhold.runtime.runtime import Runtime
    from sandhold.runtime.templates.store import Template
    from sandhold.service.offload import Offload

log = logging.getLogger(__name__)

SYNC_S = 5.0  # a list of the store per pass: the store bills requests


class TemplateSync:
    def __init__(self, runtime: Runtime, settings: Settings, offload: Offload) -> None:
        self.runtime = runtime
        self.offload = offload
        self.shared = SharedTemplates(settings, runtime.templates, runtime.layers, runtime.warm)
        runtime.templates.fetch = self.shared.fetch  # a stub's first use fetches its files
        runtime.warm.fetch = self.shared.fetch_warm  # a checkpoint is its maker's if it can be
        self._had: set[str] | None = None  # the shared templates here after the last pass
        self._timer = Periodic(self.tick, SYNC_S, "sandhold-fleet-templates", at_start=True)

    def start(self) -> None:
        self._timer.start()

    async def stop(self) -> None:
        await self._timer.stop()

    async def tick(self) -> None:
        try:
            await self.offload.run(self.sync)
        except SandholdError as e:
            log.warning("templates not in step with the fleet's store: %s", e)

    def sync(self) -> None:
        remote = self.shared.listing()
        local = {t.name: t for t in self.runtime.templates.list() if shared(t)}
        had = self._had if self._had is not None else {n for n, t in local.items() if t.fleet}
        for name, t in local.items():
            record = remote.get(name)
            if record is None:
                if t.fleet is not None:
                    if not self.shared.records.exists(f"tpl-{name}"):  # (not merely unreadable)
                        self._drop(t)  # deleted elsewhere
                elif t.owner is None or t.tags:  # (not an untagged build: on its way out)
                    self.shared.publish(t)
                continue
            theirs = float(record["template"].get("updated_at") or 0)
            if theirs > t.updated_at:
                self.shared.learn(record, t)
            elif t.fleet is None or t.updated_at > theirs:
                self.shared.publish(t)
            elif t.warm and not t.stub and "warm" not in t.fleet:
                self._publish_warm(t)
        for name, record in remote.items():
            if name in local:
                continue
            if name in had:
                log.info("template %s deleted here: out of the fleet's store", name)
                self.shared.forget(name, record.get("place"))
            else:
                self.shared.learn(record, None)
        self._had = {t.name for t in self.runtime.templates.list() if shared(t)}

    def _publish_warm(self, t: Template) -> None:
        """The first checkpoint of a template made on any host goes to the store (one whose
        key differs on another host, another CRIU build, is that host's alone)."""
        checkpoint = self.runtime.warm.available(t)
        if checkpoint is not None:
            self.shared.publish_warm(t, checkpoint)

    def _drop(self, t: Template) -> None:
        if any(info.template == t.name for info in self.runtime.list()):
            return  # (the next pass tries again)
        log.info("template %s deleted in the fleet: removed here", t.name)
        self.runtime.warm.remove(t.name)
        self.runtime.templates.remove(t.name)
        self.runtime.layers.collect(self.runtime.templates)
