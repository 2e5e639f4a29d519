"""The console of `sandhold serve` in a real browser: a team signs in with its API key and sees
its own live sandboxes (created through the official SDK), never another team's; the page is
served with a strict Content-Security-Policy and puts no key in any URL."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox
from playwright.sync_api import Browser, Page, expect

from tests.support.e2b_server import KEY_A, KEY_B, Server, new_server


@pytest.fixture(scope="module")
def console_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = new_server(tmp_path_factory.mktemp("console"))
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
    assert r.headers["x-frame-options"] == "DENY" and "<script src=" in r.text
    assert httpx.get(f"{console_server.url}/console/static/../../etc/passwd").status_code == 404
    # No key: 401; a form post (no JSON) is refused before anything runs.
    api = f"{console_server.url}/console/api/sandboxes"
    assert httpx.post(api, json={}).status_code == 401
    r = httpx.post(api, data={"a": "b"}, headers={"Authorization": f"Bearer {KEY_A}"})
    assert r.status_code == 400 and "application/json" in r.json()["message"]
