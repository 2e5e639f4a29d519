"""Fixtures of the tunnel tests: one ``World`` per module (tests/support/tunnel.py), a private
network with the internal MCP server, where connectors run and reach real gateways only through
a relayed unix socket; removed at the end (processes, namespace, directories)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gateway_server import scratch_dir
from tests.support.tunnel import World


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    directory = Path(scratch_dir("sandhold-tunnel-"))
    w = World(directory)
    try:
        yield w
    finally:
        problems = w.close()
        shutil.rmtree(directory, ignore_errors=True)
        assert not problems, problems
