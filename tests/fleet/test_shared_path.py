"""Three hosts whose data dirs have the same path on separate storage (pods that each mount their
own volume at one path, docs/fleet.md): every sandbox gets its own host uid range from the one
registry of the kernel, and no host's reconcile touches another host's sandboxes (each data dir
has its own cgroup parent, runtime/cgroup_parent.py)."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from sandhold.config import Settings
from sandhold.runtime import instance
from sandhold.runtime.uids import Entry
from tests.fleet.harness import Edge, catalog_url, host_of, new_host
from tests.fleet.netns import Network, host_in
from tests.support.e2b_server import Server

RECONCILE_S = 0.5


@pytest.fixture(scope="module")
def fleet(postgres, tmp_path_factory) -> Iterator[tuple[list[Server], Edge]]:  # type: ignore[no-untyped-def]
    tmp: Path = tmp_path_factory.mktemp("fleet-shared")
    shared = Path(tempfile.mkdtemp(prefix="sandhold-shared-", dir="/var/tmp"))
    shared.chmod(0o755)
    network = Network()
    hosts: list[Server] = []
    edge = None
    try:
        for i in (1, 2, 3):
            srv = new_host(tmp, f"s{i}", reconcile_interval_s=str(RECONCILE_S))
            hosts.append(host_in(network, i, srv, shared=shared))
        for h in hosts:
            h.start()
        edge = Edge(tmp, catalog_url(postgres), hosts)
        edge.start()
        yield hosts, edge
    finally:
        if edge is not None:
            edge.stop()
        for h in hosts:
            h.destroy()
        network.close()
        shared.rmdir()


def test_hosts_at_one_path_share_no_uid_and_reconcile_only_their_own(fleet) -> None:  # type: ignore[no-untyped-def]
    hosts, edge = fleet
    made = [Sandbox.create(timeout=300, **edge.sdk()) for _ in range(6)]
    try:
        holders = {s.sandbox_id: next(h for h in hosts if host_of(h, s.sandbox_id)) for s in made}
        assert len({id(h) for h in holders.values()}) == 3  # every host holds some
        # The registry is the kernel's: each sandbox's range, with the id of its data dir.
        registry = Settings().uid_registry
        taken = {}
        for name in os.listdir(registry):
            if name.isdigit():
                entry = Entry.parse((registry / name).read_text())
                taken[entry.sandbox_id] = (int(name), entry.owner)
        ranges = [taken[s.sandbox_id][0] for s in made]
        assert len(set(ranges)) == len(made)  # no two live sandboxes on one host uid
        for s in made:  # each range is held by its own host's data dir
            assert taken[s.sandbox_id][1] == instance.read(holders[s.sandbox_id].data_dir)
        parents = {(h.data_dir / "cgroup-parent").read_text() for h in hosts}
        assert len(parents) == 3
        time.sleep(RECONCILE_S * 6)  # several reconcile passes of every host
        for s in made:
            assert s.commands.run("echo alive").stdout == "alive\n"
    finally:
        for s in made:
            s.kill()
