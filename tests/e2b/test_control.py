"""Control plane through the official SDK (sync and async) and, for what the SDK does not reach
(status codes, v1 forms, batch metrics), through plain httpx."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
    Volume,
)

from tests.support.e2b_server import KEY_B, Server


def listed(query: SandboxQuery, **kwargs: object) -> list[str]:
    paginator = Sandbox.list(query=query, **kwargs)  # type: ignore[arg-type]
    ids: list[str] = []
    while paginator.has_next:
        ids += [s.sandbox_id for s in paginator.next_items()]
    return ids


def test_create_info_kill(server: Server) -> None:
    metadata = {"who": "me", "odd": "a b&c=d/é"}
    s = Sandbox.create(timeout=120, metadata=metadata, envs={"GREET": "hi"})
    try:
        assert len(s.sandbox_id) == 20 and s.sandbox_id.isalnum()
        info = s.get_info()
        assert info.metadata == metadata
        assert info.template_id == "base" and info.state == SandboxState.RUNNING
        assert info.cpu_count >= 1 and info.memory_mb > 0
        assert info.lifecycle == {"on_timeout": "kill", "auto_resume": False}
        assert abs((info.end_at - info.started_at).total_seconds() - 120) < 5
        assert s.commands.run("echo $GREET").stdout == "hi\n"
        assert s.is_running()
    finally:
        assert s.kill() is True
    assert Sandbox.kill(s.sandbox_id) is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(s.sandbox_id)
    assert not s.is_running()


async def test_async_create_connect_kill(server: Server) -> None:
    s = await AsyncSandbox.create(timeout=60, metadata={"async": "yes"})
    try:
        again = await AsyncSandbox.connect(s.sandbox_id)
        assert (await again.commands.run("echo ok")).stdout == "ok\n"
        info = await AsyncSandbox.get_info(s.sandbox_id)
        assert info.metadata == {"async": "yes"}
        assert await again.is_running()
    finally:
        assert await s.kill() is True
    assert await AsyncSandbox.kill(s.sandbox_id) is False
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.connect(s.sandbox_id)


def test_connect_only_extends_a_running_sandbox(server: Server, api: httpx.Client) -> None:
    s = Sandbox.create(timeout=100)
    try:
        end = s.get_info().end_at
        r = api.post(f"/v2/sandboxes/{s.sandbox_id}/connect", json={"timeout": 10})
        assert r.status_code == 200 and r.json()["sandboxID"] == s.sandbox_id
        assert r.json()["envdAccessToken"]
        assert s.get_info().end_at == end  # never shortened by connect
        Sandbox.connect(s.sandbox_id, timeout=600)
        assert (s.get_info().end_at - end).total_seconds() > 400
        s.set_timeout(30)  # set_timeout may shorten
        assert (s.get_info().end_at - datetime.now(UTC)).total_seconds() < 31
    finally:
        s.kill()


def test_pause_and_resume_through_connect(server: Server, api: httpx.Client) -> None:
    s = Sandbox.create(timeout=120, metadata={"keep": "me"})
    try:
        s.files.write("/home/user/state.txt", "before pause")
        h = s.commands.run("sleep 600", background=True)
        assert s.pause() is True
        assert s.pause() is False  # 409 from the API: already paused
        info = s.get_info()
        assert info.state == SandboxState.PAUSED and info.metadata == {"keep": "me"}
        assert not s.is_running()  # no auto-resume: the data plane says "not found"
        assert s.sandbox_id in listed(SandboxQuery(state=[SandboxState.PAUSED]))
        assert s.sandbox_id not in listed(SandboxQuery(state=[SandboxState.RUNNING]))
        r = api.post(f"/v2/sandboxes/{s.sandbox_id}/connect", json={})
        assert r.status_code == 201  # resumed
        assert s.get_info().state == SandboxState.RUNNING
        assert s.get_info().metadata == {"keep": "me"}
        assert s.files.read("/home/user/state.txt") == "before pause"
        assert h.pid in [p.pid for p in s.commands.list()]  # processes survive the pause
        s.pause()
        back = Sandbox.connect(s.sandbox_id)  # the SDK's way to resume
        assert back.commands.run("cat state.txt").stdout == "before pause"
    finally:
        s.kill()


def test_list_filters_order_and_pages(server: Server) -> None:
    suite = uuid.uuid4().hex
    t0 = datetime.now(UTC) - timedelta(seconds=1)
    created = []
    for i in range(5):
        created.append(Sandbox.create(timeout=120, metadata={"suite": suite, "i": str(i),
                                                             "odd": "v w&x=y%z"}))  # fmt: skip
    try:
        ids = [s.sandbox_id for s in created]
        assert sorted(listed(SandboxQuery(metadata={"suite": suite}))) == sorted(ids)
        assert listed(SandboxQuery(metadata={"suite": suite, "i": "3"})) == [ids[3]]
        assert len(listed(SandboxQuery(metadata={"suite": suite, "odd": "v w&x=y%z"}))) == 5
        assert listed(SandboxQuery(metadata={"suite": suite, "odd": "v w"})) == []
        assert listed(SandboxQuery(metadata={"suite": suite}, template="nope")) == []
        assert len(listed(SandboxQuery(metadata={"suite": suite}, template="base"))) == 5
        after = datetime.now(UTC) + timedelta(hours=1)
        assert listed(SandboxQuery(metadata={"suite": suite}, started_after=after)) == []
        assert len(listed(SandboxQuery(metadata={"suite": suite}, started_after=t0))) == 5
        for s in created:  # a sandbox's own start time, as the server rendered it, finds it
            own = Sandbox.get_info(s.sandbox_id).started_at
            assert s.sandbox_id in listed(SandboxQuery(metadata={"suite": suite},
                                                       started_after=own))  # fmt: skip
        # Pages of two, newest first by default, oldest first with order="asc".
        pager = Sandbox.list(query=SandboxQuery(metadata={"suite": suite}), limit=2)
        pages = []
        while pager.has_next:
            pages.append([s.sandbox_id for s in pager.next_items()])
        assert [len(p) for p in pages] == [2, 2, 1]
        assert [i for p in pages for i in p] == ids[::-1]
        asc = listed(SandboxQuery(metadata={"suite": suite}), order="asc", limit=3)
        assert asc == ids
        created[1].pause()
        paused = listed(SandboxQuery(metadata={"suite": suite}, state=[SandboxState.PAUSED]))
        assert paused == [ids[1]]
        assert len(listed(SandboxQuery(metadata={"suite": suite}))) == 5  # both states by default
    finally:
        for s in created:
            s.kill()


async def test_async_list_pages(server: Server) -> None:
    suite = uuid.uuid4().hex
    sandboxes = await asyncio.gather(
        *(AsyncSandbox.create(timeout=60, metadata={"suite": suite}) for _ in range(3))
    )
    try:
        pager = AsyncSandbox.list(query=SandboxQuery(metadata={"suite": suite}), limit=2)
        seen = []
        while pager.has_next:
            seen += [s.sandbox_id for s in await pager.next_items()]
        assert sorted(seen) == sorted(s.sandbox_id for s in sandboxes)
    finally:
        await asyncio.gather(*(s.kill() for s in sandboxes))


def test_metrics(server: Server, api: httpx.Client) -> None:
    s = Sandbox.create(timeout=60)
    try:
        s.commands.run("python3 -c 'x = bytearray(64 << 20); print(len(x))'")
        metrics = s.get_metrics()
        assert metrics and metrics[-1].mem_total == 512 * 1024 * 1024
        assert metrics[-1].cpu_count >= 1 and metrics[-1].disk_total > 0
        assert 0 <= metrics[-1].cpu_used_pct <= 100
        r = api.get("/sandboxes/metrics", params={"sandbox_ids": f"{s.sandbox_id},nonexistent"})
        assert r.status_code == 200
        batch = r.json()["sandboxes"]
        assert list(batch) == [s.sandbox_id] and batch[s.sandbox_id]["memTotal"] > 0
        assert api.get("/sandboxes/metrics").status_code == 400
    finally:
        s.kill()


def test_v1_endpoints(server: Server, api: httpx.Client) -> None:
    r = api.post("/sandboxes", json={"templateID": "base", "timeout": 60, "secure": True,
                                     "metadata": {"v": "1"}})  # fmt: skip
    assert r.status_code == 201, r.text
    sid = r.json()["sandboxID"]
    try:
        assert sid in [s["sandboxID"] for s in api.get("/sandboxes").json()]
        assert api.post(f"/sandboxes/{sid}/refreshes", json={"duration": 120}).status_code == 204
        assert api.post(f"/sandboxes/{sid}/resume", json={"timeout": 60}).status_code == 409
        assert api.post(f"/sandboxes/{sid}/connect", json={}).status_code == 400  # timeout required
        assert api.post(f"/sandboxes/{sid}/pause").status_code == 204
        assert sid not in [s["sandboxID"] for s in api.get("/sandboxes").json()]  # running only
        r = api.post(f"/sandboxes/{sid}/resume", json={"timeout": 60})
        assert r.status_code == 201 and r.json()["envdAccessToken"]
        assert api.post(f"/sandboxes/{sid}/connect", json={"timeout": 30}).status_code == 200
    finally:
        assert api.delete(f"/sandboxes/{sid}").status_code == 204
    assert api.delete(f"/sandboxes/{sid}").status_code == 404


def test_volumes(server: Server, api: httpx.Client) -> None:
    name = f"vol-{uuid.uuid4().hex[:8]}"
    vol = Volume.create(name)
    assert vol.name == name and vol.token
    assert name in [v.name for v in Volume.list()]
    assert Volume.get_info(vol.volume_id).name == name
    assert api.post("/volumes", json={"name": name}).status_code == 409
    writer = Sandbox.create(timeout=60, volume_mounts={"/mnt/data": vol})
    reader = Sandbox.create(timeout=60, volume_mounts={"/mnt/data": name})
    try:
        writer.commands.run("echo shared > /mnt/data/f.txt")
        assert reader.files.read("/mnt/data/f.txt") == "shared\n"
        assert writer.get_info().volume_mounts == [{"name": name, "path": "/mnt/data"}]
        r = api.delete(f"/volumes/{vol.volume_id}")
        assert r.status_code == 409 and "mounted" in r.json()["message"]
    finally:
        writer.kill()
        reader.kill()
    again = Sandbox.create(timeout=60, volume_mounts={"/mnt/data": name})
    try:
        assert again.files.read("/mnt/data/f.txt") == "shared\n"  # outlives its sandboxes
    finally:
        again.kill()
    assert Volume.destroy(vol.volume_id) is True
    assert Volume.destroy(vol.volume_id) is False
    assert not (server.data_dir / "volumes" / name).exists()
    with pytest.raises(SandboxException, match="does not exist"):
        Sandbox.create(timeout=60, volume_mounts={"/mnt/data": name})


def test_idempotency_key(server: Server, api: httpx.Client) -> None:
    key = f"k-{uuid.uuid4().hex}"
    body = {"templateID": "base", "timeout": 60, "metadata": {"k": "1"}}
    first = api.post("/v2/sandboxes", json=body, headers={"Idempotency-Key": key})
    second = api.post("/v2/sandboxes", json=body, headers={"Idempotency-Key": key})
    try:
        assert first.status_code == second.status_code == 201
        assert first.json()["sandboxID"] == second.json()["sandboxID"]
        other = api.post("/v2/sandboxes", json={**body, "timeout": 61},
                         headers={"Idempotency-Key": key})  # fmt: skip
        assert other.status_code == 422
    finally:
        api.delete(f"/sandboxes/{first.json()['sandboxID']}")


def test_policy_refusals_name_the_option(server: Server) -> None:
    before = len(listed(SandboxQuery()))
    with pytest.raises(SandboxException, match="allow_internet_access"):
        Sandbox.create(allow_internet_access=True)
    with pytest.raises(SandboxException, match=r"network\.allowOut"):
        Sandbox.create(network={"allow_out": ["1.1.1.1"], "deny_out": ["0.0.0.0/0"]})
    with pytest.raises(SandboxException, match="Timeout cannot be greater than 24 hours"):
        Sandbox.create(timeout=25 * 3600)
    with pytest.raises(SandboxException, match="does not exist"):
        Sandbox.create(template="no-such-template")
    assert len(listed(SandboxQuery())) == before
    s = Sandbox.create(timeout=30, allow_internet_access=False,
                       network={"deny_out": ["0.0.0.0/0"]})  # fmt: skip
    try:
        assert s.get_info().allow_internet_access is False
    finally:
        s.kill()


def test_another_team_sees_nothing(server: Server) -> None:
    s = Sandbox.create(timeout=60, metadata={"owner": "a"})
    try:
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(s.sandbox_id, api_key=KEY_B)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(s.sandbox_id, api_key=KEY_B)
        assert Sandbox.kill(s.sandbox_id, api_key=KEY_B) is False
        with pytest.raises(SandboxNotFoundException):
            Sandbox.set_timeout(s.sandbox_id, 5, api_key=KEY_B)
        assert s.sandbox_id not in listed(SandboxQuery(), api_key=KEY_B)
        with httpx.Client(base_url=server.url, headers={"X-API-KEY": KEY_B}) as b:
            assert b.post(f"/sandboxes/{s.sandbox_id}/pause").status_code == 404
        assert s.get_info().state == SandboxState.RUNNING  # untouched
        assert s.get_info().end_at > datetime.now(UTC) + timedelta(seconds=30)
    finally:
        s.kill()


def test_start_time_is_recent(server: Server) -> None:
    t = time.time()
    s = Sandbox.create(timeout=30)
    try:
        assert abs(s.get_info().started_at.timestamp() - t) < 10
    finally:
        s.kill()


def test_templates_built_with_the_cli_are_usable(server: Server) -> None:
    name = f"tpl-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "SANDHOLD_DATA_DIR": str(server.data_dir)}
    build = subprocess.run([sys.executable, "-m", "sandhold.cli", "template", "build", name],
                           env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert build.returncode == 0, build.stderr
    s = Sandbox.create(template=name, timeout=30)  # no server restart needed
    try:
        assert s.get_info().template_id == name
        assert s.commands.run("echo from-template").stdout == "from-template\n"
        assert listed(SandboxQuery(template=name)) == [s.sandbox_id]
    finally:
        s.kill()
