"""The tenant-key cache (gateway/keys.py, ``gateway_auth_cache_ttl_s``): a key resolves only to
the tenant the store named for it, a rotated or revoked key is refused once the TTL has run out
(at once on the replica that changed it), and nothing of one tenant's entry serves another's
key. On both stores, with a clock of the test's (no sleeping, no timing asserted); then end to
end with two real gateway processes sharing PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from sandhold.gateway.keys import MAX_ENTRIES, TenantKeys
from sandhold.store.db import Store
from tests.gateway.postgres import Postgres
from tests.support.gateway_server import OTHER_KEY, TENANT_KEY, Gateway, wait_for

KEY_A = "acme-key-0123456789abcdef"
KEY_B = KEY_A + "x"  # the same prefix: a key must match whole
NEW_A = "acme-rotated-key-0123456789"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tenants(store: Store) -> None:
    store.put_tenant("acme", {"keep_alive_s": 60}, KEY_A)
    store.put_tenant("globex", {"keep_alive_s": 120}, KEY_B)


def test_a_key_resolves_to_its_own_tenant_and_a_rotated_one_is_refused_after_the_ttl(
    store: Store,
) -> None:
    tenants(store)
    clock = Clock()
    keys = TenantKeys(store, ttl_s=5, clock=clock)

    async def scenario() -> None:
        # Interleaved and concurrent: each key gets its own tenant and policy, every time.
        for _ in range(3):
            got = await asyncio.gather(*(keys.lookup(k) for k in (KEY_A, KEY_B, KEY_A, KEY_B)))
            assert [(t, p.keep_alive_s) for t, p in got if p] == [
                ("acme", 60), ("globex", 120), ("acme", 60), ("globex", 120)]  # fmt: skip
        assert await keys.lookup("acme-key-0123456789abcde") is None  # a prefix of a key
        assert await keys.lookup(KEY_B + "y") is None

        # Another replica rotates acme's key (the store alone changes): the old key keeps
        # working here until its entry is TTL old, never longer, and never as globex.
        store.put_tenant("acme", {"keep_alive_s": 60}, NEW_A)
        clock.now += 4.9
        assert (await keys.lookup(KEY_A) or ("", None))[0] == "acme"
        assert (await keys.lookup(NEW_A) or ("", None))[0] == "acme"
        clock.now += 0.2  # 5.1 s after the old key's entry was read
        assert await keys.lookup(KEY_A) is None
        assert (await keys.lookup(KEY_B) or ("", None))[0] == "globex"
        assert await keys.lookup(KEY_A) is None  # a refused key is not cached as anything

        # Revoked on this replica (what the admin API does: forget): refused at once.
        store.put_tenant("globex", {"keep_alive_s": 120}, "globex-fresh-key-0123456789")
        keys.forget()
        assert await keys.lookup(KEY_B) is None

    asyncio.run(scenario())


def test_a_policy_change_reaches_a_replica_within_the_ttl(store: Store) -> None:
    tenants(store)
    clock = Clock()
    keys = TenantKeys(store, ttl_s=5, clock=clock)

    async def policy_now() -> int:
        found = await keys.lookup(KEY_A)
        assert found is not None
        return found[1].keep_alive_s

    async def scenario() -> None:
        assert await policy_now() == 60
        store.put_tenant("acme", {"keep_alive_s": 90}, None)
        clock.now += 5.1
        assert await policy_now() == 90

    asyncio.run(scenario())


def test_no_ttl_reads_the_store_every_time_and_the_cache_is_bounded(store: Store) -> None:
    tenants(store)
    clock = Clock()
    reads: list[str] = []
    real = store.tenant_by_digest

    def counted(digest: str) -> Any:
        reads.append(digest)
        return real(digest)

    store.tenant_by_digest = counted  # type: ignore[method-assign]

    async def scenario() -> None:
        off = TenantKeys(store, ttl_s=0, clock=clock)
        for _ in range(3):
            assert await off.lookup(KEY_A) is not None
        assert len(reads) == 3 and len(off) == 0
        store.put_tenant("acme", {}, NEW_A)
        assert await off.lookup(KEY_A) is None  # revoked: refused at the next request

        on = TenantKeys(store, ttl_s=5, clock=clock)
        for i in range(MAX_ENTRIES + 10):  # unknown keys are never kept
            assert await on.lookup(f"unknown-key-{i:06d}-xxxxxxxx") is None
        assert len(on) == 0
        assert await on.lookup(NEW_A) is not None and len(on) == 1

    asyncio.run(scenario())


def test_a_rotated_key_is_refused_by_both_replicas(
    postgres: Postgres, make_gateway: Callable[..., Gateway]
) -> None:
    """Two `sandhold gateway serve` processes on one PostgreSQL store: a key rotated through one
    replica's admin API is refused there at once and by the other once its TTL has passed;
    the other tenant's key keeps resolving to its own tenant on both."""
    url = postgres.database("authcache")
    one = make_gateway(gateway_store_url=url, gateway_auth_cache_ttl_s=1)
    two = make_gateway(gateway_store_url=url, gateway_auth_cache_ttl_s=1)
    for gw in (one, two):
        wait_for(lambda gw=gw: _status(gw, TENANT_KEY) == 200, timeout=60)
        assert _status(gw, OTHER_KEY) == 200  # both keys cached on both replicas
    with one.admin() as admin:
        r = admin.put("/v1/admin/tenants/acme", json={"api_key": NEW_A, "policy": {}})
        assert r.status_code == 200, r.text
    assert _status(one, TENANT_KEY) == 401  # the replica that rotated it: at once
    wait_for(lambda: _status(two, TENANT_KEY) == 401, timeout=30)
    # Which tenant a key acts as, told by its policy (acme's max_command_timeout_s is now the
    # default 600, globex's 120): a call over both is refused before any session is touched.
    wait_for(lambda: _max_timeout(two, NEW_A) == "600", timeout=30)
    for gw in (one, two):
        assert _status(gw, TENANT_KEY) == 401
        assert _max_timeout(gw, NEW_A) == "600"
        assert _max_timeout(gw, OTHER_KEY) == "120"
        assert _status(gw, OTHER_KEY) == 200


def _status(gw: Gateway, key: str) -> int:
    with gw.client(key) as c:
        return c.get("/v1/sessions").status_code


def _max_timeout(gw: Gateway, key: str) -> str:
    with gw.client(key) as c:
        r = c.post("/v1/sessions/s1/tools/run_command", json={"command": "true", "timeout_s": 900})
    assert r.status_code == 400, r.text
    return r.json()["message"].rsplit("(", 1)[1].rstrip(")")
