"""Sandboxes booted ahead (``pool_sizes``, runtime/pool.py) through the official SDK against a
real `sandhold serve`: a create takes a pooled sandbox, which is indistinguishable from a booted
one (env, identity, processes, files, boot id, random state), the pool refills, creates it
cannot serve boot, and the pool drains when the server stops."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, Volume

from sandhold.config import Settings
from sandhold.runtime.pool import POOL_KEY
from sandhold.runtime.runtime import Runtime
from tests.support.e2b_server import KEY_A, KEY_B, Server, new_server

POOL = 2
# What a sandbox's own view of itself shows; pooled and booted sandboxes must match in shape.
PROBE = (
    "echo env; env | grep -v -e ^E2B_SANDBOX_ID= -e ^HOSTNAME= | sort; echo ps; "
    # (every process but this shell and its children: the pipeline's own are there or not,
    # named bash or already ps or sort, as the scheduler goes)
    "ps -eo pid=,ppid=,user=,comm= | awk -v me=$$ '$1 != me && $2 != me {print $3, $4}' | sort; "
    "echo files; ls -A /tmp /home/user; echo whoami; whoami; pwd"
)


def ready(srv: Server) -> int:
    text = httpx.get(f"{srv.url}/metrics", headers={"X-API-KEY": KEY_A}).text
    return int(re.search(r'sandhold_pool_ready\{template="base"\} (\d+)', text).group(1))  # type: ignore[union-attr]


def counter(srv: Server, name: str) -> int:
    text = httpx.get(f"{srv.url}/metrics", headers={"X-API-KEY": KEY_A}).text
    return int(re.search(rf"^sandhold_pool_{name}_total (\d+)$", text, re.M).group(1))  # type: ignore[union-attr]


def wait_for(cond, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def pooled_on_disk(data_dir: Path) -> list[str]:
    return [i.id for i in Runtime(Settings(data_dir=data_dir)).list() if POOL_KEY in i.extra]


@pytest.fixture(scope="module")
def pool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = new_server(tmp_path_factory.mktemp("pool"), pool_sizes=f'{{"base": {POOL}}}')
    srv.start()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("E2B_API_URL", srv.url)
        mp.setenv("E2B_SANDBOX_URL", srv.url)
        mp.setenv("E2B_API_KEY", KEY_A)
        yield srv
    srv.destroy()


def started_from(srv: Server, sandbox_id: str) -> str | None:
    return srv.runtime().get(sandbox_id).started_from


def test_a_pooled_sandbox_is_a_fresh_one(pool_server: Server) -> None:
    wait_for(lambda: ready(pool_server) == POOL)
    hits = counter(pool_server, "hits")
    # Team A's sandbox leaves a file and a process; team B's next pooled sandbox has neither.
    a = Sandbox.create(envs={"MINE": "a"}, metadata={"who": "a"})
    assert started_from(pool_server, a.sandbox_id) == "pool"
    a.files.write("/tmp/left-by-a", "secret of a")
    a.commands.run("sleep 600", background=True)
    a.kill()
    b = Sandbox.create(envs={"MINE": "b"}, api_key=KEY_B)
    assert started_from(pool_server, b.sandbox_id) == "pool"
    assert counter(pool_server, "hits") == hits + 2
    try:
        assert not b.files.exists("/tmp/left-by-a")
        assert b.commands.run("echo $MINE").stdout == "b\n"
        assert b.get_info().metadata == {}
        wait_for(lambda: ready(pool_server) == POOL)  # refilled behind the two creates
        # A booted sandbox (the pool drained: taken faster than it refills) with the same
        # request looks the same.
        taken: list[Sandbox] = []
        cold = Sandbox.create(envs={"MINE": "b"}, api_key=KEY_B)
        while started_from(pool_server, cold.sandbox_id) == "pool":
            assert len(taken) < 4 * POOL, "the pool never ran dry"
            taken.append(cold)
            cold = Sandbox.create(envs={"MINE": "b"}, api_key=KEY_B)
        assert started_from(pool_server, cold.sandbox_id) is None
        assert counter(pool_server, "misses") >= 1
        try:
            assert b.commands.run(PROBE).stdout == cold.commands.run(PROBE).stdout
            ids = [s.commands.run("cat /proc/sys/kernel/random/boot_id; echo $E2B_SANDBOX_ID; "
                                  "python3 -c 'import random; print(random.random())'").stdout
                   for s in (b, cold, *taken)]  # fmt: skip
            for lines in zip(*(i.splitlines() for i in ids), strict=True):
                assert len(set(lines)) == len(lines), lines  # boot id, identity, random state
        finally:
            for s in (cold, *taken):
                s.kill()
    finally:
        b.kill()


def test_creates_the_pool_cannot_serve_boot(pool_server: Server) -> None:
    wait_for(lambda: ready(pool_server) == POOL)
    vol = Volume.create("pool-test-volume")
    try:
        sbx = Sandbox.create(volume_mounts={"/data": vol})  # host directories: bound at boot
        try:
            assert started_from(pool_server, sbx.sandbox_id) is None
            assert sbx.commands.run("touch /data/x && echo ok").stdout == "ok\n"
        finally:
            sbx.kill()
    finally:
        Volume.destroy(vol.volume_id)
    assert ready(pool_server) == POOL


def test_the_pool_drains_when_the_server_stops(tmp_path: Path) -> None:
    srv = new_server(tmp_path, pool_sizes='{"base": 2}')
    srv.start()
    try:
        wait_for(lambda: ready(srv) == 2)
        srv.stop()  # SIGTERM: a clean stop kills the pool
        assert pooled_on_disk(srv.data_dir) == []
        srv.start()
        wait_for(lambda: ready(srv) == 2)
        srv.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        srv.proc.wait()  # type: ignore[union-attr]
        srv.proc = None
        assert len(pooled_on_disk(srv.data_dir)) == 2  # left by a server that died
        srv.settings["pool_sizes"] = "{}"
        srv.start()  # the next server kills them, though it keeps no pool itself
        wait_for(lambda: pooled_on_disk(srv.data_dir) == [])
    finally:
        srv.destroy()
