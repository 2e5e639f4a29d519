"""The fleet through its edge (docs/fleet.md), with the official SDK: two hosts, two edges, one
PostgreSQL catalog. Placement, routing of both planes, listing from the catalog, capacity, a
lost host."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from e2b import Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import NotFoundException, ServiceBusyException

from tests.fleet.harness import (
    LOST_AFTER_S,
    Edge,
    catalog_url,
    host_of,
    new_host,
    running,
    scrape,
    total,
    wait_for,
)
from tests.support.e2b_server import KEY_B, Server


@pytest.fixture(scope="module")
def fleet(postgres, tmp_path_factory) -> Iterator[tuple[list[Server], list[Edge]]]:  # type: ignore[no-untyped-def]
    tmp: Path = tmp_path_factory.mktemp("fleet")
    hosts = [new_host(tmp, f"h{i}", capacity=3) for i in (1, 2)]
    url = catalog_url(postgres)
    edges = [Edge(tmp, url, hosts) for _ in range(2)]
    with running(hosts, edges):
        yield hosts, edges


def test_the_sdk_works_through_either_edge(fleet) -> None:  # type: ignore[no-untyped-def]
    hosts, (one, two) = fleet
    sbx = Sandbox.create(metadata={"case": "tour"}, **one.sdk())
    try:
        assert sum(host_of(h, sbx.sandbox_id) for h in hosts) == 1  # placed on one host
        assert sbx.commands.run("echo hi").stdout == "hi\n"
        sbx.files.write("/home/user/a.txt", "through the edge")
        # the same sandbox through the other edge: control and data plane
        again = Sandbox.connect(sbx.sandbox_id, **two.sdk())
        assert again.files.read("/home/user/a.txt") == "through the edge"
        listed = Sandbox.list(query=SandboxQuery(metadata={"case": "tour"}), **two.sdk())
        assert [s.sandbox_id for s in listed.next_items()] == [sbx.sandbox_id]
        assert sbx.get_info().metadata == {"case": "tour"}
        sbx.pause()
        paused = Sandbox.list(
            query=SandboxQuery(state=[SandboxState.PAUSED]), **two.sdk()
        ).next_items()
        assert sbx.sandbox_id in [s.sandbox_id for s in paused]
        resumed = Sandbox.connect(sbx.sandbox_id, **two.sdk())
        assert resumed.files.read("/home/user/a.txt") == "through the edge"
        # another team sees nothing of it
        assert Sandbox.list(**two.sdk(KEY_B)).next_items() == []
        with pytest.raises(NotFoundException):
            Sandbox.connect(sbx.sandbox_id, **two.sdk(KEY_B))
    finally:
        sbx.kill()
    assert not any(host_of(h, sbx.sandbox_id) for h in hosts)
    assert (
        Sandbox.list(query=SandboxQuery(metadata={"case": "tour"}), **one.sdk()).next_items() == []
    )


def test_creates_fill_every_host_and_no_host_goes_over(fleet) -> None:  # type: ignore[no-untyped-def]
    hosts, edges = fleet
    capacity = 3 * len(hosts)

    def create(i: int) -> Sandbox | Exception:
        try:
            return Sandbox.create(metadata={"case": "fill"}, **edges[i % 2].sdk())
        except ServiceBusyException as e:
            return e

    before = [scrape(e.url) for e in edges]
    with ThreadPoolExecutor(10) as pool:
        got = list(pool.map(create, range(50)))
    made = [s for s in got if isinstance(s, Sandbox)]
    try:
        assert len(made) == capacity  # the excess refused, nothing over capacity
        refused = [e for e in got if isinstance(e, Exception)]
        assert all("no host has room" in str(e) for e in refused), refused
        per_host = [sum(host_of(h, s.sandbox_id) for s in made) for h in hosts]
        assert per_host == [3, 3]
        after = [scrape(e.url) for e in edges]
        placed = sum(
            total(a, "sandhold_fleet_placements_total")
            - total(b, "sandhold_fleet_placements_total")
            for a, b in zip(after, before, strict=True)
        )
        assert placed == capacity
        assert all(total(a, "sandhold_fleet_free_slots") == 0 for a in after)
        assert all(total(a, "sandhold_fleet_host_used") == capacity for a in after)
    finally:
        for s in made:
            s.kill()


def test_a_lost_hosts_sandboxes_are_gone_and_creates_avoid_it(fleet) -> None:  # type: ignore[no-untyped-def]
    hosts, (one, two) = fleet
    sbx = Sandbox.create(**one.sdk())
    lost = next(h for h in hosts if host_of(h, sbx.sandbox_id))
    survivor = next(h for h in hosts if h is not lost)
    lost.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
    lost.proc.wait()  # type: ignore[union-attr]
    lost.sock.close()  # (held by the test: connections would wait in its backlog)
    try:

        def gone() -> bool:
            try:
                Sandbox.get_info(sbx.sandbox_id, **two.sdk())
            except NotFoundException:
                return True
            except ServiceBusyException:  # silent, not yet lost: the SDK may retry
                return False
            return False

        wait_for(gone, LOST_AFTER_S * 5, "the lost host's sandbox to be gone")
        assert sum(total(scrape(e.url), "sandhold_fleet_lost_hosts_total") for e in (one, two)) == 1
        fresh = [Sandbox.create(**one.sdk()) for _ in range(2)]
        assert all(host_of(survivor, s.sandbox_id) for s in fresh)
        for s in fresh:
            s.kill()
    finally:
        lost.proc = None  # the fixture's destroy kills what the host left
