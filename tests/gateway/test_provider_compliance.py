"""The provider contract (``sandhold.gateway.providers.base.Provider``), checked the same way for
every provider: ``local`` (the sandbox service in this process) and ``e2b`` (a real `sandhold
serve` over HTTP). Every method is exercised, and every capability a provider declares is shown
to hold; one it does not declare is not assumed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandhold.config import Settings
from sandhold.egress.policy import EgressPolicy
from sandhold.envd import ENVD_PORT
from sandhold.envd.client import EnvdClient
from sandhold.errors import NeedsNewSandbox, PreconditionFailed, SandboxGone, Unsupported
from sandhold.gateway.providers.base import CreateRequest, Provider
from sandhold.gateway.providers.e2b import E2bProvider
from sandhold.gateway.providers.local import LocalProvider
from sandhold.runtime.checkpoint.criu import criu_status
from sandhold.service import forks, snapshots
from tests.counter import COUNTER as BARE_COUNTER
from tests.support.e2b_server import KEY_A, Server, new_server
from tests.support.gateway_server import destroy_runtime_dir, scratch_dir

PROVIDERS = ["local", "e2b"]


@pytest.fixture(scope="module")
def e2b_egress_server(
    tmp_path_factory: pytest.TempPathFactory, workspace_root: Path
) -> Iterator[Server]:
    """A `sandhold serve` set up as the gateway's e2b provider expects: host mounts under the
    workspace root, egress on (so a session's network can change on a live sandbox)."""
    srv = new_server(
        tmp_path_factory.mktemp("compliance-e2b"),
        host_mount_roots=json.dumps([str(workspace_root)]),
        lifecycle_interval_s="0.2",
        prebuild_templates="[]",
        egress_e2b_enabled="true",
    )
    srv.start()
    yield srv
    srv.destroy()


def suspend_server(
    tmp_path_factory: pytest.TempPathFactory, workspace_root: Path, after: str
) -> Iterator[Server]:
    srv = new_server(
        tmp_path_factory.mktemp("compliance-suspend"),
        host_mount_roots=json.dumps([str(workspace_root)]),
        lifecycle_interval_s="0.2",
        prebuild_templates="[]",
        suspend_after_s=after,
    )
    srv.start()
    yield srv
    srv.destroy()


@pytest.fixture(scope="module")
def e2b_suspend_server(
    tmp_path_factory: pytest.TempPathFactory, workspace_root: Path
) -> Iterator[Server]:
    """A `sandhold serve` that suspends paused sandboxes to disk at once."""
    yield from suspend_server(tmp_path_factory, workspace_root, "0")


@pytest.fixture(scope="module")
def e2b_never_suspending_server(
    tmp_path_factory: pytest.TempPathFactory, workspace_root: Path
) -> Iterator[Server]:
    """A `sandhold serve` told never to suspend (suspend_after_s negative)."""
    yield from suspend_server(tmp_path_factory, workspace_root, "-1")


@contextlib.asynccontextmanager
async def opened(kind: str, server: Server | None = None, **local: Any
                 ) -> AsyncIterator[Provider]:  # fmt: skip
    """A started provider: ``local`` (a runtime of its own, with ``local`` settings) or ``e2b``
    against ``server``; the sandboxes it made (``p.made``) are killed at the end."""
    p: Provider
    data_dir = None
    if kind == "local":
        data_dir = scratch_dir("sandhold-compliance-")
        p = LocalProvider(Settings(data_dir=data_dir, lifecycle_interval_s=0.2, **local))
    else:
        assert server is not None
        p = E2bProvider(Settings(
            gateway_provider="e2b", gateway_e2b_api_url=server.url,
            gateway_e2b_sandbox_url=server.url, gateway_e2b_api_key=KEY_A,
        ))  # fmt: skip
    await p.start()
    made: list[str] = []
    p.made = made  # type: ignore[attr-defined]
    try:
        yield p
    finally:
        for sandbox_id in made:
            await p.kill(sandbox_id)
        await p.close()
        if data_dir is not None:
            assert not destroy_runtime_dir(data_dir)


@pytest.fixture(params=PROVIDERS)
async def provider(request: pytest.FixtureRequest, workspace_root: Path) -> AsyncIterator[Provider]:
    server = request.getfixturevalue("e2b_egress_server") if request.param == "e2b" else None
    async with opened(request.param, server) as p:
        yield p


def request_for(workspace_root: Path, **kw: object) -> CreateRequest:
    ws = workspace_root / f"compliance-{uuid.uuid4().hex[:8]}"
    ws.mkdir(mode=0o755)
    base = dict(template="base", timeout_s=60, metadata={"compliance": ws.name}, env={"X": "1"},
                workspace_dir=ws, memory_mb=256, cpu=1.0, pids=256, tenant="acme")  # fmt: skip
    base.update(kw)
    return CreateRequest(**base)  # type: ignore[arg-type]


async def create(p: Provider, req: CreateRequest) -> tuple[str, dict[str, object]]:
    sbx, handle = await p.create(req)
    p.made.append(sbx.id)  # type: ignore[attr-defined]
    assert sbx.state == "running" and sbx.metadata["compliance"] == req.metadata["compliance"]
    return sbx.id, handle


async def sh(p: Provider, sandbox_id: str, handle: dict[str, object], cmd: str) -> str:
    async with p.channel(sandbox_id, handle, ENVD_PORT) as ch:
        out = await EnvdClient(ch).sh(cmd, user="user", timeout_s=30)
    assert out.exit_code == 0, out
    return out.text


async def wait_state(p: Provider, sandbox_id: str, state: str, timeout: float = 30) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sbx = await p.get(sandbox_id)
        assert sbx is not None
        if sbx.state == state:
            assert sbx.end_at is not None
            return sbx.end_at
        await asyncio.sleep(0.1)
    raise AssertionError(f"sandbox {sandbox_id} never became {state}")


async def test_create_get_list_channel(provider: Provider, workspace_root: Path) -> None:
    req = request_for(workspace_root)
    sid, handle = await create(provider, req)
    got = await provider.get(sid)
    assert got is not None and got.id == sid and got.state == "running"
    assert got.end_at is not None and got.end_at > time.time()
    listed = await provider.list({"compliance": req.metadata["compliance"]})
    assert [s.id for s in listed] == [sid]
    assert await provider.list({"compliance": "nobody"}) == []
    assert (await sh(provider, sid, handle, "echo $X")).strip() == "1"


async def test_mount_workspace(provider: Provider, workspace_root: Path) -> None:
    assert provider.capabilities.mount_workspace  # both declare it: it must hold
    view = workspace_root / f"view-{uuid.uuid4().hex[:8]}"
    view.mkdir(mode=0o755)
    (view / "ref.txt").write_text("reference\n")
    req = request_for(workspace_root, views=[(view, "/reference/docs")])
    sid, handle = await create(provider, req)
    await sh(provider, sid, handle, "echo hi > /workspace/out.txt")
    assert req.workspace_dir is not None
    assert (req.workspace_dir / "out.txt").read_text() == "hi\n"
    out = await sh(
        provider,
        sid,
        handle,
        "cat /reference/docs/ref.txt; touch /reference/docs/x 2>/dev/null || echo ro",
    )
    assert out.split() == ["reference", "ro"]


async def test_per_sandbox_limits(provider: Provider, workspace_root: Path) -> None:
    """128 MiB asked for: 200 MiB of touched memory is killed where the provider takes the
    limit, and fits where it declares it does not (the server's default, 512 MiB)."""
    sid, handle = await create(provider, request_for(workspace_root, memory_mb=128))
    out = await sh(provider, sid, handle, "python3 -c 'b = b\"x\" * (200 << 20)'; echo rc=$?")
    expected = "rc=137" if provider.capabilities.per_sandbox_limits else "rc=0"
    assert out.strip() == expected


async def test_set_timeout_is_absolute(provider: Provider, workspace_root: Path) -> None:
    sid, _ = await create(provider, request_for(workspace_root))
    await provider.set_timeout(sid, 600)
    got = await provider.get(sid)
    assert got is not None and got.end_at is not None
    assert not provider.capabilities.idle_timeout
    assert abs(got.end_at - (time.time() + 600)) < 30
    await provider.set_timeout("doesnotexist0000000", 10)  # a gone sandbox is ignored


async def test_pause_keeps_memory_and_connect_resumes(
    provider: Provider, workspace_root: Path
) -> None:
    sid, handle = await create(provider, request_for(workspace_root))
    await sh(provider, sid, handle, "echo kept > /tmp/state; (sleep 600 &) ; echo ok")
    await provider.set_timeout(sid, 1)  # on_timeout=pause, as every provider creates them
    await wait_state(provider, sid, "paused")
    resumed, fresh = await provider.connect(sid, 60)
    assert resumed is True and isinstance(fresh, dict)
    assert (await provider.get(sid)).state == "running"  # type: ignore[union-attr]
    again, _ = await provider.connect(sid, 60)
    assert again is False  # already running: extended, not resumed
    out = await sh(provider, sid, {**handle, **fresh}, "cat /tmp/state; pgrep -c -f 'sleep 600'")
    assert provider.capabilities.pause_keeps_memory
    assert out.split() == ["kept", "1"]


async def test_auto_resume_on_traffic(provider: Provider, workspace_root: Path) -> None:
    assert provider.capabilities.auto_resume
    sid, handle = await create(provider, request_for(workspace_root))
    await provider.set_timeout(sid, 1)
    await wait_state(provider, sid, "paused")
    assert (await sh(provider, sid, handle, "echo woke")).strip() == "woke"
    assert (await provider.get(sid)).state == "running"  # type: ignore[union-attr]


async def test_kill_and_conditional_kill(provider: Provider, workspace_root: Path) -> None:
    assert provider.capabilities.conditional_delete
    sid, _ = await create(provider, request_for(workspace_root))
    await provider.set_timeout(sid, 1)
    end_at = await wait_state(provider, sid, "paused")
    with pytest.raises(PreconditionFailed):
        await provider.kill(sid, if_paused_end_at=end_at - 100)
    assert await provider.get(sid) is not None  # a refused conditional kill changes nothing
    assert await provider.kill(sid, if_paused_end_at=end_at) is True
    assert await provider.get(sid) is None
    assert await provider.kill(sid) is False
    with pytest.raises(SandboxGone):
        await provider.connect(sid, 60)


async def test_update_network(provider: Provider, workspace_root: Path) -> None:
    sid, _ = await create(provider, request_for(workspace_root))  # created without egress
    try:
        allow = EgressPolicy(mode="allowlist", allow=["example.test"])
        await provider.update_network(sid, "acme", allow)
    except NeedsNewSandbox:
        pass  # the contract: either it takes the change, or it says only a new sandbox can
    assert await provider.kill(sid) is True
    with pytest.raises(SandboxGone):
        await provider.update_network(sid, "acme", EgressPolicy())


async def test_channel_to_a_gone_sandbox(provider: Provider) -> None:
    with pytest.raises(SandboxGone):
        async with provider.channel("nosuchsandbox000000", {}, ENVD_PORT) as ch:
            await EnvdClient(ch).sh("true")


async def test_a_sandbox_whose_agent_died_is_gone_but_listed_until_killed(
    provider: Provider, workspace_root: Path, request: pytest.FixtureRequest
) -> None:
    """The runtime keeps a sandbox whose agent died (marked failed); a provider reports it as
    paused for good: every use is SandboxGone (so the gateway makes a new sandbox for the
    session), while the reclaimer still sees it and may kill it, conditionally too."""
    req = request_for(workspace_root)
    sid, handle = await create(provider, req)
    await sh(provider, sid, handle, "echo kept > /workspace/kept.txt")
    if isinstance(provider, LocalProvider):
        runtime = provider.runtime
    else:
        runtime = request.getfixturevalue("e2b_egress_server").runtime()
    os.kill(runtime.get(sid).init_pid, signal.SIGKILL)  # from the host: a bug, say
    end_at = await wait_state(provider, sid, "paused")
    listed = await provider.list({"compliance": req.metadata["compliance"]})
    assert [(s.state, s.failure is not None) for s in listed] == [("paused", True)]
    got = await provider.get(sid)
    assert got is not None and "signal 9" in (got.failure or ""), got
    with pytest.raises(SandboxGone):
        await provider.connect(sid, 60)
    with pytest.raises(SandboxGone):
        await sh(provider, sid, handle, "true")
    assert await provider.kill(sid, if_paused_end_at=end_at) is True
    assert await provider.get(sid) is None
    assert req.workspace_dir is not None
    assert (req.workspace_dir / "kept.txt").read_text() == "kept\n"


CRIU_USABLE, CRIU_DETAIL = criu_status(Settings().criu_path)
COUNTER = f"{BARE_COUNTER} >/dev/null 2>&1"


async def counter(p: Provider, sandbox_id: str, handle: dict[str, object]) -> tuple[int, str]:
    for _ in range(100):
        out = (await sh(p, sandbox_id, handle, "cat /tmp/state 2>/dev/null || true")).split()
        if out:
            return int(out[0]), out[1]
        await asyncio.sleep(0.02)
    raise AssertionError("the counter never wrote its state")


async def test_capabilities_say_what_is_built(
    provider: Provider, workspace_root: Path, request: pytest.FixtureRequest
) -> None:
    """Suspend to disk where CRIU is usable (the default suspend_after_s is 600 s). Neither
    provider forks or snapshots the gateway's sandboxes: the runtime refuses both for a sandbox
    with a host directory bound in, and every one has the session's workspace."""
    caps = provider.capabilities.public()
    assert caps["suspends_to_disk"] is CRIU_USABLE, CRIU_DETAIL
    assert caps["snapshots"] is False and caps["fork"] is False
    assert caps["pause_keeps_memory"] is True
    sid, _ = await create(provider, request_for(workspace_root))
    if isinstance(provider, LocalProvider):
        with pytest.raises(Unsupported, match="host directories bound in"):
            await forks.fork(provider.service, "gateway", sid, None, 1)
        with pytest.raises(Unsupported, match="host directories bound in"):
            await snapshots.take(provider.service, "gateway", sid, None, True)
    else:
        server: Server = request.getfixturevalue("e2b_egress_server")
        with server.api() as api:
            for path in ("fork", "snapshots"):
                r = api.post(f"/sandboxes/{sid}/{path}", json={})
                assert r.status_code == 400 and "host directories" in r.json()["message"], r.text


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_suspends_to_disk_where_declared(
    kind: str, request: pytest.FixtureRequest, workspace_root: Path
) -> None:
    """suspend_after_s = 0: an auto-paused sandbox leaves memory at once (no process of it
    left on the host, the provider says so) and connect restores it, its processes carrying on
    from their own memory."""
    server = request.getfixturevalue("e2b_suspend_server") if kind == "e2b" else None
    async with opened(kind, server, suspend_after_s=0) as p:
        assert p.capabilities.suspends_to_disk is CRIU_USABLE, CRIU_DETAIL
        if not CRIU_USABLE:
            pytest.skip(f"CRIU unusable here: {CRIU_DETAIL}")
        runtime = p.runtime if isinstance(p, LocalProvider) else server.runtime()  # type: ignore[union-attr]
        sid, handle = await create(p, request_for(workspace_root))
        await sh(p, sid, handle, f"({COUNTER} &) ; echo started")
        n0, secret = await counter(p, sid, handle)
        await p.set_timeout(sid, 1)  # on_timeout=pause; then suspended at once
        await wait_state(p, sid, "paused")
        deadline = time.monotonic() + 30
        while not (got := await p.get(sid)).suspended:  # type: ignore[union-attr]
            assert got.failure is None, f"failed instead of being suspended: {got.failure}"
            assert time.monotonic() < deadline, "never suspended"
            await asyncio.sleep(0.1)
        assert got.failure is None
        assert got.public()["suspended"] == "disk"
        assert runtime.get(sid).suspended == "disk" and runtime.cgroup(sid).pids() == []
        resumed, fresh = await p.connect(sid, 60)
        assert resumed is True
        assert not (await p.get(sid)).suspended  # type: ignore[union-attr]
        await asyncio.sleep(0.1)
        n1, secret1 = await counter(p, sid, {**handle, **fresh})
        assert secret1 == secret and n1 > n0  # the same process, from its own memory


@pytest.mark.parametrize(
    ("kind", "local"),
    [("local", {"suspend_after_s": -1}), ("local", {"criu_path": Path("/nonexistent/criu")}),
     ("e2b", {})],
    ids=["local-never", "local-no-criu", "e2b-never"],
)  # fmt: skip
async def test_no_suspend_to_disk_is_declared_where_there_is_none(
    kind: str, local: dict[str, object], request: pytest.FixtureRequest
) -> None:
    server = request.getfixturevalue("e2b_never_suspending_server") if kind == "e2b" else None
    async with opened(kind, server, **local) as p:
        assert p.capabilities.suspends_to_disk is False
