"""Suspend to disk with CRIU: a sandbox's processes checkpointed and gone, restored on resume
with their memory, across a new runtime (a server restart) too; a dump that fails and an image
that is damaged lose nothing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import pytest

from sandhold.errors import CheckpointFailed, Conflict
from sandhold.runtime import disk, images, mounts
from sandhold.runtime.checkpoint import process_tree
from sandhold.runtime.checkpoint.criu import criu_status
from sandhold.runtime.runtime import Runtime
from tests.counter import COUNTER as BARE_COUNTER
from tests.runtime.helpers import sh

# The counter (tests/counter.py), detached from the command that starts it.
COUNTER = f"({BARE_COUNTER} </dev/null >/dev/null 2>&1 &)"


@pytest.fixture(autouse=True)
def _criu(runtime: Runtime) -> None:
    ok, detail = criu_status(runtime.settings.criu_path)
    if not ok:
        pytest.skip(f"CRIU unusable here: {detail}")


async def _state(info, timeout: float = 60.0) -> tuple[int, str]:
    """The counter's state, once it has written one: a loaded host, or the emulated cgroup v2
    guest, starts its Python a second or more after the command that launched it returns."""
    deadline = time.monotonic() + timeout
    while not (words := (await sh(info, "cat /tmp/state 2>/dev/null || true")).text.split()):
        if time.monotonic() > deadline:
            raise AssertionError(f"no counter state in {info.id} after {timeout:g} s")
        await asyncio.sleep(0.02)
    n, secret = words
    return int(n), secret


async def _counting(make_sandbox):
    info = await make_sandbox()
    await sh(info, COUNTER)
    await _state(info)
    return info


async def test_suspend_frees_the_processes_and_resume_restores_their_memory(make_sandbox, runtime):
    info = await _counting(make_sandbox)
    n0, secret = await _state(info)
    runtime.pause(info.id)
    got = runtime.suspend(info.id)
    assert got.state == "paused" and got.suspended == "disk"
    assert runtime.cgroup(info.id).pids() == []  # nothing runs, nothing holds memory
    assert runtime.cgroup(info.id).usage()["memory_bytes"] < 4 << 20
    assert runtime.get(info.id).state == "paused"  # not judged failed for having no process
    with pytest.raises(Conflict):
        runtime.pause(info.id)
    restored = runtime.resume(info.id)
    assert restored.state == "running" and restored.suspended is None
    time.sleep(0.1)
    n1, secret1 = await _state(restored)
    assert secret1 == secret and n1 > n0  # the same process, carrying on from its memory
    assert (await sh(restored, "echo $((6*7))")).text.strip() == "42"
    assert not (info.dir / process_tree.IMAGES).exists()


async def test_a_suspended_sandbox_survives_a_new_runtime(make_sandbox, runtime, settings):
    info = await _counting(make_sandbox)
    n0, secret = await _state(info)
    runtime.suspend(info.id)  # straight from running
    other = Runtime(settings).open()  # what a restarted server does
    assert other.get(info.id).suspended == "disk"
    restored = other.resume(info.id)
    time.sleep(0.1)
    n1, secret1 = await _state(restored)
    assert secret1 == secret and n1 > n0


def reboot(runtime: Runtime, info) -> None:
    """What a host reboot takes from a suspended sandbox: its mounts (the layer's loop device
    detaches with its filesystem, the workspace's too) and its cgroups; its files stay."""
    assert runtime.cgroup(info.id).pids() == []
    for target in reversed(mounts.mounts_under(info.dir)):
        mounts.umount(Path(target))
    runtime.cgroup(info.id).remove()
    assert not mounts.mounts_under(info.dir) and not runtime.cgroup(info.id).exists()


@pytest.mark.parametrize("mode", ["disk", "filesystem"])
async def test_a_paused_sandbox_survives_a_host_reboot(make_sandbox, runtime, settings, mode):
    info = await make_sandbox(workspace_id=f"reboot-{mode}")
    await sh(info, COUNTER + "; echo kept > /workspace/f; echo layer > /home/user/f")
    for _ in range(100):
        if (await sh(info, "cat /tmp/state 2>/dev/null || true")).text:
            break
        time.sleep(0.02)
    n0, secret = await _state(info)
    runtime.suspend(info.id) if mode == "disk" else runtime.pause_filesystem(info.id)
    reboot(runtime, info)
    other = Runtime(settings).open()  # the server, started again after the reboot
    restored = other.resume(info.id)
    r = await sh(restored, "cat /workspace/f /home/user/f; echo more >> /workspace/f")
    assert r.text.split() == ["kept", "layer"], r.text
    if mode == "disk":
        time.sleep(0.1)
        n1, secret1 = await _state(restored)
        assert secret1 == secret and n1 > n0  # its processes carry on with their memory
    else:
        assert (await sh(restored, "cat /tmp/state 2>/dev/null || echo gone")).text == "gone\n"
    other.kill(info.id)
    assert not mounts.mounts_under(info.dir)


async def test_a_dump_that_fails_leaves_the_sandbox_as_it_was(make_sandbox, runtime):
    info = await _counting(make_sandbox)
    runtime.pause(info.id)
    images = info.dir / process_tree.IMAGES
    images.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(images)], check=True)
    try:
        with pytest.raises(CheckpointFailed, match="criu dump failed"):
            runtime.suspend(info.id)
    finally:
        subprocess.run(["umount", str(images)], check=True)
    got = runtime.get(info.id)
    assert got.state == "paused" and got.suspended is None
    assert runtime.cgroup(info.id).frozen()  # still paused in the freezer
    runtime.resume(info.id)
    n0, secret = await _state(info)
    time.sleep(0.1)
    n1, secret1 = await _state(info)
    assert secret1 == secret and n1 > n0  # the agent took its socket back, processes ran on


