"""Limits hold: a memory bomb, a fork bomb and a busy loop stay inside their sandbox."""

from __future__ import annotations

import asyncio
import time

from sandhold.runtime import cgroups
from tests.runtime.helpers import sh


async def test_memory_bomb_is_killed_reported_and_contained(make_sandbox, runtime):
    bomb = await make_sandbox(limits={"memory_mb": 128})
    neighbour = await make_sandbox()
    r = await sh(bomb, "python3 -c 'x = []\nwhile True: x.append(bytearray(10 << 20))'; echo rc=$?")
    assert "rc=137" in r.text  # SIGKILL by the OOM killer
    usage = runtime.usage(bomb.id)
    assert usage.oom_kills >= 1
    assert usage.memory_limit_bytes == 128 << 20
    # The sandbox's agent survived (user processes are the OOM killer's first choice)...
    assert (await sh(bomb, "echo still here")).text.strip() == "still here"
    # ...and the neighbour never noticed.
    assert (await sh(neighbour, "echo fine")).text.strip() == "fine"
    assert runtime.usage(neighbour.id).oom_kills == 0


async def test_fork_bomb_is_contained(make_sandbox, runtime):
    bomb = await make_sandbox(limits={"pids": 64})
    neighbour = await make_sandbox()
    await sh(bomb, "(b(){ b|b& }; b) >/dev/null 2>&1 & sleep 1; echo launched", timeout=30)
    cg = cgroups.group(bomb.id, runtime.host.cgroup_group)
    assert cg.usage()["pids"] <= 64
    r = await sh(neighbour, "for i in $(seq 20); do /bin/true & done; wait; echo ok")
    assert r.text.strip() == "ok"
    runtime.kill(bomb.id)  # and it can still be torn down completely
    assert not cg.exists()


async def test_cpu_quota_holds_and_neighbour_keeps_running(make_sandbox, runtime):
    hog = await make_sandbox(limits={"cpu": 0.2})
    neighbour = await make_sandbox()
    await sh(hog, "for i in 1 2; do (while :; do :; done) & done; echo spinning")
    cg = cgroups.group(hog.id, runtime.host.cgroup_group)
    cpu0, t0 = cg.usage()["cpu_ns"], time.monotonic()
    await asyncio.sleep(1.5)
    used = (cg.usage()["cpu_ns"] - cpu0) / 1e9
    wall = time.monotonic() - t0
    # Two spinning processes would use 2 cores; the quota allows 0.2 (measured as a share).
    assert used / wall < 0.5, f"{used:.2f} s of CPU in {wall:.2f} s"
    r = await sh(neighbour, "python3 -c 'print(sum(range(10**6)))'")
    assert r.text.strip() == str(sum(range(10**6)))
