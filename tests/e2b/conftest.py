"""Fixtures of the E2B server's tests: one `sandhold serve` for the session, the SDK's
environment pointed at it, a shared sandbox, an API client (tests/support/e2b_server.py)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox

from tests.support.e2b_server import KEY_A, Server, new_server


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = new_server(tmp_path_factory.mktemp("e2b"))
    srv.start()
    with pytest.MonkeyPatch.context() as mp:
        # What docs/e2b.md tells users to set: both URLs point at the one server port.
        mp.setenv("E2B_API_URL", srv.url)
        mp.setenv("E2B_SANDBOX_URL", srv.url)
        mp.setenv("E2B_API_KEY", KEY_A)
        mp.setenv("NO_PROXY", "127.0.0.1,localhost")
        mp.delenv("E2B_DEBUG", raising=False)
        yield srv
    srv.destroy()


@pytest.fixture(scope="module")
def sbx(server: Server) -> Iterator[Sandbox]:
    """A sandbox shared by the tests of one module that do not disturb each other."""
    s = Sandbox.create(timeout=900)
    yield s
    s.kill()


@pytest.fixture
def api(server: Server) -> Iterator[httpx.Client]:
    with server.api() as client:
        yield client
