"""A fleet as it runs on nodes, on one machine (docs/fleet.md): three hosts, each in its own
network, PID and mount namespace under `sandhold init`, found by the edges through a DNS server
standing in for the headless Service; moto as the shared store, PostgreSQL as the catalog; two
edges. Host loss by SIGKILL of a namespace's init, and a partition (nftables in the host's
namespace) healed afterwards: exactly one copy of a moved sandbox answers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox
from e2b.exceptions import NotFoundException, ServiceBusyException

from tests.counter import COUNTER
from tests.e2b.test_suspend import state
from tests.fleet.dns import HeadlessService
from tests.fleet.harness import (
    LOST_AFTER_S,
    Edge,
    catalog_url,
    entry,
    host_of,
    new_host,
    s3_store,
    scrape,
    total,
    wait_for,
)
from tests.fleet.netns import HOST_PORT, Network, host_in, kill_namespace, relisten
from tests.fleet.test_moves import paused_at_edge
from tests.support.e2b_server import Server, needs_criu

NAME = "sandhold-hosts.fleet.test"


def egress(network: Network) -> dict[str, str]:
    """Sandboxes may ask for egress; the fleet's network is opened as if it were the internet
    and closed again as the fleet's own (what a fleet on public addresses configures)."""
    return {
        "egress_e2b_enabled": "true",
        "egress_open_cidrs": '["198.19.0.0/16"]',
        "egress_deny_cidrs": f'["{network.cidr}"]',
    }


@pytest.fixture(scope="module")
def fleet(
    postgres, tmp_path_factory
) -> Iterator[tuple[list[Server], list[Edge], Network, HeadlessService]]:  # type: ignore[no-untyped-def]
    needs_criu()
    tmp: Path = tmp_path_factory.mktemp("fleet-ns")
    network = Network()
    service = HeadlessService(NAME)
    hosts: list[Server] = []
    edges: list[Edge] = []
    try:
        with s3_store(network.bridge_ip) as store:
            for i in (1, 2, 3):
                srv = new_host(tmp, f"n{i}", fleet_store_after_s="0.5", **store, **egress(network))
                hosts.append(host_in(network, i, srv))
            for h in hosts:
                h.start()
                service.records.append(h.address)
            url = catalog_url(postgres)
            dns = {
                "fleet_discovery": "dns",
                "fleet_dns_name": NAME,
                "fleet_dns_server": service.address,
                "fleet_host_port": str(HOST_PORT),
            }
            edges = [Edge(tmp, url, [], **dns) for _ in range(2)]
            for e in edges:
                e.start()
            for e in edges:  # every host found and answering (a loaded machine is slow at it)
                wait_for(
                    lambda e=e: total(scrape(e.url), "sandhold_fleet_hosts_answering") == 3,
                    60,
                    "the edge to hear from every host",
                )
            yield hosts, edges, network, service
    finally:
        for e in edges:
            e.stop()
        for h in hosts:
            h.destroy()
        service.close()
        network.close()


def test_sandboxes_spread_over_namespaced_hosts_found_by_dns(fleet) -> None:  # type: ignore[no-untyped-def]
    hosts, (one, two), _, _ = fleet
    made = [Sandbox.create(**(one if i % 2 else two).sdk()) for i in range(3)]
    try:
        for s in made:
            assert s.commands.run("hostname -I 2>/dev/null; echo ok").stdout.strip().endswith("ok")
        holders = [next(h for h in hosts if host_of(h, s.sandbox_id)) for s in made]
        assert len(set(map(id, holders))) >= 2  # spread, not piled on one host
    finally:
        for s in made:
            s.kill()