@pytest.mark.parametrize("damaged", ["compressed pages", "core"])
async def test_a_damaged_image_is_a_clear_error_and_loses_nothing(make_sandbox, runtime, damaged):
    info = await _counting(make_sandbox)
    runtime.suspend(info.id)
    images = info.dir / process_tree.IMAGES
    compressed = list(images.glob("pages-*.img" + process_tree.COMPRESSED))
    assert compressed and not list(images.glob("pages-*.img"))  # (suspend_compress, the default)
    if damaged == "core":
        (images / "core-1.img").write_bytes(b"not an image")
        expected = "criu restore failed"
    else:
        data = compressed[0].read_bytes()
        compressed[0].write_bytes(data[: len(data) // 2])
        expected = "cannot be read back"
    with pytest.raises(CheckpointFailed, match=expected):
        runtime.resume(info.id)
    got = runtime.get(info.id)
    assert got.state == "paused" and got.suspended == "disk"  # kept, for the operator
    assert runtime.cgroup(info.id).pids() == []  # nothing half-restored runs
    runtime.kill(info.id)
    assert not info.dir.exists()


async def test_inotify_watches_in_the_users_files_survive(make_sandbox, runtime):
    """A watch on an overlay inode cannot be reopened by handle; CRIU finds it by its path."""
    info = await make_sandbox()
    watcher = (
        "import ctypes, os\nl = ctypes.CDLL(None)\nfd = l.inotify_init1(0)\n"
        "l.inotify_add_watch(fd, b'/home/user', 0x100)\nopen('/tmp/w', 'w').write('ready')\n"
        "os.read(fd, 4096)\nopen('/tmp/w', 'w').write('event')\n"
    )
    await sh(info, f"(python3 -c \"{watcher}\" </dev/null >/dev/null 2>&1 &); "
                   "for i in $(seq 100); do [ -s /tmp/w ] && break; sleep 0.02; done")  # fmt: skip
    runtime.suspend(info.id)
    restored = runtime.resume(info.id)
    r = await sh(restored, "touch /home/user/new; sleep 0.2; cat /tmp/w")
    assert r.text == "event", r.text  # the restored watch saw the create (IN_CREATE)


async def test_a_file_held_open_in_the_workspace_view(make_sandbox, runtime):
    """The workspace is an idmapped view: the restore must bind the view, not the plain
    directory under it (whose owners the sandbox's range does not map)."""
    info = await make_sandbox(workspace_id="suspend-open")
    writer = (
        "import time\nf = open('/workspace/log', 'a')\nwhile True:\n"
        "    f.write('x'); f.flush(); time.sleep(0.02)"
    )
    await sh(info, f'(python3 -c "{writer}" </dev/null >/dev/null 2>&1 &); sleep 0.2')
    runtime.suspend(info.id)
    restored = runtime.resume(info.id)
    size = "stat -c %s /workspace/log"
    r = await sh(restored, f"a=$({size}); sleep 0.3; b=$({size}); "
                           "[ $b -gt $a ] && echo growing; stat -c %u /workspace/log")  # fmt: skip
    assert r.text.split() == ["growing", "1000"], r.text


async def test_a_filesystem_pause_drops_processes_and_resume_boots_afresh(make_sandbox, runtime):
    info = await make_sandbox(workspace_id="fs-pause")
    await sh(info, COUNTER + "; echo kept > /home/user/file; echo ws > /workspace/file")
    got = runtime.pause_filesystem(info.id)
    assert got.state == "paused" and got.suspended == "filesystem"
    assert runtime.cgroup(info.id).pids() == []  # no process, no memory
    assert runtime.get(info.id).suspended == "filesystem"  # not judged failed
    booted = runtime.resume(info.id)
    assert booted.state == "running" and booted.suspended is None
    r = await sh(
        booted, "cat /home/user/file /workspace/file; ps -eo args | grep -c '[t]oken_hex' || true"
    )
    assert r.text.split() == ["kept", "ws", "0"], r.text  # files kept, processes not
    # From a sandbox suspended to disk too: its checkpoint is dropped, it boots afresh.
    await sh(booted, COUNTER)
    runtime.suspend(booted.id)
    runtime.pause_filesystem(booted.id)
    assert not (info.dir / "checkpoint").exists()
    again = runtime.resume(booted.id)
    assert (await sh(again, "cat /home/user/file")).text.strip() == "kept"


async def test_reads_during_a_suspend_never_judge_it_failed(make_sandbox, runtime):
    """A reader sees no process while the dump runs: it must not mark the sandbox failed."""
    import threading

    info = await make_sandbox()
    await sh(info, COUNTER)
    seen: set[str] = set()
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.add(runtime.get(info.id).state)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        runtime.suspend(info.id)
    finally:
        done.set()
        reader.join()
    assert "failed" not in seen and runtime.get(info.id).suspended == "disk"
    assert runtime.resume(info.id).state == "running"


async def test_a_process_holding_a_tcp_socket_suspends_and_resumes(make_sandbox, runtime):
    """A server inside (one thread): CRIU 4.1.1 as released fails to dump any TCP socket on
    Linux >= 6.16 (scripts/criu/0002-socket-opts-eopnotsupp.patch)."""
    info = await make_sandbox()
    serve = "python3 -m http.server 8000 --bind 127.0.0.1 -d /home/user </dev/null >/dev/null"
    get = "curl -sf localhost:8000/page"
    await sh(info, f"({serve} 2>&1 &); echo served > /home/user/page; "
                   f"for i in $(seq 100); do {get} && break; sleep 0.05; done")  # fmt: skip
    runtime.suspend(info.id)
    restored = runtime.resume(info.id)
    r = await sh(restored, "curl -sf localhost:8000/page")
    assert r.text == "served\n", r.text


async def test_a_multi_threaded_process_suspends_and_resumes(make_sandbox, runtime):
    """Threads are restored into the sandbox's cgroups too (the interpreter's kernel has them)."""
    info = await make_sandbox()
    await sh(info, THREADS)
    runtime.suspend(info.id)
    await assert_ticking(runtime, runtime.resume(info.id))


# A process with a thread that ticks a counter its main thread writes to /tmp/ticks.
THREADS = (
    '(python3 -c "import threading, time\nn = [0]\ndef tick():\n    while True:\n'
    "        n[0] += 1; time.sleep(0.01)\nthreading.Thread(target=tick, daemon=True).start()\n"
    "while True:\n    open('/tmp/ticks', 'w').write(str(n[0])); time.sleep(0.02)\n\" "
    "</dev/null >/dev/null 2>&1 &); sleep 0.3"
)


async def assert_ticking(runtime, info) -> None:
    """THREADS' thread carries on in ``info``, in that sandbox's own cgroups."""
    ticks = "cat /tmp/ticks"
    r = await sh(info, f"a=$({ticks}); sleep 0.3; b=$({ticks}); [ $b -gt $a ] && echo ticking")
    assert r.text.strip() == "ticking", r.text
    mine = set(runtime.cgroup(info.id).pids())
    tasks = {int(t) for p in mine for t in os.listdir(f"/proc/{p}/task")}
    assert len(tasks) > len(mine)  # its thread is there, in the sandbox's groups


async def test_a_dump_past_its_timeout_is_killed_and_loses_nothing(make_sandbox, runtime,
                                                                   monkeypatch):  # fmt: skip
    info = await _counting(make_sandbox)
    monkeypatch.setattr(runtime.settings, "criu_timeout_s", 0.001)
    with pytest.raises(CheckpointFailed, match=r"criu dump did not finish in 0\.001 s"):
        runtime.suspend(info.id)
    monkeypatch.undo()
    got = runtime.get(info.id)
    assert got.state == "running" and got.suspended is None
    n0, secret = await _state(info)
    time.sleep(0.1)
    n1, secret1 = await _state(info)
    assert secret1 == secret and n1 > n0  # handed its socket back; its processes ran on


async def test_a_boot_id_of_its_own_new_at_each_boot_kept_by_a_suspend(make_sandbox, runtime):
    boot_id = "cat /proc/sys/kernel/random/boot_id"
    host = Path("/proc/sys/kernel/random/boot_id").read_text()
    a, b = await make_sandbox(), await make_sandbox()
    first = (await sh(a, boot_id)).text
    assert first not in (host, (await sh(b, boot_id)).text)  # not the host's, not a neighbour's
    runtime.suspend(a.id)
    assert (await sh(runtime.resume(a.id), boot_id)).text == first  # the same boot, carried on
    runtime.pause_filesystem(a.id)
    assert (await sh(runtime.resume(a.id), boot_id)).text != first  # a cold boot: a new one


@pytest.mark.parametrize("mode", ["disk", "filesystem"])
async def test_a_suspended_sandbox_holds_no_mount_or_loop_device(make_sandbox, runtime, mode):
    # Live sandboxes only in the host's mount table (every create copies it), and no loop device
    # per suspended sandbox; resume mounts them again, its files and boot id as they were.
    info = await _counting(make_sandbox)
    await sh(info, "echo layer > /home/user/f")
    boot_id = (await sh(info, "cat /proc/sys/kernel/random/boot_id")).text
    device = (info.dir / disk.DEVICE).read_text().strip()
    runtime.suspend(info.id) if mode == "disk" else runtime.pause_filesystem(info.id)
    assert mounts.mounts_under(info.dir) == []
    # (the loop device detaches itself once the kernel lets go of its filesystem, not waited for)
    assert images.release(info.dir / disk.MOUNT, info.dir / disk.DEVICE, info.dir / disk.IMAGE,
                          30), device  # fmt: skip
    restored = runtime.resume(info.id)
    assert (await sh(restored, "cat /home/user/f")).text == "layer\n"
    again = (await sh(restored, "cat /proc/sys/kernel/random/boot_id")).text
    assert (again == boot_id) == (mode == "disk")  # the same boot carried on, or a cold one
    assert images.attached(info.dir / disk.DEVICE, info.dir / disk.IMAGE)


async def test_a_layer_still_held_elsewhere_resumes_on_its_own_loop_device(make_sandbox, runtime):
    # A mount namespace copied from the host's while the sandbox ran (here a process that keeps
    # it) holds the layer's filesystem after the suspend let go of it: resume mounts that same
    # filesystem again (its device), not a second one on the image, and does not refuse.
    info = await _counting(make_sandbox)
    await sh(info, "echo layer > /home/user/f")
    holder = subprocess.Popen(["unshare", "--mount", "--propagation", "unchanged", "sleep", "600"])
    try:
        device = (info.dir / disk.DEVICE).read_text().strip()
        for _ in range(200):  # (its copy exists once unshare has run)
            if Path(f"/proc/{holder.pid}/cmdline").read_bytes().startswith(b"sleep"):
                break
            time.sleep(0.01)
        n0, secret = await _state(info)
        runtime.suspend(info.id)
        assert mounts.mounts_under(info.dir) == []
        assert images.attached(info.dir / disk.DEVICE, info.dir / disk.IMAGE)  # held by the copy
        restored = runtime.resume(info.id)
        assert (info.dir / disk.DEVICE).read_text().strip() == device
        assert (await sh(restored, "cat /home/user/f; echo more >> /home/user/f")).text == "layer\n"
        time.sleep(0.1)
        n1, secret1 = await _state(restored)
        assert secret1 == secret and n1 > n0
    finally:
        holder.kill()
        holder.wait()
    runtime.kill(info.id)
    assert not mounts.mounts_under(info.dir)
