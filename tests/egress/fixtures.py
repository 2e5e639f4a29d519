"""Fixtures of the egress tests, shared with tests/security (imported by both conftests): the
test internet, a runtime whose egress proxy uses it, and sandboxes with egress."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandhold.config import Settings
from sandhold.egress.secrets import SecretStore, open_store
from sandhold.runtime import cgroups, mounts
from sandhold.runtime.runtime import Runtime, SandboxInfo
from tests.egress.internet import Internet
from tests.support.sandboxes import SandboxFactory

SECRET = "sk-test-Zq8vX3nR6yL1pW4t"  # what the tenant stores; sandboxes must never see it
TENANT = "acme"


def daemon_pids(data_dir: Path) -> list[int]:
    """Egress daemons serving ``data_dir`` (by their command line; ours only)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"sandhold.egress.daemon" in cmd and str(data_dir).encode() in cmd:
            out.append(int(pid))
    return out


@pytest.fixture(scope="session")
def internet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Internet]:
    net = Internet(tmp_path_factory.mktemp("internet"))
    yield net
    net.close()
    assert not net.exists(), "the test internet's netns or veth was left behind"


def settings_over(internet: Internet, prefix: str, **overrides: object) -> Settings:
    """Settings of a new data dir whose egress proxy uses the test internet."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    d.chmod(0o755)
    return Settings(data_dir=d, **{**internet.settings(), **overrides})  # type: ignore[arg-type]


def runtime_over(settings: Settings) -> Iterator[Runtime]:
    """A runtime over ``settings``; after it, every sandbox, mount, group and daemon of it gone."""
    rt = Runtime(settings).open()
    rt.templates.get("base")
    yield rt
    d = settings.data_dir
    for info in rt.list():
        rt.kill(info.id)
    for target in mounts.mounts_under(d):
        mounts.umount(Path(target))
    cgroups.remove_parent(rt.host.cgroup_group)
    leftover = daemon_pids(d)
    shutil.rmtree(d, ignore_errors=True)
    assert not leftover, f"the egress daemon outlived its last sandbox: {leftover}"


@pytest.fixture(scope="session")
def egress_settings(internet: Internet) -> Settings:
    return settings_over(internet, "sandhold-egress-")


@pytest.fixture(scope="session")
def egress_runtime(egress_settings: Settings) -> Iterator[Runtime]:
    yield from runtime_over(egress_settings)


@pytest.fixture(scope="session")
def secret_store(egress_settings: Settings) -> SecretStore:
    store = open_store(Settings(data_dir=egress_settings.data_dir))
    store.set(TENANT, "api-token", SECRET, ["api.example.test"])
    return store


class EgressSandboxes(SandboxFactory):
    """The runtime suite's factory, with the egress policy as arguments."""

    async def __call__(
        self,
        mode: str = "allowlist",
        allow: list[str] | None = None,
        deny: list[str] | None = None,
        tenant: str | None = TENANT,
        **spec: Any,
    ) -> SandboxInfo:
        network = {"mode": mode, "allow": allow or [], "deny": deny or [], "tenant": tenant}
        return await super().__call__(network=network, **spec)


@pytest.fixture
async def egress_sandbox(
    egress_runtime: Runtime, secret_store: SecretStore
) -> AsyncIterator[EgressSandboxes]:
    factory = EgressSandboxes(egress_runtime)
    yield factory
    await factory.cleanup()
