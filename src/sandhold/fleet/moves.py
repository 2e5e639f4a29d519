"""Sandboxes kept in the shared store only (their host drained, or was lost after storing them):
a host takes one up when a call needs it (docs/fleet.md).

``adopt`` gives the sandbox to a host at the next generation (a compare-and-set: two edges
taking it up at once, one wins and the other uses its result) and asks the host to take it up:
from its own suspended copy if it still has one (an in-place restart: no download), else from
the store. A host that fails gives it back; the next candidate is tried. ``forget`` (a kill)
has a live host remove the stored copy, then drops the row.
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from sandhold.config import Settings
from sandhold.e2b.proxy import gone
from sandhold.errors import HostUnavailable
from sandhold.fleet.catalog import Catalog, Row
from sandhold.fleet.members import Members
from sandhold.fleet.metrics import EdgeMetrics
from sandhold.fleet.placement import order

log = logging.getLogger(__name__)


class Moves:
    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        members: Members,
        client: httpx.AsyncClient,
        metrics: EdgeMetrics,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.catalog = catalog
        self.members = members
        self.client = client

    async def adopt(self, row: Row, resume: bool) -> Row:
        """``row``'s sandbox on a host (resumed with ``resume``); its row then."""
        sid, stored_at = row.sandbox_id, row.generation
        holder = self.members.holding(sid)
        prefer = {holder} if holder else set()
        for host in order(await self.members.candidates(), self.settings.fleet_choices, prefer):
            if not await asyncio.to_thread(self.catalog.move, sid, stored_at, host.host_id):
                moved = await asyncio.to_thread(self.catalog.get, sid)
                if moved is None:
                    raise gone(sid)
                if moved.host_id is not None and moved.state != "moving":
                    return moved  # another edge took it up meanwhile
                raise HostUnavailable(f"sandbox {sid} is being moved; retry")
            params = {"generation": stored_at + 1, "from": stored_at}
            if resume:
                params["resume"] = 1
            try:
                r = await self.client.post(
                    f"{host.address}/fleet/adopt/{sid}", params=params, headers=self.members.headers
                )
            except httpx.HTTPError as e:
                r = None
                log.warning("host %s could not take up %s: %s", host.host_id, sid, e)
            if r is not None and r.status_code == 200:
                await self.members.record(host.host_id, r.json())
                moved = await asyncio.to_thread(self.catalog.get, sid)
                if moved is not None and moved.host_id is not None:
                    log.info("sandbox %s taken up by %s", sid, host.host_id)
                    self.metrics.migrations.labels(host.host_id).inc()
                    return moved
            elif r is not None:
                log.warning("host %s refused to take up %s: %s", host.host_id, sid, r.text[:300])
            await asyncio.to_thread(self.catalog.unmove, sid, stored_at + 1, host.host_id)
        raise HostUnavailable(f"no host could take up sandbox {sid} now; retry")

    async def forget(self, row: Row) -> None:
        """A kill of a sandbox that is in the store only."""
        for host_id in sorted(self.members.live):
            try:
                r = await self.client.post(
                    f"{self.members.address[host_id]}/fleet/forget/{row.sandbox_id}",
                    params={"generation": row.generation},
                    headers=self.members.headers,
                )
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                break
        await asyncio.to_thread(self.catalog.forget, row.sandbox_id)
