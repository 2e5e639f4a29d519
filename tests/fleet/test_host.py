"""A fleet host's side of the protocol (e2b/fleet_host.py), spoken to directly as an edge would:
creates only from an edge, admission that refuses before making anything when full, fencing by
generation, the fleet API behind its token."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from sandhold.runtime.records import new_sandbox_id
from tests.fleet.harness import TOKEN, new_host
from tests.support.e2b_server import KEY_A, Server

CAPACITY = 2


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    srv = new_host(tmp_path_factory.mktemp("fleet-host"), "solo", capacity=CAPACITY)
    srv.start()
    yield srv
    srv.destroy()


def as_edge(generation: int = 1, sandbox_id: str | None = None) -> dict[str, str]:
    headers = {"X-API-KEY": KEY_A, "X-Sandhold-Fleet-Token": TOKEN,
               "X-Sandhold-Generation": str(generation)}  # fmt: skip
    if sandbox_id is not None:
        headers["X-Sandhold-Sandbox-Id"] = sandbox_id
    return headers


def sandboxes(host: Server) -> list[str]:
    r = httpx.get(f"{host.url}/fleet/info", headers=as_edge(), timeout=30)
    return [s["sandboxID"] for s in r.json()["sandboxes"]]


def test_creates_come_from_an_edge_only(host) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(f"{host.url}/sandboxes", json={"templateID": "base"},
                   headers={"X-API-KEY": KEY_A}, timeout=30)  # fmt: skip
    assert r.status_code == 403 and "through the fleet's edge" in r.json()["message"]
    bad = {**as_edge(sandbox_id=new_sandbox_id()), "X-Sandhold-Fleet-Token": "wrong"}
    r = httpx.post(f"{host.url}/sandboxes", json={"templateID": "base"}, headers=bad, timeout=30)
    assert r.status_code == 401
    assert httpx.get(f"{host.url}/fleet/info", timeout=30).status_code == 401
    assert sandboxes(host) == []


def test_a_full_host_refuses_before_making_anything(host) -> None:  # type: ignore[no-untyped-def]
    ids = [new_sandbox_id() for _ in range(6)]

    def create(sid: str) -> int:
        r = httpx.post(f"{host.url}/sandboxes", json={"templateID": "base", "timeout": 60},
                       headers=as_edge(sandbox_id=sid), timeout=60)  # fmt: skip
        return r.status_code

    with ThreadPoolExecutor(6) as pool:
        codes = dict(zip(ids, pool.map(create, ids), strict=True))
    made = [sid for sid, code in codes.items() if code == 201]
    try:
        assert sorted(codes.values()) == [201] * CAPACITY + [503] * (6 - CAPACITY)
        assert sorted(sandboxes(host)) == sorted(made)  # under the ids the edge gave
    finally:
        for sid in made:
            httpx.delete(f"{host.url}/sandboxes/{sid}", headers=as_edge(), timeout=60)


def test_a_stale_generation_is_refused_and_a_newer_one_discards_the_copy(host) -> None:  # type: ignore[no-untyped-def]
    sid = new_sandbox_id()
    r = httpx.post(f"{host.url}/sandboxes", json={"templateID": "base", "timeout": 60},
                   headers=as_edge(generation=3, sandbox_id=sid), timeout=60)  # fmt: skip
    assert r.status_code == 201 and r.json()["sandboxID"] == sid
    info = httpx.get(f"{host.url}/sandboxes/{sid}", headers=as_edge(generation=3), timeout=30)
    assert info.status_code == 200
    stale = httpx.get(f"{host.url}/sandboxes/{sid}", headers=as_edge(generation=2), timeout=30)
    assert stale.status_code == 409 and "moved on" in stale.json()["message"]
    newer = httpx.get(f"{host.url}/sandboxes/{sid}", headers=as_edge(generation=4), timeout=30)
    assert newer.status_code == 404  # this copy was left behind: gone from here
    assert sid not in sandboxes(host)
