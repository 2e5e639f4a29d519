"""The gateway console's pages in a real browser (Playwright, Debian's Chromium) against a live
gateway on the local provider: charts drawn from events at known times (the data behind each
series read back, and a click on a bucket narrowing the table to it), a timeline that shows what
a call ran and printed as inert text with the whole of it downloadable, a sandbox's page whose
history grows while it burns CPU, and guarded actions: a kill from the console ends the sandbox
and is audited, and a tenant key can neither see nor act on another tenant's sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from sandhold.audit import console_dir, query
from sandhold.config import Settings
from sandhold.store.db import Store
from tests.console.test_console_gateway import EVIL_OUTPUT, assert_nothing_ran, call, sign_in
from tests.support.gateway_server import ADMIN_KEY, OTHER_KEY, TENANT_KEY, Gateway, wait_for

LASTING = {"keep_alive_s": 600, "retention_s": 600, "max_command_timeout_s": 120}
TENANTS = {"acme": {"api_key": TENANT_KEY, "policy": LASTING},
           "globex": {"api_key": OTHER_KEY, "policy": LASTING}}  # fmt: skip


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    ctx = browser.new_context(timezone_id="UTC", accept_downloads=True)
    page = ctx.new_page()
    page.dialogs = []  # type: ignore[attr-defined]
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))  # type: ignore[attr-defined]
    yield page
    ctx.close()


def api(gw: Gateway, key: str, endpoint: str, **body: object) -> httpx.Response:
    return httpx.post(f"{gw.url}/console/api/{endpoint}", json=body,
                      headers={"Authorization": f"Bearer {key}"}, timeout=60)  # fmt: skip


def series_of(page: Page, chart: str) -> dict:
    figure = page.locator(f"figure[data-chart={chart}]")
    return json.loads(figure.get_attribute("data-series") or "{}")


def test_charts_count_events_at_known_times(make_gateway: Callable[..., Gateway], page: Page):
    gw = make_gateway("local", gateway_tenants=json.dumps(TENANTS))
    assert call(gw, TENANT_KEY, "conv-chart", "run_command", "grading",
                command="true").status_code == 200  # fmt: skip
    day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    start = day - 2 * 86400  # a whole day two days ago: every hour of it rolled up or not
    at = lambda hour, minute: start + hour * 3600 + minute * 60  # noqa: E731
    events = [dict(kind="tool_call", tool="run_command", duration_ms=10.0 + i, at=at(2, i))
              for i in range(3)]  # fmt: skip
    events += [dict(kind="tool_call", tool="run_code", duration_ms=40.0, at=at(5, i))
               for i in range(4)]  # fmt: skip
    events.append(dict(kind="tool_call", tool="read_file", duration_ms=5.0, at=at(5, 30),
                       error="not_found: no such file"))  # fmt: skip
    store = Store(Settings(data_dir=gw.data_dir).gateway_store)
    try:
        store.add_events([{"tenant_id": "acme", "session_id": "conv-chart", **e} for e in events])
    finally:
        store.close()

    sign_in(page, gw, ADMIN_KEY)
    page.get_by_label("From").fill(datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%dT%H:%M"))
    page.get_by_label("To").fill(
        datetime.fromtimestamp(start + 86400, UTC).strftime("%Y-%m-%dT%H:%M")
    )
    page.get_by_role("button", name="Show").click()
    expect(page.locator("figure[data-chart=tool_calls] .point").first).to_be_visible()
    calls = series_of(page, "tool_calls")
    hours = [round((x - start) / 3600) for x in calls["xs"]]
    total = dict(zip(hours, calls["series"][0]["values"], strict=True))
    assert calls["series"][0]["name"] == "total"
    assert total[2] == 3 and total[5] == 5 and sum(v or 0 for v in total.values()) == 8
    failures = series_of(page, "failures")
    by_class = {s["name"]: s["values"] for s in failures["series"]}
    assert by_class["not_found"][hours.index(5)] == 1
    assert sum(v or 0 for v in by_class["not_found"]) == 1

    # A click on hour 5 narrows the table to that hour: the five calls of then, one failed.
    page.locator(f"figure[data-chart=tool_calls] rect.hit[data-index='{hours.index(5)}']").click()
    picked = page.locator("section[aria-label='by tenant and scenario']")
    expect(picked.get_by_role("heading")).to_contain_text("Picked")
    row = picked.get_by_role("row").filter(has_text="grading")
    expect(row).to_contain_text("not_found: 1")
    expect(row.locator("td").nth(3)).to_have_text("5")
    picked.get_by_role("button", name="whole range").click()
    expect(picked.get_by_role("heading")).to_contain_text("whole range")
    assert_nothing_ran(page, page.dialogs)  # type: ignore[attr-defined]


def test_a_timeline_shows_what_ran_as_text(
    make_gateway: Callable[..., Gateway], page: Page, tmp_path: Path
):
    gw = make_gateway("local", gateway_tenants=json.dumps(TENANTS))
    r = call(gw, TENANT_KEY, "conv-ran", "run_command", "grading",
             command=f"cat <<'X'\n{EVIL_OUTPUT}\nX\necho '<i>err</i>' >&2")  # fmt: skip
    assert r.status_code == 200, r.text
    long = call(gw, TENANT_KEY, "conv-ran", "run_command", "grading",
                command="seq 1 3000")  # fmt: skip
    assert long.status_code == 200
    full = long.json()["stdout"]
    assert len(full) > 4096

    sign_in(page, gw, ADMIN_KEY)
    page.get_by_role("button", name="Sessions").click()
    page.get_by_role("button", name="conv-ran").click()
    rows = page.locator("main table tbody tr")
    evil = rows.filter(has_text="err")
    expect(evil.locator(".text-stdout pre")).to_have_text(EVIL_OUTPUT + "\n")
    expect(evil.locator(".text-stderr pre")).to_have_text("<i>err</i>\n")
    expect(evil.locator(".text-input pre")).to_contain_text(f"cat <<'X'\n{EVIL_OUTPUT}")
    counted = rows.filter(has_text="seq 1 3000")
    expect(counted.locator(".text-stdout")).to_contain_text(f"first 4096 characters of {len(full)}")
    with page.expect_download() as download:
        counted.locator(".text-stdout").get_by_role("button", name="download").click()
    saved = tmp_path / "stdout.txt"
    download.value.save_as(saved)
    assert saved.read_text() == full
    assert page.locator("main i").count() == 0
    assert_nothing_ran(page, page.dialogs)  # type: ignore[attr-defined]

    # Another tenant's event text: not found, as if there were none.
    event = api(gw, ADMIN_KEY, "timeline", tenant="acme", session="conv-ran").json()["events"][0]
    theirs = api(gw, OTHER_KEY, "text", tenant="acme", session="conv-ran", event=event["id"],
                 name="stdout")  # fmt: skip
    assert theirs.status_code == 404
    mine = api(gw, TENANT_KEY, "text", session="conv-ran", event=event["id"], name="stdout")
    assert mine.status_code == 200 and mine.json()["text"] == full
    bad = api(gw, TENANT_KEY, "text", session="conv-ran", event="1", name="stdout")
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_argument"


def test_the_sandbox_page_and_its_guarded_actions(make_gateway: Callable[..., Gateway], page: Page):
    gw = make_gateway("local", gateway_tenants=json.dumps(TENANTS),
                      server_console_sample_interval_s=0.5)  # fmt: skip
    burn = call(gw, TENANT_KEY, "conv-burn", "run_command", "grading", background=True,
                command="timeout 120 sh -c 'while :; do :; done'")  # fmt: skip
    assert burn.status_code == 200, burn.text
    assert call(gw, OTHER_KEY, "conv-other", "run_command", "office",
                command="true").status_code == 200  # fmt: skip
    with gw.client(TENANT_KEY) as c:
        sandbox_id = c.get("/v1/sessions/conv-burn").json()["sandbox"]["id"]

    # Another tenant: not found, and its kill changes nothing.
    for action in ("sandbox", "kill", "pause"):
        r = api(gw, OTHER_KEY, action, sandbox_id=sandbox_id)
        assert r.status_code == 404, (action, r.text)
    assert api(gw, OTHER_KEY, "close", session="conv-burn").status_code == 404
    assert api(gw, TENANT_KEY, "sandbox", sandbox_id=sandbox_id).json()["sandbox"]["state"] == (
        "running"
    )
    theirs = [s["sandbox_id"] for s in api(gw, OTHER_KEY, "sandboxes").json()["sandboxes"]]
    assert sandbox_id not in theirs

    sign_in(page, gw, ADMIN_KEY)
    page.get_by_role("button", name="Sandboxes").click()
    row = page.get_by_role("row").filter(has_text="conv-burn")
    expect(row).to_contain_text("base")  # the template column, filled
    row.get_by_role("button", name=sandbox_id).click()
    expect(page.locator("main table.facts")).to_contain_text("acme / session conv-burn")

    def burning() -> bool:  # the page refreshes itself: its CPU series grows, busy
        values = series_of(page, "cpu")["series"][0]["values"] if page.locator(
            "figure[data-chart=cpu]").count() else []  # fmt: skip
        return len([v for v in values if v and v > 20]) >= 3

    wait_for(burning, timeout=60, interval=0.5)
    page.get_by_role("button", name="Kill").click()
    page.get_by_role("button", name="Confirm kill").click()
    expect(page.locator("main .actions")).to_contain_text("killed")

    def gone() -> bool:
        return api(gw, ADMIN_KEY, "sandbox", sandbox_id=sandbox_id).status_code == 404

    wait_for(gone, timeout=30)  # fmt: skip
    audited = query(console_dir(gw.data_dir), action="kill")
    assert [(a["actor"], a["tenant"], a["sandbox"], a["status"]) for a in audited] == [
        ("tenant globex", "globex", sandbox_id, "refused"),  # the attempt above, recorded
        ("admin", "acme", sandbox_id, "done"),
    ]
    timeline = api(gw, ADMIN_KEY, "timeline", tenant="acme", session="conv-burn").json()
    acted = [e for e in timeline["events"] if e["kind"] == "operator_action"]
    assert acted[0]["tool"] == "kill" and "by admin" in acted[0]["reason"]
    assert any(e["kind"] == "sandbox_killed" for e in timeline["events"])

    # A tenant acts on its own: no pause while a call runs in it (409), then pause and close.
    other = api(gw, OTHER_KEY, "sandboxes").json()["sandboxes"][0]["sandbox_id"]
    started = gw.workspaces / "globex" / "conv-other" / "started"
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(call, gw, OTHER_KEY, "conv-other", "run_command", "office",
                              command="touch /workspace/started; sleep 5")  # fmt: skip
        wait_for(started.exists, timeout=30)
        busy = api(gw, OTHER_KEY, "pause", sandbox_id=other)
        assert busy.status_code == 409 and "tool call is running" in busy.json()["message"]
        assert running.result().status_code == 200  # the call was not frozen halfway
    assert api(gw, OTHER_KEY, "pause", sandbox_id=other).status_code == 200
    wait_for(lambda: api(gw, OTHER_KEY, "sandbox", sandbox_id=other).json()["sandbox"]["state"]
             == "paused", timeout=30)  # fmt: skip
    assert api(gw, OTHER_KEY, "close", session="conv-other").json()["status"] == "done"
    log = query(console_dir(gw.data_dir))
    assert [(a["actor"], a["action"], a["status"]) for a in log] == [
        ("tenant globex", "kill", "refused"),
        ("tenant globex", "pause", "refused"), ("tenant globex", "close", "refused"),
        ("admin", "kill", "done"), ("tenant globex", "pause", "refused"),
        ("tenant globex", "pause", "done"),
        ("tenant globex", "close", "done"),
    ]  # fmt: skip
    assert api(gw, OTHER_KEY, "close", session="conv-other").status_code == 409
    assert query(console_dir(gw.data_dir))[-1]["status"] == "refused"
    cli = subprocess.run(
        [sys.executable, "-m", "sandhold.cli", "audit", "console", "--decision", "refused"],
        env={**os.environ, "SANDHOLD_DATA_DIR": str(gw.data_dir)}, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    lines = [json.loads(line) for line in cli.stdout.splitlines()]
    assert [r["action"] for r in lines] == ["kill", "pause", "close", "pause", "close"]
