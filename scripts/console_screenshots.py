"""Regenerate the console's screenshots in docs/img (docs/console.md shows them).

    .venv/bin/python scripts/console_screenshots.py

Starts a gateway on the local provider and a `sandhold serve` on loopback (scratch data dirs,
removed at the end), gives them real sessions, tool calls, a failure, a template build, a
snapshot and a volume, adds a week of timeline events to the gateway's store so that the charts
have a shape (on the two sessions' scenarios), and photographs each page with Debian's
Chromium (Playwright, headless, 1280 px wide).
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from e2b import Sandbox, Template, Volume  # noqa: E402
from playwright.sync_api import Page, sync_playwright  # noqa: E402
from tests.console.conftest import CHROMIUM  # noqa: E402
from tests.support.e2b_server import KEY_A, destroy_runtime_dir, new_server  # noqa: E402
from tests.support.gateway_server import (  # noqa: E402
    ADMIN_KEY,
    TENANT_KEY,
    Gateway,
    gateway_env,
    scratch_dir,
)

from sandhold.config import Settings  # noqa: E402
from sandhold.store.db import Store  # noqa: E402

IMG = ROOT / "docs" / "img"
DAY = 86400
HISTORY = ("conv-0900", "conv-0901")  # sessions given a week of synthetic events
TENANTS = {"acme": {"api_key": TENANT_KEY, "policy": {"keep_alive_s": 600, "retention_s": 3600}}}


def gateway(tmp: Path) -> Gateway:
    data_dir = scratch_dir("sandhold-shots-")
    env = gateway_env(data_dir, "local", None, "shots", gateway_tenants=json.dumps(TENANTS),
                      server_console_sample_interval_s=1)  # fmt: skip
    gw = Gateway(data_dir, env, tmp / "gateway.log")
    gw.start()
    return gw


def week_of_events(gw: Gateway) -> None:
    """Synthetic events over the last 7 days: a daily rhythm, latency and a few failures."""
    rng = random.Random(7)
    now = time.time()
    rows = []
    for hour in range(7 * 24):
        at = now - 7 * DAY + hour * 3600
        busy = 20 + 60 * max(0.0, 1 - abs((datetime.fromtimestamp(at, UTC).hour - 14) / 8))
        for session in HISTORY:
            for _ in range(int(busy * rng.uniform(0.6, 1.2))):
                failed = rng.random() < 0.03
                error = rng.choice(["timeout: ran past 60 s", "sandbox_gone: x"])
                rows.append({
                    "tenant_id": "acme", "session_id": session, "kind": "tool_call",
                    "tool": "run_code", "at": at + rng.uniform(0, 3600),
                    "duration_ms": rng.lognormvariate(4.5, 0.6),
                    "error": error if failed else None,
                })  # fmt: skip
    for day in range(7):  # a sandbox per session each working day: live, then paused
        start = now - (7 - day) * DAY
        for session in HISTORY:
            for kind, hour in (("sandbox_resumed", 8), ("sandbox_paused", 17)):
                rows.append({"tenant_id": "acme", "session_id": session, "kind": kind,
                             "sandbox_id": "sbx-demo", "at": start + hour * 3600})  # fmt: skip
    store = Store(Settings(data_dir=gw.data_dir).gateway_store)
    try:
        store.add_events(rows)
    finally:
        store.close()


def call(gw: Gateway, session: str, tool: str, scenario: str, **args: object) -> None:
    with gw.client(TENANT_KEY) as c:
        c.post(f"/v1/sessions/{session}/tools/{tool}", json=args,
               headers={"X-Sandhold-Scenario": scenario})  # fmt: skip


def sign_in(page: Page, url: str, label: str, key: str) -> None:
    page.goto(f"{url}/console")
    page.get_by_label(label).fill(key)
    page.get_by_role("button", name="Sign in").click()


def shot(page: Page, name: str, full_page: bool = True) -> None:
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(IMG / f"console-{name}.png"), full_page=full_page)
    print(f"docs/img/console-{name}.png")


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="sandhold-shots-"))
    gw = gateway(tmp)
    srv = new_server(tmp, template_build_allow_out="[]")
    srv.start()
    made: list[Sandbox] = []
    try:
        call(gw, "conv-1042", "run_code", "grading", code="import statistics\n"
             "print(statistics.mean([3, 5, 8]))")  # fmt: skip
        call(gw, "conv-1042", "run_command", "grading", command="ls -la /workspace")
        call(gw, "conv-1042", "read_file", "grading", path="missing.txt")
        call(gw, "conv-2077", "run_command", "office", background=True,
             command="timeout 90 sh -c 'while :; do :; done'")  # fmt: skip
        call(gw, HISTORY[0], "run_command", "grading", command="true")
        call(gw, HISTORY[1], "run_command", "office", command="true")
        week_of_events(gw)
        a = srv.sdk(KEY_A)
        kit = (
            Template()
            .from_base_image()
            .run_cmd("pip list | head -5 && head -c 2000000 /dev/urandom > /home/user/sample.bin")
        )
        Template.build(kit, "report-kit", **a)
        made.append(Sandbox.create(timeout=300, **a))
        made[0].create_snapshot(mode="filesystem")
        Volume.create("course-data", api_key=KEY_A, api_url=srv.url)

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            sign_in(page, gw.url, "Admin or tenant key", ADMIN_KEY)
            page.get_by_label("time range").select_option(str(7 * DAY))
            page.get_by_role("button", name="Show").click()
            page.locator("figure[data-chart=tool_calls] .point").first.wait_for()
            shot(page, "overview")
            page.get_by_role("button", name="Failures").click()
            shot(page, "failures", full_page=False)  # hundreds of rows: the first screenful
            page.get_by_role("button", name="Sessions").click()
            page.get_by_role("button", name="conv-1042").click()
            page.locator("main .ran").first.wait_for()
            shot(page, "timeline")
            page.get_by_role("button", name="Sandboxes").click()
            page.get_by_role("row").filter(has_text="conv-2077").locator("button.sandbox").click()
            time.sleep(12)  # a few of the sampler's points (the page refreshes itself)
            shot(page, "sandbox")
            sign_in(page, srv.url, "API key", KEY_A)
            page.get_by_role("button", name="Templates").click()
            time.sleep(3)  # sizes are measured in the background after the first ask
            page.get_by_role("button", name="Templates").click()
            page.locator("main table").wait_for()
            shot(page, "templates")
            page.get_by_role("row").filter(has_text="report-kit").locator(
                "button.build"
            ).first.click()
            page.locator("main pre.logs").wait_for()
            shot(page, "build")
            browser.close()
    finally:
        for s in made:
            s.kill()
        gw.close()
        destroy_runtime_dir(gw.data_dir)
        srv.destroy()


if __name__ == "__main__":
    main()
