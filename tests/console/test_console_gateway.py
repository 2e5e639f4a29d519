"""The gateway's console in a real browser (Playwright, Debian's Chromium) against a live gateway
with real sessions (local provider): usage by tenant and scenario, a session's timeline, a
failure that links to its timeline, a tenant key that sees its own tenant only, and markup
injected through a command, a file name and a session label that never runs in the page."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
from playwright.sync_api import Browser, Page, expect

from tests.support.gateway_server import ADMIN_KEY, OTHER_KEY, TENANT_KEY, Gateway

PWN = "window.__pwned = (window.__pwned || 0) + 1"
EVIL_LABEL = f"<img src=x onerror='{PWN}'>"
EVIL_NAME = f"<svg onload='{PWN}'>.txt"
EVIL_OUTPUT = f"<script>{PWN}</script><b onmouseover='{PWN}'>bold</b>"


def call(
    gw: Gateway, key: str, session: str, tool: str, scenario: str, **args: object
) -> httpx.Response:
    with gw.client(key) as c:
        return c.post(f"/v1/sessions/{session}/tools/{tool}", json=args,
                      headers={"X-Sandhold-Scenario": scenario})  # fmt: skip


def sign_in(page: Page, gw: Gateway, key: str) -> None:
    page.goto(f"{gw.url}/console")
    page.get_by_label("Admin or tenant key").fill(key)
    page.get_by_role("button", name="Sign in").click()


def assert_nothing_ran(page: Page, dialogs: list[str]) -> None:
    assert page.evaluate("window.__pwned") is None and not dialogs
    assert page.locator("main img, main script, main b").count() == 0
    # the charts' own SVG only, and no element carries a handler
    assert page.locator("main svg").count() == page.locator("main figure.chart svg").count()
    assert page.locator("[onload], [onerror], [onmouseover]").count() == 0


# Sessions that outlive the test: with the gateway tests' 2 s retention a slow run reclaims
# the first session's sandbox before the Sandboxes view is looked at.
LASTING = {"keep_alive_s": 2, "retention_s": 600, "max_command_timeout_s": 120}


def test_the_console_of_live_sessions(make_gateway: Callable[..., Gateway], browser: Browser):
    tenants = {"acme": {"api_key": TENANT_KEY, "policy": LASTING},
               "globex": {"api_key": OTHER_KEY, "policy": LASTING}}  # fmt: skip
    gw = make_gateway("local", gateway_tenants=json.dumps(tenants))
    r = call(gw, TENANT_KEY, "conv-grading", "run_command", "grading",
             command=f"echo \"{EVIL_OUTPUT}\"")  # fmt: skip
    assert r.status_code == 200, r.text
    assert call(gw, TENANT_KEY, "conv-grading", "write_file", "grading", path=EVIL_NAME,
                content="x").status_code == 200  # fmt: skip
    failed = call(gw, TENANT_KEY, "conv-grading", "read_file", "grading", path="missing.txt")
    assert failed.status_code >= 400
    assert call(gw, TENANT_KEY, "conv-evil", "run_command", EVIL_LABEL,
                command="true").status_code == 200  # fmt: skip
    assert call(gw, OTHER_KEY, "conv-globex", "run_command", "office",
                command="true").status_code == 200  # fmt: skip

    page = browser.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    try:
        # The admin: every tenant, grouped by scenario; a failure leads to its timeline.
        sign_in(page, gw, ADMIN_KEY)
        overview = page.locator("main table")
        expect(overview.get_by_role("row").filter(has_text="grading")).to_contain_text("acme")
        expect(overview.get_by_role("row").filter(has_text="office")).to_contain_text("globex")
        expect(overview).to_contain_text(EVIL_LABEL)  # the label shown as text
        page.get_by_role("button", name="Failures").click()
        row = page.get_by_role("row").filter(has_text="read_file")
        expect(row).to_contain_text("conv-grading")
        row.get_by_role("button", name="conv-grading").click()
        expect(page.get_by_role("heading", level=2)).to_contain_text("conv-grading")
        timeline = page.locator("main table")
        expect(timeline).to_contain_text("run_command")
        expect(timeline).to_contain_text(EVIL_OUTPUT)  # what the command printed, as text
        expect(timeline).to_contain_text(EVIL_NAME)  # the path write_file named
        expect(timeline.get_by_role("row").filter(has_text="read_file")).to_have_class("failure")
        assert_nothing_ran(page, dialogs)
        page.get_by_role("button", name="Sessions").click()
        expect(page.locator("main table")).to_contain_text("conv-globex")
        page.get_by_role("button", name="Sandboxes").click()
        expect(page.locator("main table")).to_contain_text("conv-grading")
        page.get_by_role("button", name="Overview").click()  # a chosen range: nothing in it
        page.get_by_label("From").fill("2099-01-01T00:00")
        page.get_by_label("To").fill("2099-01-02T00:00")
        page.get_by_role("button", name="Show").click()
        expect(page.locator("main")).to_contain_text(", 0 events")
        page.get_by_role("button", name="Sign out").click()

        # A tenant: its own sessions only, whatever it asks for.
        sign_in(page, gw, TENANT_KEY)
        page.get_by_role("button", name="Sessions").click()
        sessions = page.locator("main table")
        expect(sessions).to_contain_text("conv-grading")
        expect(sessions).not_to_contain_text("conv-globex")
        assert_nothing_ran(page, dialogs)
        assert not any(k in u for u in urls for k in (ADMIN_KEY, TENANT_KEY, "conv-"))
    finally:
        page.close()


def test_a_tenant_cannot_read_another_tenants_timeline(make_gateway: Callable[..., Gateway]):
    gw = make_gateway("local")
    assert call(gw, OTHER_KEY, "conv-theirs", "run_command", "x", command="true").status_code == 200
    headers = {"Authorization": f"Bearer {TENANT_KEY}"}
    r = httpx.post(f"{gw.url}/console/api/timeline", headers=headers,
                   json={"tenant": "globex", "session": "conv-theirs"})  # fmt: skip
    assert r.status_code == 404, r.text  # asked as acme's: not found, not revealed
    r = httpx.post(f"{gw.url}/console/api/sessions", headers=headers, json={"tenant": "globex"})
    assert [s["tenant_id"] for s in r.json()["sessions"]] == []
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    r = httpx.post(f"{gw.url}/console/api/timeline", headers=admin,
                   json={"tenant": "globex", "session": "conv-theirs"})  # fmt: skip
    assert r.status_code == 200 and r.json()["events"][0]["kind"] == "tool_call"
    with gw.client(TENANT_KEY) as c:
        bad = c.post("/v1/sessions/conv-x/tools/run_command", json={"command": "true"},
                     headers={"X-Sandhold-Scenario": "x" * 65})  # fmt: skip
    assert bad.status_code == 400 and "x-sandhold-scenario" in bad.text.lower()


def test_a_late_answer_never_lands_in_the_next_view(
    make_gateway: Callable[..., Gateway], browser: Browser
):
    # The overview's answer held back until the Sessions view has shown its own: it must not be
    # appended below it (it once was: two tables in one view).
    gw = make_gateway("local")
    assert call(gw, TENANT_KEY, "conv-late", "run_command", "grading",
                command="true").status_code == 200  # fmt: skip
    page = browser.new_page()
    held: list = []
    page.route("**/console/api/series", lambda route: held.append(route))
    try:
        sign_in(page, gw, ADMIN_KEY)
        page.get_by_role("button", name="Sessions").click()
        expect(page.locator("main table")).to_contain_text("conv-late")
        assert len(held) == 1
        with page.expect_response("**/console/api/series") as answer:
            held[0].continue_()
        assert answer.value.ok
        page.evaluate("() => new Promise((r) => setTimeout(r, 100))")  # (its continuation ran)
        expect(page.locator("main table")).to_have_count(1)
        expect(page.locator("main h2")).to_have_text("Sessions")
        # A request that fails (the network, not the server) after its view was left: its
        # error is not shown in the view now on screen either.
        page.get_by_role("button", name="Overview").click()
        expect(page.locator("main h2")).to_contain_text("Usage")
        assert len(held) == 2
        page.get_by_role("button", name="Sessions").click()
        expect(page.locator("main table")).to_contain_text("conv-late")
        with page.expect_event("requestfailed"):
            held[1].abort()
        page.evaluate("() => new Promise((r) => setTimeout(r, 100))")  # (its continuation ran)
        expect(page.locator("main .error")).to_have_count(0)
        expect(page.locator("main h2")).to_have_text("Sessions")
    finally:
        page.close()
