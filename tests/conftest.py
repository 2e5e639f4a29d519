"""Fixtures shared by every layer's tests: a real runtime on a throw-away data dir, stores, real
gateways over real providers (tests/gateway, tests/console)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandhold.config import Settings
from sandhold.runtime import cgroups
from sandhold.runtime.runtime import Runtime
from sandhold.store.db import Store
from tests.gateway.postgres import Postgres
from tests.support.e2b_server import Server, new_server
from tests.support.gateway_server import (
    Gateway,
    destroy_runtime_dir,
    gateway_env,
    kill_tagged,
    scratch_dir,
)
from tests.support.sandboxes import SandboxFactory


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The emulated guests first (tests/guest: about ten minutes on one worker), so that the
    other worker runs the rest of the suite meanwhile instead of after."""
    items.sort(key=lambda item: 0 if "tests/guest/" in str(item.path) else 1)


if os.geteuid() != 0:
    pytest.exit("the test suite creates namespaces, cgroups and mounts: run it as root", 2)


@pytest.fixture(scope="session")
def data_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sandhold-test-", dir="/var/tmp"))
    yield d
    settings = Settings(data_dir=d)
    rt = Runtime(settings).open()
    for info in rt.list():
        rt.kill(info.id)
    cgroups.remove_parent(rt.host.cgroup_group)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def settings(data_dir: Path) -> Settings:
    return Settings(data_dir=data_dir)


@pytest.fixture(scope="session")
def runtime(settings: Settings) -> Runtime:
    rt = Runtime(settings).open()
    rt.templates.get("base")  # build once, up front
    return rt


@pytest.fixture
async def make_sandbox(runtime: Runtime) -> AsyncIterator[SandboxFactory]:
    factory = SandboxFactory(runtime)
    yield factory
    await factory.cleanup()


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    """A throw-away PostgreSQL server (tests/gateway/postgres.py), one per module using it."""
    pg = Postgres()
    pg.start()
    yield pg
    pg.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A migrated gateway store holding tenant ``acme``, on SQLite and on PostgreSQL."""
    name = f"s{uuid.uuid4().hex[:12]}"
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / name}.db"
    else:
        url = request.getfixturevalue("postgres").database(name)
    s = Store(url)
    s.migrate()
    s.put_tenant("acme", {}, None)
    yield s
    s.close()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real image registry on loopback for a module's tests (tests/runtime/test_oci.py)."""
    from sandhold.runtime.templates import oci

    ok, detail = oci.tool_status()
    if not ok:
        pytest.skip(detail)
    from tests.runtime.test_oci import running_registry  # (it skips a module without tools)

    with running_registry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


# -- Real gateways (`sandhold gateway serve` processes) for tests/gateway and tests/console, over
# real providers: the runtime in the gateway's process (``local``) or a real `sandhold serve`
# reached over HTTP (``e2b``, the session's ``e2b_server``).


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