def test_a_killed_namespace_loses_its_running_sandboxes(fleet) -> None:  # type: ignore[no-untyped-def]
    hosts, (one, two), network, service = fleet
    sbx = Sandbox.create(**one.sdk())
    lost = next(h for h in hosts if host_of(h, sbx.sandbox_id))
    kill_namespace(lost)
    lost.sock.close()  # its port refuses, as a dead node's
    service.records.remove(lost.address)  # the Service drops the pod

    def gone() -> bool:
        try:
            Sandbox.get_info(sbx.sandbox_id, **two.sdk())
        except NotFoundException:
            return True
        except ServiceBusyException:
            return False
        return False

    try:
        wait_for(gone, LOST_AFTER_S * 5, "the lost host's sandbox to be gone")
        fresh = [Sandbox.create(**two.sdk()) for _ in range(2)]
        assert not any(host_of(lost, s.sandbox_id) for s in fresh)  # (it answers nothing)
        assert all(any(host_of(h, s.sandbox_id) for h in hosts) for s in fresh)
        for s in fresh:
            s.kill()
    finally:
        relisten(network, lost)
        lost.start()  # the same data dir: its reconcile clears what the kill left
        service.records.append(lost.address)


def test_a_partitioned_hosts_sandbox_moves_and_the_stale_copy_is_discarded(fleet) -> None:  # type: ignore[no-untyped-def]
    hosts, (one, two), network, _ = fleet
    sbx = Sandbox.create(timeout=300, **one.sdk())
    cut = next(h for h in hosts if host_of(h, sbx.sandbox_id))
    try:
        sbx.commands.run(COUNTER, background=True)
        n0, secret = state(sbx)
        sbx.pause()
        wait_for(lambda: (entry(cut, sbx.sandbox_id) or {}).get("stored"), 60, "the store")
        network.cut(cut.namespace)  # type: ignore[attr-defined]
        wait_for(lambda: paused_at_edge(two, sbx.sandbox_id), 30, "the host judged lost")
        moved = Sandbox.connect(sbx.sandbox_id, timeout=300, **two.sdk())
        n1, secret1 = state(moved)
        assert secret1 == secret and n1 > n0
        network.heal(cut.namespace)  # type: ignore[attr-defined]
        # The healed host still has its copy (generation 1); the edges tell it to drop it.
        wait_for(lambda: entry(cut, sbx.sandbox_id) is None, 30, "the stale copy discarded")
        holders = [h for h in hosts if host_of(h, sbx.sandbox_id)]
        assert len(holders) == 1 and holders[0] is not cut
        assert state(moved)[1] == secret
    finally:
        sbx.kill()


def test_sandboxes_reach_no_host_of_the_fleet_nor_its_store(fleet) -> None:  # type: ignore[no-untyped-def]
    hosts, (one, _), _, _ = fleet
    sbx = Sandbox.create(allow_internet_access=True, **one.sdk())
    try:
        mine = next(h for h in hosts if host_of(h, sbx.sandbox_id))
        store = mine.settings["snapshot_s3_endpoint_url"]
        for url in [f"{h.url}/health" for h in hosts] + [f"{store}/"]:
            r = sbx.commands.run(f"curl -s -i --max-time 10 {url} || true")
            assert "403 Forbidden" in r.stdout, (url, r.stdout)
            assert "address of the" in r.stdout, (url, r.stdout)  # the host's own, the fleet's
    finally:
        sbx.kill()


def test_a_draining_host_that_leaves_dns_still_hands_its_sandbox_over(fleet) -> None:  # type: ignore[no-untyped-def]
    """A draining pod fails its readiness and leaves the headless Service at once; the edges
    still poll it (they know it), so it hands over well within its drain budget (300 s)."""
    hosts, (one, _), network, service = fleet
    sbx = Sandbox.create(timeout=300, **one.sdk())
    sbx.commands.run("echo kept > /tmp/kept")
    draining = next(h for h in hosts if host_of(h, sbx.sandbox_id))
    pod = draining.proc
    try:
        service.records.remove(draining.address)
        t0 = time.monotonic()
        draining.stop()  # SIGTERM to the pod's init: the server drains, then both exit
        assert pod is not None and pod.returncode == 0
        assert time.monotonic() - t0 < 60  # handed over, not timed out
        assert sbx.commands.run("cat /tmp/kept").stdout == "kept\n"  # on another host
        assert not host_of(draining, sbx.sandbox_id)
    finally:
        sbx.kill()
        relisten(network, draining)
        draining.start()
        service.records.append(draining.address)
