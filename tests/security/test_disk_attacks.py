"""Disk attacks from inside real sandboxes: filling the writable layer, /tmp, /dev/shm, the agent's
run dir and the inode table. Each must fail inside with ENOSPC while the host and a neighbour go
on as before; ``df`` inside tells the budget; E2B's ``diskSizeMB`` is that budget; kill leaves
no loop device, mount or image behind."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from sandhold.config import Settings
from sandhold.errors import InvalidRequest
from sandhold.runtime import cgroups, mounts
from sandhold.runtime.runtime import Runtime
from tests.runtime.helpers import sh
from tests.support.e2b_server import KEY_A, new_server

MIB = 1 << 20
ENOSPC = "No space left on device"


def loop_backings(under: Path) -> list[str]:
    """Loop devices whose backing file lies under ``under``, from sysfs (what losetup reads)."""
    out = []
    for dev in Path("/sys/block").glob("loop*"):
        try:
            backing = (dev / "loop" / "backing_file").read_text().strip()
        except FileNotFoundError:
            continue  # not attached
        if backing.startswith(str(under)):
            out.append(f"{dev.name}: {backing}")
    return out


def image_bytes(runtime: Runtime, sandbox_id: str) -> int:
    """What the sandbox's writable layer costs the host's filesystem now."""
    return os.stat(runtime.sandboxes_dir / sandbox_id / "disk.img").st_blocks * 512


async def test_filling_the_writable_layer_fails_inside_and_costs_the_host_at_most_the_budget(
    make_sandbox, runtime
):
    victim = await make_sandbox(limits={"disk_mb": 16})
    neighbour = await make_sandbox(limits={"disk_mb": 16})
    free_before = shutil.disk_usage(runtime.settings.data_dir).free
    r = await sh(victim, "dd if=/dev/zero of=/home/user/fill bs=1M count=128 2>&1; echo rc=$?")
    assert ENOSPC in r.text and "rc=0" not in r.text, r.text
    # Nor can root, anywhere in its root filesystem.
    r = await sh(victim, "dd if=/dev/zero of=/var/fill bs=1M count=64 2>&1; echo rc=$?", "root")
    assert ENOSPC in r.text and "rc=0" not in r.text, r.text
    assert image_bytes(runtime, victim.id) <= 16 * MIB
    # The host lost at most the budget (other tests may write meanwhile: some slack).
    assert free_before - shutil.disk_usage(runtime.settings.data_dir).free < 16 * MIB + 32 * MIB
    # The victim still works (deleting frees its space), the neighbour never noticed.
    # (each removes its own: the sandbox's root holds no capability over the user's files; root's
    # dd may have found no room for even its file)
    await sh(victim, "rm /home/user/fill")
    await sh(victim, "rm -f /var/fill", "root")
    r = await sh(victim, "echo hi > /home/user/x && cat /home/user/x")
    assert r.text.strip() == "hi", r
    r = await sh(neighbour, "dd if=/dev/zero of=/home/user/f bs=1M count=8 2>&1; echo rc=$?")
    assert "rc=0" in r.text, r.text
    assert runtime.usage(neighbour.id).disk_bytes >= 8 * MIB


async def test_df_inside_shows_the_budget(make_sandbox, runtime):
    info = await make_sandbox(limits={"disk_mb": 24, "memory_mb": 128})
    r = await sh(info, "df -B1 --output=size / /home/user /tmp /dev/shm | tail -n +2")
    assert [int(x) for x in r.text.split()] == [24 * MIB, 24 * MIB, 64 * MIB, 32 * MIB]
    usage = runtime.usage(info.id)
    assert usage.disk_limit_bytes == 24 * MIB and 0 < usage.disk_bytes < 24 * MIB


async def test_tmp_and_shm_past_their_size_fail_without_an_oom_kill(make_sandbox, runtime):
    info = await make_sandbox(limits={"memory_mb": 128})
    for path, size in (("/tmp", 64), ("/dev/shm", 32)):
        r = await sh(
            info, f"dd if=/dev/zero of={path}/fill bs=1M count={size + 16} 2>&1; echo rc=$?"
        )
        assert ENOSPC in r.text and "rc=0" not in r.text, r.text
    assert runtime.usage(info.id).oom_kills == 0
    assert (await sh(info, "echo alive")).text.strip() == "alive"


async def test_the_inode_table_is_bounded_too(make_sandbox):
    info = await make_sandbox(limits={"disk_mb": 16})  # 16 KiB per inode: 1024 of them
    code = "import os\nfor i in range(100000): open(f'/home/user/f{i}', 'w').close()"
    r = await sh(info, f'python3 -c "{code}" 2>&1; echo rc=$?')
    assert ENOSPC in r.text and "rc=0" not in r.text, r.text[-500:]
    r = await sh(info, "df --output=itotal / | tail -1")
    assert int(r.text) == 1024


async def test_kill_releases_every_image_loop_device_and_mount(runtime):
    base_loops = set(loop_backings(runtime.sandboxes_dir))
    for _ in range(12):
        info = runtime.create({"limits": {"disk_mb": 8}})
        assert len(loop_backings(runtime.sandboxes_dir / info.id)) == 1
        runtime.kill(info.id)
        assert not (runtime.sandboxes_dir / info.id).exists()
        assert not mounts.mounts_under(runtime.sandboxes_dir / info.id)
        assert not loop_backings(runtime.sandboxes_dir / info.id)
    assert set(loop_backings(runtime.sandboxes_dir)) <= base_loops


@pytest.fixture(scope="module")
def budget_runtime() -> Iterator[Runtime]:
    data = Path(tempfile.mkdtemp(prefix="sandhold-disk-", dir="/var/tmp"))
    settings = Settings(data_dir=data, default_disk_mb=12, max_disk_mb=32)
    rt = Runtime(settings).open()
    yield rt
    for info in rt.list():
        rt.kill(info.id)
    cgroups.remove_parent(rt.host.cgroup_group)
    shutil.rmtree(data, ignore_errors=True)


def test_budget_sources_default_template_override_and_maximum(budget_runtime):
    rt = budget_runtime
    assert rt.create({}).spec.limits.disk_mb == 12
    assert rt.create({"limits": {"disk_mb": 20}}).spec.limits.disk_mb == 20
    # A template's default (template.json's disk_mb) comes between the two.
    big = rt.templates.get("base").to_json() | {"name": "big", "disk_mb": 28}
    (rt.templates.root / "big").mkdir()
    (rt.templates.root / "big" / "template.json").write_text(json.dumps(big))
    assert rt.create({"template": "big"}).spec.limits.disk_mb == 28
    assert rt.create({"template": "big", "limits": {"disk_mb": 9}}).spec.limits.disk_mb == 9
    before = set(os.listdir(rt.sandboxes_dir))
    with pytest.raises(InvalidRequest, match="max_disk_mb=32"):
        rt.create({"limits": {"disk_mb": 64}})
    assert set(os.listdir(rt.sandboxes_dir)) == before  # nothing was made
    for info in rt.list():
        rt.kill(info.id)
    assert not loop_backings(rt.sandboxes_dir)


def test_e2b_disk_size_is_the_budget(tmp_path: Path) -> None:
    srv = new_server(tmp_path, default_disk_mb="20")
    srv.start()
    try:
        sbx = Sandbox.create(api_url=srv.url, sandbox_url=srv.url, api_key=KEY_A)
        with srv.api() as api:
            listed = {s["sandboxID"]: s for s in api.get("/v2/sandboxes").json()}
            detail = api.get(f"/sandboxes/{sbx.sandbox_id}").json()
        assert listed[sbx.sandbox_id]["diskSizeMB"] == 20 and detail["diskSizeMB"] == 20
        metrics = sbx.get_metrics()
        assert metrics and metrics[-1].disk_total == 20 * MIB
        assert sbx.commands.run("df -B1 --output=size / | tail -1").stdout.strip() == str(20 * MIB)
        sbx.kill()
    finally:
        srv.destroy()
