"""The fleet's hosts as this edge sees them: every ``fleet_poll_s`` each discovered host is asked
for ``/fleet/info``, and the catalog is brought in line with what it says.

- **What a host holds wins over the catalog's memory of it**, generation permitting: a sandbox
  it reports is written (a fork, a create whose edge died, a new state or end time); a sandbox
  the catalog has on it that it no longer reports is gone (killed by its timeout, say), unless
  it is still being created. A copy at an older generation than the catalog's is stale (the
  sandbox moved while the host was cut off): the host is told to discard it.
- **A host silent for ``fleet_lost_after_s``** is lost, once, by whichever edge marks it first
  (a compare-and-set): its sandboxes are gone, except those kept in the shared store, which stay
  paused and resumable on any host. A lost host that answers again is a host like any other;
  what it still holds is judged by generation, as above.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from typing import Any

import httpx

from sandhold.config import Settings
from sandhold.errors import HostUnavailable
from sandhold.fleet.catalog import Catalog
from sandhold.fleet.discovery import Discovery
from sandhold.fleet.placement import Candidate

log = logging.getLogger(__name__)


def entry_listed(entry: dict[str, Any]) -> dict[str, Any]:
    """The catalog's ListedSandbox of a host's entry; a sandbox its host paused when draining
    carries ``sandholdResumeOnCall`` (traffic takes it up on another host)."""
    listed = dict(entry["listed"])
    if entry.get("resumeOnCall"):
        listed["sandholdResumeOnCall"] = True
    return listed


MOVING_GRACE_S = 120.0  # a move not taken up by then belongs to an edge that died


class Members:
    def __init__(self, settings: Settings, catalog: Catalog, client: httpx.AsyncClient) -> None:
        self.settings = settings
        self.catalog = catalog
        self.client = client
        self.discovery = Discovery(settings)
        self.token = settings.fleet_token.get_secret_value() if settings.fleet_token else ""
        self.live: dict[str, dict[str, Any]] = {}  # host id -> its last /fleet/info
        self.address: dict[str, str] = {}  # host id -> base URL
        self.polled = asyncio.Event()  # set after the first poll
        self.lost = 0  # hosts this edge judged lost
        # creates sent to each host (when), until a poll asked after them has its answer
        self.given: dict[str, list[float]] = defaultdict(list)

    @property
    def headers(self) -> dict[str, str]:
        return {"X-Sandhold-Fleet-Token": self.token}

    async def run(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception:
                log.exception("fleet poll failed")
            self.polled.set()
            await asyncio.sleep(self.settings.fleet_poll_s)

    async def poll(self) -> None:
        # Found, and known hosts that still answer (a draining host leaves discovery first).
        found = await self.discovery.addresses()
        addresses = sorted({*found, *(self.address[h] for h in self.live)})
        asked_at = time.monotonic()
        answers = await asyncio.gather(*(self._ask(a) for a in addresses))
        live: dict[str, dict[str, Any]] = {}
        for address, info in zip(addresses, answers, strict=True):
            if info is None:
                continue
            live[str(info["hostId"])] = info
            self.address[str(info["hostId"])] = address
            # Those given before the ask are in its "used" now (or were refused); one given
            # while the answer was on its way may not be: it still counts until the next poll.
            given = self.given[str(info["hostId"])]
            given[:] = [t for t in given if t >= asked_at]
            await asyncio.to_thread(self.catalog.seen, address, info)
            await self._settle(str(info["hostId"]), address, info)
        self.live = live
        await self._lose_silent()

    async def _ask(self, address: str) -> dict[str, Any] | None:
        try:
            r = await self.client.get(
                f"{address}/fleet/info",
                headers=self.headers,
                timeout=min(5.0, self.settings.fleet_lost_after_s / 3),
            )
            r.raise_for_status()
            info: dict[str, Any] = r.json()
            return info
        except (httpx.HTTPError, ValueError) as e:
            log.info("fleet host %s did not answer: %s", address, e)
            return None

    async def _settle(self, host_id: str, address: str, info: dict[str, Any]) -> None:
        reported = {str(s["sandboxID"]): s for s in info.get("sandboxes", [])}
        known = {r.sandbox_id: r for r in await asyncio.to_thread(self.catalog.on_host, host_id)}
        for sid, s in reported.items():
            listed = entry_listed(s)
            if info.get("draining") and s.get("stored"):  # handed over: resumable anywhere
                await asyncio.to_thread(self.catalog.release, sid, host_id, listed)
                continue
            row = known.get(sid)
            if row is not None and (row.generation, row.listed, row.stored) == (
                s["generation"],
                listed,
                s["stored"],
            ):
                continue  # nothing new: no write (every edge polls every host)
            if not await self.record(host_id, s):
                row = await asyncio.to_thread(self.catalog.get, sid)
                if row is not None and row.generation > int(s["generation"]):
                    await self.discard(address, sid, row.generation)
        now, asked = time.time(), float(info["at"])
        for row in known.values():
            if row.sandbox_id in reported or row.updated_at > asked:
                continue  # (written after the host listed: made meanwhile)
            if row.state == "moving":  # being taken up: by an edge that died, if it is old
                if now - row.updated_at >= MOVING_GRACE_S:
                    await asyncio.to_thread(
                        self.catalog.unmove, row.sandbox_id, row.generation, host_id
                    )
                continue
            await asyncio.to_thread(self._gone, row.sandbox_id, host_id, row.stored)

    async def record(self, host_id: str, entry: dict[str, Any], new: bool = False) -> bool:
        """What ``host_id`` says of one of its sandboxes (an entry of its ``/fleet/info``, or
        of an answer; ``new``: a create's) into the catalog; False: the catalog holds a newer
        word (Catalog.record)."""
        listed, at = entry_listed(entry), float(entry["at"])
        sandbox_id, team, generation = (
            str(entry["sandboxID"]),
            str(entry["team"]),
            int(entry["generation"]),
        )
        if new:
            return await asyncio.to_thread(
                self.catalog.add, sandbox_id, team, host_id, generation, listed, at
            )
        return await asyncio.to_thread(
            self.catalog.record,
            sandbox_id,
            team,
            host_id,
            generation,
            listed,
            at,
            bool(entry.get("stored")),
        )

    def _gone(self, sandbox_id: str, host_id: str, stored: bool) -> None:
        if stored:
            self.catalog.release(sandbox_id, host_id)
        else:
            self.catalog.forget(sandbox_id, host_id)

    async def discard(self, address: str, sandbox_id: str, generation: int) -> None:
        try:
            await self.client.post(
                f"{address}/fleet/discard/{sandbox_id}",
                params={"generation": generation},
                headers=self.headers,
                timeout=30,
            )
        except httpx.HTTPError as e:
            log.warning("could not have %s discard %s: %s", address, sandbox_id, e)

    async def _lose_silent(self) -> None:
        since = time.time() - self.settings.fleet_lost_after_s
        for host in await asyncio.to_thread(self.catalog.hosts):
            if host.state == "lost" or host.host_id in self.live or host.last_seen >= since:
                continue
            if await asyncio.to_thread(self.catalog.lose, host.host_id, since):
                log.warning(
                    "fleet host %s is lost (silent since %.0f)", host.host_id, host.last_seen
                )
                self.lost += 1
                for row in await asyncio.to_thread(self.catalog.on_host, host.host_id):
                    stored = row.stored or await self._in_store(row.sandbox_id, row.generation)
                    await asyncio.to_thread(self._gone, row.sandbox_id, host.host_id, stored)

    async def _in_store(self, sandbox_id: str, generation: int) -> bool:
        """Whether the store keeps the sandbox at ``generation`` (a host stored it just before
        it was lost, before any edge saw): asked of a live host, which has the store."""
        for host_id in sorted(self.live):
            try:
                r = await self.client.get(
                    f"{self.address[host_id]}/fleet/stored/{sandbox_id}",
                    params={"generation": generation},
                    headers=self.headers,
                )
                if r.status_code == 200:
                    return bool(r.json().get("stored"))
            except (httpx.HTTPError, ValueError):
                continue
        return False

    def note(self, host_id: str, names: list[str]) -> None:
        """What a host has on disk since the last poll (a snapshot taken through this edge)."""
        if (info := self.live.get(host_id)) is not None:
            info["local"] = [*info.get("local", ()), *names]

    def having(self, template: str) -> set[str]:
        """Live hosts that have ``template`` (or the snapshot of that id or name) on disk."""
        return {h for h, info in self.live.items() if template in info.get("local", ())}

    def holding(self, sandbox_id: str) -> str | None:
        """A live host that still has a copy of the sandbox (one it drained, say)."""
        for host_id, info in self.live.items():
            if any(s["sandboxID"] == sandbox_id for s in info.get("sandboxes", [])):
                return host_id
        return None

    def reachable(self, host_id: str) -> str:
        """The address of a host that answered the last poll; else HostUnavailable (503: the
        SDK retries, and a host silent for long is lost, its sandboxes gone)."""
        if host_id not in self.live:
            raise HostUnavailable(f"the sandbox's host {host_id} is not answering; retry")
        return self.address[host_id]

    def give(self, host_id: str) -> None:
        """A create sent to the host: it counts in its load until a poll's answer has it."""
        self.given[host_id].append(time.monotonic())

    async def candidates(self) -> list[Candidate]:
        """Hosts that may take a create now: answering this edge, ready, not draining; their
        load is what they said at the last poll and what this edge gave them since (other
        edges' creates meanwhile are the host's to refuse: admission)."""
        return [
            Candidate(
                host_id,
                self.address[host_id],
                int(info["capacity"]),
                int(info["used"]) + len(self.given[host_id]),
            )
            for host_id, info in self.live.items()
            if not info.get("draining")
        ]
