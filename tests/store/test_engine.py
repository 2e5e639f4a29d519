"""The store's engine: a pooled PostgreSQL connection idle long enough to be pinged is still
usable afterwards, by reads and writes in autocommit and in transactions."""

from __future__ import annotations

import pytest

from sandhold.store import engine


def test_a_pinged_connection_serves_every_kind_of_use(store, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(engine, "PING_IDLE_S", 0.0)  # every checkout pings
    for _ in range(3):  # (the same pooled connection, checked in and out again)
        assert store.get_tenant("acme") is not None  # a read in autocommit
        store.put_tenant("acme", {}, None)  # a transaction
