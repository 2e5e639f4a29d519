"""Deterministic cleanup: many create/kill cycles leave no process, mount, cgroup, netns or file."""

from __future__ import annotations

import os
from pathlib import Path

from sandhold.runtime import cgroups, mounts
from tests.runtime.helpers import sh

CYCLES = 200


def _sandbox_processes(runtime, group: str) -> dict[int, str]:
    """Processes running as a sandbox uid (of any range), except those of *other* runtimes
    (parallel test workers use their own cgroup parent), mapped to their network namespace."""
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if not runtime.uids.canonical <= p.stat().st_uid < runtime.uids.end:
                continue
            cgroup = (p / "cgroup").read_text()
            if "/sandhold" in cgroup and f"/{group}/" not in cgroup:
                continue
            out[int(p.name)] = os.readlink(p / "ns/net")
        except OSError:
            pass
    return out


async def test_create_kill_cycles_leave_nothing_behind(runtime):
    group = runtime.host.cgroup_group
    before = {
        "sandboxes": sorted(os.listdir(runtime.sandboxes_dir)),
        "cgroups": cgroups.list_names(group),
        "mounts": mounts.mounts_under(runtime.settings.data_dir),
        "processes": _sandbox_processes(runtime, group),
        "fds": len(os.listdir("/proc/self/fd")),
        "uid_ranges": runtime.uids.held(),
        "userns": len(runtime.uids.userns._fds),
    }
    for i in range(CYCLES):
        info = runtime.create({"workspace_id": "cycles"})
        if i % 50 == 0:
            assert (await sh(info, "echo $((6*7))")).text.strip() == "42"
        runtime.kill(info.id)
    assert sorted(os.listdir(runtime.sandboxes_dir)) == before["sandboxes"]
    assert cgroups.list_names(group) == before["cgroups"]
    assert mounts.mounts_under(runtime.settings.data_dir) == before["mounts"]
    assert runtime.uids.held() == before["uid_ranges"]
    after = _sandbox_processes(runtime, group)
    assert set(after) <= set(before["processes"]), "processes outlived their sandbox"
    assert set(after.values()) <= set(before["processes"].values()), "a netns outlived its sandbox"
    # (the user namespaces cached for the ranges used are bounded descriptors, not leaks)
    cached = len(runtime.uids.userns._fds) - before["userns"]
    assert len(os.listdir("/proc/self/fd")) <= before["fds"] + 2 + cached
