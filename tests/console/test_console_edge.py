"""The console of `sandhold edge serve` in a real browser: the operator (the metrics token) sees
the fleet's hosts, a lost one marked, and which host holds each sandbox; a team sees its own
sandboxes and never the hosts."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox
from playwright.sync_api import Browser, Page, expect

from tests.fleet.harness import Edge, catalog_url, host_of, new_host, running, wait_for
from tests.support.e2b_server import KEY_A, KEY_B, Server

OPERATOR = "operator-token-" + "o" * 16


@pytest.fixture
def fleet(postgres, tmp_path: Path) -> Iterator[tuple[list[Server], Edge]]:  # type: ignore[no-untyped-def]
    hosts = [new_host(tmp_path, f"c{i}") for i in (1, 2)]
    edge = Edge(tmp_path, catalog_url(postgres), hosts, server_metrics_token=OPERATOR)
    with running(hosts, [edge]):
        yield hosts, edge


def sign_in(page: Page, url: str, key: str) -> None:
    page.goto(f"{url}/console")
    page.get_by_label("API key or metrics token").fill(key)
    page.get_by_role("button", name="Sign in").click()


def test_the_operator_sees_the_hosts_and_where_each_sandbox_is(fleet, browser: Browser) -> None:  # type: ignore[no-untyped-def]
    hosts, edge = fleet
    mine = Sandbox.create(timeout=120, **edge.sdk(KEY_A))
    theirs = Sandbox.create(timeout=120, **edge.sdk(KEY_B))
    holder = next(h for h in hosts if host_of(h, mine.sandbox_id))
    page = browser.new_page()
    try:
        sign_in(page, edge.url, OPERATOR)
        expect(page.get_by_text("admin", exact=True)).to_be_visible()
        for h in hosts:
            row = page.get_by_role("row").filter(has_text=h.settings["fleet_host_id"])
            expect(row).to_contain_text("ready")
        page.get_by_role("button", name="Sandboxes").click()
        row = page.get_by_role("row").filter(has_text=mine.sandbox_id)
        expect(row).to_contain_text(holder.settings["fleet_host_id"])
        expect(page.get_by_role("cell", name=theirs.sandbox_id)).to_be_visible()

        # A host killed: lost, in red, once the edge has judged it.
        other = next(h for h in hosts if h is not holder)
        other.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        other.proc.wait()  # type: ignore[union-attr]
        other.sock.close()
        api = f"{edge.url}/console/api/hosts"
        auth = {"Authorization": f"Bearer {OPERATOR}"}

        def lost() -> bool:
            got = httpx.post(api, json={}, headers=auth, timeout=10).json()["hosts"]
            return any(h["state"] == "lost" for h in got)

        wait_for(lost, 30, "the host lost")
        page.get_by_role("button", name="Hosts").click()
        row = page.get_by_role("row").filter(has_text=other.settings["fleet_host_id"])
        expect(row).to_contain_text("lost")
        expect(row).to_have_class("failure")
        other.proc = None

        # A team: its own sandboxes, no hosts.
        page.get_by_role("button", name="Sign out").click()
        sign_in(page, edge.url, KEY_A)
        expect(page.get_by_role("cell", name=mine.sandbox_id)).to_be_visible()
        assert page.get_by_role("cell", name=theirs.sandbox_id).count() == 0
        r = httpx.post(api, json={}, headers={"Authorization": f"Bearer {KEY_A}"}, timeout=10)
        assert r.status_code == 403
    finally:
        page.close()
        mine.kill()
        theirs.kill()
