"""A real browser for the console's tests: Playwright driving Debian's Chromium, headless (the
gateways they drive: ``make_gateway`` of tests/conftest.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, sync_playwright

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # Per module, not per session: Playwright's sync API runs an event loop on this thread
    # while it is open, and the async tests a worker runs next must find none running.
    with sync_playwright() as p:
        # --no-sandbox: Chromium's own sandbox refuses to run as root (the test machine's user)
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()
