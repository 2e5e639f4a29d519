"""The ``domain`` an edge hands the SDK (docs/fleet.md): its own ``public_domain`` by default, so
the SDK's data plane goes through an edge; with ``fleet_direct_domains`` the sandbox's host's
own, and the host answers that traffic itself."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fleet.harness import Edge, catalog_url, new_host, running
from tests.support.e2b_server import KEY_A, Server

ENVD = 49983


@pytest.fixture
def fleet(postgres, tmp_path: Path) -> Iterator[tuple[list[Server], Edge, Edge]]:  # type: ignore[no-untyped-def]
    hosts = [new_host(tmp_path, f"d{i}", public_domain=f"d{i}.fleet.test") for i in (1, 2)]
    url = catalog_url(postgres)
    through = Edge(tmp_path, url, hosts, public_domain="edge.fleet.test")
    direct = Edge(
        tmp_path, url, hosts, public_domain="edge.fleet.test", fleet_direct_domains="true"
    )
    with running(hosts, [through, direct]):
        yield hosts, through, direct


def create(edge: Edge) -> dict[str, object]:
    r = httpx.post(f"{edge.url}/sandboxes", json={"templateID": "base"},
                   headers={"X-API-KEY": KEY_A}, timeout=60)  # fmt: skip
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def test_the_edge_hands_out_its_domain_or_with_direct_domains_the_hosts(fleet) -> None:  # type: ignore[no-untyped-def]
    hosts, through, direct = fleet
    api = {"X-API-KEY": KEY_A}
    a, b = create(through), create(direct)
    try:
        assert a["domain"] == "edge.fleet.test"
        host = next(h for h in hosts if h.settings["public_domain"] == b["domain"])
        # connect answers the same way
        r = httpx.post(f"{direct.url}/sandboxes/{b['sandboxID']}/connect", json={"timeout": 60},
                       headers=api, timeout=30)  # fmt: skip
        assert r.status_code in (200, 201) and r.json()["domain"] == b["domain"], r.text
        r = httpx.post(f"{through.url}/sandboxes/{b['sandboxID']}/connect", json={"timeout": 60},
                       headers=api, timeout=30)  # fmt: skip
        assert r.json()["domain"] == "edge.fleet.test"
        # and the host answers the SDK's traffic for that domain itself
        token = b["envdAccessToken"]
        r = httpx.post(
            f"{host.url}/process.Process/List",
            headers={"Host": f"{ENVD}-{b['sandboxID']}.{b['domain']}",
                     "X-Access-Token": str(token), "Content-Type": "application/json"},
            json={}, timeout=30,
        )  # fmt: skip
        assert r.status_code == 200, r.text
    finally:
        for s in (a, b):
            httpx.delete(f"{through.url}/sandboxes/{s['sandboxID']}", headers=api, timeout=30)
