"""Fixtures of the agent's tests: an agent started as a sandbox starts it (``start_agent``,
tests/support/agent.py), and the loop tests' two loops."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.support.agent import AgentHandle, start_agent


@pytest.fixture
async def agent() -> AsyncIterator[AgentHandle]:
    async with start_agent() as handle:
        yield handle


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "aio_only: about aio's own internals, not run against asyncio (test_agent_loop*)"
    )


@pytest.fixture(params=["aio", "asyncio"])
def loop_module(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The loop tests' module run on the agent's loop and on asyncio, the reference its claims
    are held to: the module's ``aio`` (the loop under test) is swapped for asyncio."""
    if request.param == "asyncio":
        if request.node.get_closest_marker("aio_only"):
            pytest.skip("about aio's own internals")
        monkeypatch.setattr(request.module, "aio", asyncio)
    return str(request.param)
