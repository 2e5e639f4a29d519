"""Tenant API keys → their tenant and policy, cached briefly (``gateway_auth_cache_ttl_s``).

Every REST and MCP request authenticates with a tenant's key; reading the key's tenant and
policy from the store was one store read (a round trip and a worker-thread hop) per warm tool
call. A replica now keeps what it read for ``gateway_auth_cache_ttl_s`` (5 s by default; 0: no
cache, every request reads the store):

- entries are keyed by the sha256 of the whole key (the digest the store keeps, never the key
  itself), so two keys never share one; an entry holds the tenant id read with that digest,
  so a key only ever resolves to the tenant the store named for it within the last TTL;
- only keys the store knew are cached: an unknown key is read again on every request (a key
  added on another replica works at once);
- any tenant written through this replica (admin API, start-up) empties the cache: a rotated or
  revoked key stops working here at once, and on other replicas within the TTL (a key that
  still works there also still acts with the policy of that moment);
- at most ``MAX_ENTRIES`` entries (the least recently read go first).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable

from sandhold.gateway.policy import TenantPolicy
from sandhold.store.db import Store, key_digest

MAX_ENTRIES = 4096


class TenantKeys:
    def __init__(
        self, store: Store, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.clock = clock
        # digest -> (monotonic time until which it holds, tenant id, policy)
        self._entries: OrderedDict[str, tuple[float, str, TenantPolicy]] = OrderedDict()
        self._generation = 0  # bumped by forget(): a read begun before it is not kept

    async def lookup(self, api_key: str) -> tuple[str, TenantPolicy] | None:
        """The key's tenant and policy, or None if no tenant has this key."""
        digest = key_digest(api_key)
        now = self.clock()
        hit = self._entries.get(digest)
        if hit is not None:
            if hit[0] > now:
                self._entries.move_to_end(digest)
                return hit[1], hit[2]
            del self._entries[digest]
        generation = self._generation
        tenant = await asyncio.to_thread(self.store.tenant_by_digest, digest)
        if tenant is None:
            return None
        policy = TenantPolicy.model_validate(tenant.policy or {})
        if self.ttl_s > 0 and generation == self._generation:
            self._entries[digest] = (now + self.ttl_s, tenant.id, policy)
            while len(self._entries) > MAX_ENTRIES:
                self._entries.popitem(last=False)
        return tenant.id, policy

    def forget(self) -> None:
        """Drop every entry (a tenant's key or policy changed through this replica)."""
        self._generation += 1
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
