"""The console of `sandhold serve` in a real browser: a team signs in with its API key and sees
its own live sandboxes, templates with a build's log, snapshots and volumes (made through the
official SDK), never another team's, and kills a sandbox from its page (audited); the page is
served with a strict Content-Security-Policy and puts no key in any URL."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox, Template, Volume
from playwright.sync_api import Browser, Page, expect

from sandhold.audit import console_dir, query
from tests.support.e2b_server import KEY_A, KEY_B, Server, new_server


@pytest.fixture(scope="module")
def console_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = new_server(tmp_path_factory.mktemp("console"), template_build_allow_out="[]")
    srv.start()
    yield srv
    srv.destroy()


def sign_in(page: Page, url: str, key: str) -> None:
    page.goto(f"{url}/console")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()


def test_a_team_sees_its_own_sandboxes_only(console_server: Server, browser: Browser) -> None:
    url = console_server.url
    mine = Sandbox.create(api_key=KEY_A, api_url=url, sandbox_url=url, timeout=120)
    theirs = Sandbox.create(api_key=KEY_B, api_url=url, sandbox_url=url, timeout=120)
    page = browser.new_page()
    seen: list[str] = []
    page.on("request", lambda r: seen.append(r.url))
    try:
        sign_in(page, url, KEY_A)
        expect(page.get_by_role("cell", name=mine.sandbox_id)).to_be_visible()
        expect(page.get_by_text("tenant team-a")).to_be_visible()
        assert page.get_by_role("cell", name=theirs.sandbox_id).count() == 0
        page.get_by_role("button", name="Sign out").click()
        sign_in(page, url, KEY_B)
        expect(page.get_by_role("cell", name=theirs.sandbox_id)).to_be_visible()
        assert page.get_by_role("cell", name=mine.sandbox_id).count() == 0
        page.get_by_role("button", name="Sign out").click()
        sign_in(page, url, "not-a-key")
        expect(page.get_by_role("alert")).to_contain_text("invalid API key")
        assert not any(KEY_A in u or KEY_B in u for u in seen), seen  # keys never in a URL
    finally:
        page.close()
        mine.kill()
        theirs.kill()


def test_the_page_is_locked_down(console_server: Server) -> None:
    r = httpx.get(f"{console_server.url}/console")
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "unsafe" not in csp
    assert r.headers["x-frame-options"] == "DENY" and '<script type="module" src=' in r.text
    assert httpx.get(f"{console_server.url}/console/static/../../etc/passwd").status_code == 404
    # No key: 401; a form post (no JSON) is refused before anything runs.
    api = f"{console_server.url}/console/api/sandboxes"
    assert httpx.post(api, json={}).status_code == 401
    r = httpx.post(api, data={"a": "b"}, headers={"Authorization": f"Bearer {KEY_A}"})
    assert r.status_code == 400 and "application/json" in r.json()["message"]


def test_pages_of_templates_builds_snapshots_volumes_and_a_kill(
    console_server: Server, browser: Browser
) -> None:
    url, srv = console_server.url, console_server
    a = srv.sdk(KEY_A)
    tpl = Template().from_base_image().run_cmd("echo built-for-the-console-page")
    built = Template.build(tpl, "page-tpl", **a)
    sbx = Sandbox.create(timeout=300, **a)
    snap = sbx.create_snapshot(mode="filesystem")
    volume = Volume.create("page-vol", api_key=KEY_A, api_url=url)
    page = browser.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    try:
        sign_in(page, url, KEY_A)
        page.get_by_role("button", name="Templates").click()
        row = page.get_by_role("row").filter(has_text=built.template_id)
        expect(row).to_contain_text("page-tpl")
        row.locator("button.build").first.click()
        expect(page.locator("main h2")).to_contain_text(built.build_id)
        expect(page.locator("main pre.logs")).to_contain_text("built-for-the-console-page")
        page.get_by_role("button", name="Snapshots").click()
        expect(page.get_by_role("row").filter(has_text=snap.snapshot_id)).to_contain_text(
            sbx.sandbox_id
        )
        page.get_by_role("button", name="Volumes").click()
        expect(page.get_by_role("row").filter(has_text=volume.volume_id)).to_contain_text(
            "page-vol"
        )
        page.get_by_role("button", name="Sandboxes").click()
        page.get_by_role("button", name=sbx.sandbox_id).click()
        expect(page.locator("main table.facts")).to_contain_text("running")
        page.get_by_role("button", name="Kill").click()
        page.get_by_role("button", name="Confirm kill").click()
        expect(page.locator("main .actions")).to_contain_text("killed")
        assert not sbx.is_running()
        [record] = [r for r in query(console_dir(srv.data_dir)) if r["sandbox"] == sbx.sandbox_id]
        done = (record["actor"], record["action"], record["status"])
        assert done == ("tenant team-a", "kill", "done")
        assert not dialogs

        page.get_by_role("button", name="Sign out").click()
        sign_in(page, url, KEY_B)  # the other team: none of it
        page.get_by_role("button", name="Templates").click()
        expect(page.locator("main table")).to_be_visible()
        assert page.get_by_role("row").filter(has_text=built.template_id).count() == 0
        page.get_by_role("button", name="Snapshots").click()
        expect(page.locator("main table")).to_be_visible()
        assert page.get_by_role("row").filter(has_text=snap.snapshot_id).count() == 0
    finally:
        page.close()
        Sandbox.delete_snapshot(snap.snapshot_id, **a)
