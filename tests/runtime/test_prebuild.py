"""A background template build is a process group the server can stop: nothing it started
outlives it, and its staging directory goes with it."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

from sandhold.config import Settings
from sandhold.runtime.templates import prebuild
from sandhold.runtime.templates.store import TemplateStore


def group_members(pgid: int) -> list[int]:
    r = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True)
    return [int(x) for x in r.stdout.split()]


async def test_a_stopped_build_leaves_no_process_and_no_staging(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    store = TemplateStore(tmp_path / "templates", settings.uid_base)
    # A fresh store: building code-interpreter-v1 starts with a long `pip download`.
    proc = await prebuild.start(store.root, settings.uid_base, "code-interpreter-v1")
    deadline = time.monotonic() + 60
    while len(group_members(proc.pid)) < 2 and proc.returncode is None:  # its pip has started
        assert time.monotonic() < deadline, "the build never started a child"
        await asyncio.sleep(0.1)
    assert proc.returncode is None, "the build ended before it could be stopped"
    await prebuild.stop(proc)
    assert proc.returncode is not None
    await asyncio.sleep(0.2)  # the group's last members are reaped by init
    assert group_members(proc.pid) == []
    leftovers = [p.name for p in store.root.iterdir() if p.name.startswith(".build-")]
    assert leftovers == []
    assert not (store.root / "code-interpreter-v1" / "template.json").exists()
