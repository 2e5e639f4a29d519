"""A workspace's disk budget, from inside real sandboxes: writing past it fails with ENOSPC inside
and nothing outside notices, ``df /workspace`` shows it, its files outlive the sandbox, two
sandboxes never mount it at once (on this host or from another data dir sharing it), kill and
reconcile leave no loop device or mount, files already there are moved in (or refused, with
nothing changed), a larger budget grows it and a smaller one does not shrink it, and an image
that Sandhold did not make is never mounted."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandhold.config import Settings
from sandhold.errors import Conflict, InvalidRequest, QuotaExceeded
from sandhold.runtime import cgroups, mounts, wsdisk
from sandhold.runtime.runtime import Runtime
from sandhold.service.metadata import WORKSPACE_DISK_KEY
from tests.runtime.helpers import sh
from tests.security.test_disk_attacks import ENOSPC, MIB, loop_backings

IMAGE = wsdisk.IMAGE


def image_of(runtime: Runtime, workspace: str) -> Path:
    return runtime.workspace_path(workspace) / IMAGE


def locked(image: Path) -> bool:
    """Whether someone (a loop device) holds the image's lock."""
    import fcntl

    fd = os.open(image, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def sandbox_dirs(runtime: Runtime) -> set[str]:
    return set(os.listdir(runtime.sandboxes_dir))


async def test_writing_past_the_budget_fails_inside_and_df_shows_it(make_sandbox, runtime):
    victim = await make_sandbox(workspace_id="wsd-fill", workspace_disk_mb=64)
    neighbour = await make_sandbox(workspace_id="wsd-neighbour")  # no budget: as before
    assert victim.spec.workspace_disk_mb == 64  # recorded as enforced
    free_before = shutil.disk_usage(runtime.settings.data_dir).free
    r = await sh(victim, "df -B1 --output=size /workspace | tail -1")
    assert int(r.text) == 64 * MIB
    r = await sh(victim, "dd if=/dev/zero of=/workspace/fill bs=1M count=128 2>&1; echo rc=$?")
    assert ENOSPC in r.text and "rc=0" not in r.text, r.text
    image = image_of(runtime, "wsd-fill")
    assert os.stat(image).st_blocks * 512 <= 64 * MIB  # the host paid at most the budget
    assert free_before - shutil.disk_usage(runtime.settings.data_dir).free < 64 * MIB + 32 * MIB
    # Its own layer and the sandbox go on working; the neighbour never noticed.
    r = await sh(victim, "echo alive > /home/user/x && cat /home/user/x; rm /workspace/fill")
    assert r.text.strip() == "alive"
    r = await sh(neighbour, "dd if=/dev/zero of=/workspace/f bs=1M count=80 2>&1; echo rc=$?")
    assert "rc=0" in r.text, r.text
    # The workspace directory holds only the image; the files are in it.
    assert os.listdir(runtime.workspace_path("wsd-fill")) == [IMAGE]
    r = await sh(victim, "stat -c '%U %a' /workspace; mount | grep ' /workspace '")
    assert r.text.startswith("user 755"), r.text


async def test_its_files_persist_to_the_next_sandbox_and_kill_leaves_nothing(make_sandbox, runtime):
    first = await make_sandbox(workspace_id="wsd-persist", workspace_disk_mb=32)
    await sh(first, "mkdir -p /workspace/a && echo kept > /workspace/a/notes")
    image = image_of(runtime, "wsd-persist")
    assert len(loop_backings(image)) == 1 and locked(image)
    runtime.kill(first.id)
    assert not loop_backings(image) and not locked(image)
    assert not mounts.mounts_under(runtime.sandboxes_dir / first.id)
    second = await make_sandbox(workspace_id="wsd-persist", workspace_disk_mb=32)
    r = await sh(second, "cat /workspace/a/notes; stat -c %U /workspace/a/notes")
    assert r.text.split() == ["kept", "user"]
    # Without a budget asked, the image (where the files live) is still what is bound.
    runtime.kill(second.id)
    third = await make_sandbox(workspace_id="wsd-persist")
    assert third.spec.workspace_disk_mb == 32
    r = await sh(third, "cat /workspace/a/notes; df -B1 --output=size /workspace | tail -1")
    assert r.text.split() == ["kept", str(32 * MIB)]


@pytest.fixture
def other_host(runtime: Runtime) -> Iterator[Runtime]:
    """A runtime on a data dir of its own: another host sharing a workspace root (NFS)."""
    d = Path(tempfile.mkdtemp(prefix="sandhold-otherhost-", dir="/var/tmp"))
    d.chmod(0o755)
    rt = Runtime(Settings(data_dir=d)).open()
    yield rt
    for info in rt.list():
        rt.kill(info.id)
    cgroups.remove_parent(rt.host.cgroup_group)
    shutil.rmtree(d, ignore_errors=True)


async def test_a_second_mount_of_the_workspace_is_refused(make_sandbox, runtime, other_host):
    holder = await make_sandbox(workspace_id="wsd-once", workspace_disk_mb=16)
    workspace = runtime.workspace_path("wsd-once")
    before = sandbox_dirs(runtime)
    with pytest.raises(Conflict, match=f"workspace {workspace} is in use"):
        runtime.create({"workspace_id": "wsd-once", "workspace_disk_mb": 16})
    with pytest.raises(Conflict, match="in use"):  # without a budget asked too
        runtime.create({"workspace_id": "wsd-once"})
    with pytest.raises(Conflict, match="in use"):  # "another host" sharing the directory
        other_host.create({"workspace_dir": str(workspace), "workspace_disk_mb": 16})
    assert sandbox_dirs(runtime) == before and not os.listdir(other_host.sandboxes_dir)
    assert len(loop_backings(image_of(runtime, "wsd-once"))) == 1
    # A paused sandbox keeps it; the holder's files are untouched by the refusals.
    await sh(holder, "echo mine > /workspace/f")
    runtime.pause(holder.id)
    with pytest.raises(Conflict):
        other_host.create({"workspace_dir": str(workspace)})
    runtime.resume(holder.id)
    assert (await sh(holder, "cat /workspace/f")).text.strip() == "mine"
    runtime.kill(holder.id)
    there = other_host.create({"workspace_dir": str(workspace), "workspace_disk_mb": 16})
    assert (await sh(there, "cat /workspace/f")).text.strip() == "mine"
    other_host.kill(there.id)
    assert not loop_backings(image_of(runtime, "wsd-once"))


async def test_files_already_there_are_moved_in_with_owners_modes_and_links(make_sandbox, runtime):
    ws = runtime.workspace_path("wsd-move")
    plain = await make_sandbox(workspace_id="wsd-move")  # the workspace before its budget
    await sh(
        plain,
        "cd /workspace && mkdir -p d/e && echo x > d/e/f && chmod 640 d/e/f && "
        "ln d/e/f hard && ln -s d/e/f link && mkfifo fifo && touch -d 2001-02-03 old && "
        "dd if=/dev/urandom of=d/rand bs=1M count=3 2>/dev/null && sha256sum d/rand > sum",
    )
    runtime.kill(plain.id)
    base = runtime.settings.uid_base
    (ws / "rootfile").write_text("r")  # a file of sandbox root's (canonical owner)
    os.chown(ws / "rootfile", base, base)
    listing = sorted(os.listdir(ws))
    moved = await make_sandbox(workspace_id="wsd-move", workspace_disk_mb=16)
    assert os.listdir(ws) == [IMAGE]  # the originals are gone, the image holds them
    r = await sh(
        moved,
        "cd /workspace && ls -A | sort && stat -c '%n %U %a %h %F' d/e/f hard "
        "link fifo rootfile && readlink link && date -r old +%F && sha256sum -c sum",
    )
    lines = r.text.split("\n")
    assert lines[: len(listing)] == listing, r.text
    assert "d/e/f user 640 2 regular file" in r.text and "hard user 640 2 regular file" in r.text
    assert "link user 777 1 symbolic link" in r.text and "fifo user 644 1 fifo" in r.text
    assert "rootfile root 644 1 regular file" in r.text
    assert "d/e/f\n2001-02-03\nd/rand: OK" in r.text, r.text


async def test_files_that_do_not_fit_are_refused_and_nothing_changes(make_sandbox, runtime):
    ws = runtime.workspace_path("wsd-big")
    plain = await make_sandbox(workspace_id="wsd-big")
    await sh(
        plain,
        "dd if=/dev/urandom of=/workspace/big bs=1M count=20 2>/dev/null; "
        "echo small > /workspace/small",
    )
    runtime.kill(plain.id)
    listing = {n: os.stat(ws / n).st_size for n in os.listdir(ws)}
    before = sandbox_dirs(runtime)
    with pytest.raises(QuotaExceeded, match="do not fit its disk budget of 16 MiB"):
        runtime.create({"workspace_id": "wsd-big", "workspace_disk_mb": 16})
    assert {n: os.stat(ws / n).st_size for n in os.listdir(ws)} == listing  # no image either
    assert sandbox_dirs(runtime) == before and not loop_backings(ws)
    # Still usable as it was, and with a budget it fits in.
    again = await make_sandbox(workspace_id="wsd-big", workspace_disk_mb=64)
    assert (await sh(again, "cat /workspace/small")).text.strip() == "small"


async def test_a_larger_budget_grows_the_image_a_smaller_one_is_not_applied(
    make_sandbox, runtime, caplog
):
    first = await make_sandbox(workspace_id="wsd-grow", workspace_disk_mb=16)
    await sh(
        first,
        "dd if=/dev/urandom of=/workspace/r bs=1M count=8 2>/dev/null; "
        "sha256sum /workspace/r > /workspace/sum",
    )
    runtime.kill(first.id)
    grown = await make_sandbox(workspace_id="wsd-grow", workspace_disk_mb=48)
    assert grown.spec.workspace_disk_mb == 48
    r = await sh(
        grown,
        "df -B1 --output=size /workspace | tail -1; sha256sum -c /workspace/sum; "
        "dd if=/dev/zero of=/workspace/more bs=1M count=24 2>&1; echo rc=$?",
    )
    assert r.text.split()[0] == str(48 * MIB) and "/workspace/r: OK" in r.text, r.text
    assert "rc=0" in r.text, r.text  # 32 MiB of files: past the old budget, within the new
    df = await sh(grown, "df --output=itotal /workspace | tail -1")
    assert int(df.text) == 48 * MIB // (16 << 10)  # inodes grew with it: one per 16 KiB
    runtime.kill(grown.id)
    with caplog.at_level(logging.WARNING, logger="sandhold.runtime.wsdisk"):
        kept = await make_sandbox(workspace_id="wsd-grow", workspace_disk_mb=16)
    assert kept.spec.workspace_disk_mb == 48
    assert "images never shrink" in caplog.text
    r = await sh(kept, "df -B1 --output=size /workspace | tail -1; ls /workspace")
    assert r.text.split() == [str(48 * MIB), "more", "r", "sum"]


async def test_an_image_the_sandbox_made_is_never_mounted(make_sandbox, runtime):
    """A sandbox with the workspace bound (no budget) plants a crafted filesystem image under
    the image's name: host root must not mount it (a kernel parser of sandbox-made bytes)."""
    plain = await make_sandbox(workspace_id="wsd-plant")
    await sh(
        plain,
        f"cd /workspace && truncate -s 16M {IMAGE} && /usr/sbin/mkfs.ext4 -q -F "
        f"{IMAGE} && ln -s /etc/shadow {IMAGE}.new",
    )
    runtime.kill(plain.id)
    ws = runtime.workspace_path("wsd-plant")
    before = sandbox_dirs(runtime)
    for budget in (16, None):
        with pytest.raises(InvalidRequest, match=f"holds a {IMAGE} that Sandhold did not make"):
            runtime.create({"workspace_id": "wsd-plant", "workspace_disk_mb": budget})
    os.unlink(ws / IMAGE)  # only the symlink at the temporary name is left
    with pytest.raises(InvalidRequest, match=f"holds a {IMAGE}.new that Sandhold did not"):
        runtime.create({"workspace_id": "wsd-plant", "workspace_disk_mb": 16})
    assert sandbox_dirs(runtime) == before and not loop_backings(ws)
    assert os.path.islink(ws / f"{IMAGE}.new")


def test_budgets_the_host_cannot_give_are_refused(runtime, tmp_path):
    before = sandbox_dirs(runtime)
    top = runtime.settings.max_disk_mb
    with pytest.raises(InvalidRequest, match=f"max_disk_mb={top}"):
        runtime.create({"workspace_id": "wsd-max", "workspace_disk_mb": top + 1})
    with pytest.raises(InvalidRequest, match="workspace_disk_mb needs a workspace"):
        runtime.create({"workspace_disk_mb": 16})
    off = Runtime(Settings(data_dir=tmp_path, disk_enforced=False))
    with pytest.raises(InvalidRequest, match="disk_enforced=false"):
        off.create({"workspace_id": "wsd-off", "workspace_disk_mb": 16})
    assert sandbox_dirs(runtime) == before
    assert not runtime.workspace_path("wsd-max").exists()


# One create in a process of its own, SIGKILLed somewhere in it; reconcile cleans up.
CREATOR = """
import os, sys
from sandhold.config import Settings
from sandhold.runtime.runtime import Runtime
from sandhold.service.metadata import WORKSPACE_DISK_KEY
rt = Runtime(Settings(data_dir=os.environ["CRASH_DATA_DIR"]))  # not opened: no reconcile
sys.stdout.write("go\\n")
sys.stdout.flush()
rt.create({"workspace_id": "wsd-crash", "workspace_disk_mb": 16})
sys.stdout.write("created\\n")
sys.stdout.flush()
"""


def test_reconcile_releases_the_image_of_a_crashed_create(runtime):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
    env["CRASH_DATA_DIR"] = str(runtime.settings.data_dir)
    image = image_of(runtime, "wsd-crash")
    for i in range(8):
        proc = subprocess.Popen([sys.executable, "-c", CREATOR], env=env,
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert proc.stdout is not None and proc.stdout.readline() == "go\n"
        if i:  # (the first one runs to its end: a sandbox whose creator is gone)
            # Killed mid-create, once its image is attached (or as soon as it exists).
            while not loop_backings(image.parent) and proc.poll() is None:
                time.sleep(0.001)
            proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        # A child the creator was starting holds its directory's lock until that child's exec
        # closes it (a moment after the creator is gone, longer on a loaded host): reconcile
        # leaves such a create alone as in flight, and its next run removes it.
        for _ in range(100):
            if not runtime.reconcile().in_flight:
                break
            time.sleep(0.05)
        for info in runtime.list():
            if info.workspace == image.parent:
                runtime.kill(info.id)
        # A device the crash left attached (its creator died inside the attach) detaches
        # itself once the kernel has closed it: a moment, never more than a few seconds.
        deadline = time.monotonic() + 5
        while loop_backings(image) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not loop_backings(image), f"crash {i}: still attached"
        assert not image.exists() or not locked(image), f"crash {i}: still locked"
    # The workspace is attachable again, with its filesystem intact.
    info = runtime.create({"workspace_id": "wsd-crash", "workspace_disk_mb": 16})
    runtime.kill(info.id)


def test_the_e2b_surface_takes_the_budget_of_a_host_mounted_workspace(tmp_path: Path) -> None:
    """What the gateway's e2b provider sends a Sandhold server, through the official SDK."""
    from e2b import Sandbox
    from e2b.exceptions import SandboxException

    from tests.support.e2b_server import KEY_A, new_server

    root = Path(tempfile.mkdtemp(prefix="sandhold-hm-", dir="/var/tmp"))
    root.chmod(0o755)
    (root / "ws").mkdir(mode=0o755)
    srv = new_server(tmp_path, host_mount_roots=json.dumps([str(root)]))
    srv.start()
    mount = json.dumps([{"hostPath": str(root / "ws"), "mountPath": "/workspace"}])
    kw = {"api_url": srv.url, "sandbox_url": srv.url, "api_key": KEY_A}
    try:
        for bad in ("lots", "-1", "4"):
            with pytest.raises(SandboxException, match=r"400: .*workspace"):
                Sandbox.create(metadata={"host-mount": mount, WORKSPACE_DISK_KEY: bad}, **kw)
        with pytest.raises(SandboxException, match=r"400: .*needs a workspace"):
            Sandbox.create(metadata={WORKSPACE_DISK_KEY: "16"}, **kw)
        sbx = Sandbox.create(metadata={"host-mount": mount, WORKSPACE_DISK_KEY: "16"}, **kw)
        assert WORKSPACE_DISK_KEY not in sbx.get_info().metadata  # parsed out, not a label
        size = sbx.commands.run("df -B1 --output=size /workspace | tail -1").stdout
        assert int(size) == 16 * MIB and os.listdir(root / "ws") == [IMAGE]
        sbx.kill()
        assert not loop_backings(root)
    finally:
        srv.destroy()
        shutil.rmtree(root, ignore_errors=True)
