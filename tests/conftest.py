"""Fixtures shared by every layer's tests: a real runtime on a throw-away data dir."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandhold.config import Settings
from sandhold.runtime import cgroups
from sandhold.runtime.runtime import Runtime, SandboxInfo
from sandhold.runtime.spec import SandboxSpec
from sandhold.store.db import Store
from tests.gateway.postgres import Postgres

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
    cgroups.remove_parent(settings.cgroup_group)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def settings(data_dir: Path) -> Settings:
    return Settings(data_dir=data_dir)


@pytest.fixture(scope="session")
def runtime(settings: Settings) -> Runtime:
    rt = Runtime(settings).open()
    rt.templates.get("base")  # build once, up front
    return rt


class SandboxFactory:
    """Creates sandboxes for one test and kills whatever is left of them afterwards."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.created: list[str] = []

    async def __call__(self, **spec: object) -> SandboxInfo:
        info = self.runtime.create(SandboxSpec.model_validate(spec))
        self.created.append(info.id)
        return info

    async def cleanup(self) -> None:
        for sid in self.created:
            try:
                self.runtime.kill(sid)
            except Exception:
                pass


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
