"""Real gateways (`sandhold gateway serve` processes) over real providers: the runtime in the
gateway's process (``local``) or a real `sandhold serve` reached over HTTP (``e2b``)."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.e2b_server import Server, new_server
from tests.support.gateway_server import (
    Gateway,
    destroy_runtime_dir,
    gateway_env,
    kill_tagged,
    scratch_dir,
)


@pytest.fixture(scope="session")
def workspace_root() -> Iterator[Path]:
    """Every test gateway keeps workspaces under one root, which the e2b server may bind."""
    root = scratch_dir("sandhold-gw-ws-")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def e2b_server(tmp_path_factory: pytest.TempPathFactory, workspace_root: Path) -> Iterator[Server]:
    srv = new_server(
        tmp_path_factory.mktemp("gw-e2b"),
        host_mount_roots=json.dumps([str(workspace_root)]),
        lifecycle_interval_s="0.2",
        prebuild_templates="[]",
    )
    srv.start()
    yield srv
    srv.destroy()


@pytest.fixture
def make_gateway(
    request: pytest.FixtureRequest, tmp_path: Path, workspace_root: Path
) -> Iterator[Callable[..., Gateway]]:
    """Start gateways for one test (provider ``local`` or ``e2b``); at the end stop them and
    kill every sandbox they created."""
    made: list[tuple[Gateway, str, Server | None]] = []

    def make(provider: str = "local", server: Server | None = None, **extra: Any) -> Gateway:
        if provider == "e2b" and server is None:
            server = request.getfixturevalue("e2b_server")
        data_dir = scratch_dir("sandhold-gw-")
        name = f"t{uuid.uuid4().hex[:10]}"
        extra.setdefault("gateway_workspace_root", workspace_root / name)
        env = gateway_env(data_dir, provider, server, name, **extra)
        gw = Gateway(data_dir, env, tmp_path / f"gateway-{name}.log")
        gw.server = server
        made.append((gw, name, server))
        gw.start()
        return gw

    yield make
    problems: list[str] = []
    for gw, name, server in made:
        gw.close()
        if server is not None:
            kill_tagged(server, name)
        problems += destroy_runtime_dir(gw.data_dir)
    assert not problems, problems
