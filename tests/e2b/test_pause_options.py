"""Pause options through the official SDK: a filesystem-only pause (its memory dropped, its files
kept, a fresh boot on resume), a reboot on resume, a filesystem auto-pause, and a strict pause
that first checks the guest agent answers."""

from __future__ import annotations

import os
import signal
import time
import uuid

import httpx
import pytest
from e2b import (
    Sandbox,
    SandboxQuery,
    SandboxState,
    ServiceBusyException,
)

from tests.support.e2b_server import Server


def running_unchanged(server: Server, sbx: Sandbox, pid: int, end_at: object) -> None:
    """Still running (in the runtime's record too: not frozen), its process alive, its end time
    untouched."""
    info = sbx.get_info()
    assert info.state == SandboxState.RUNNING and info.end_at == end_at
    assert server.runtime().get(sbx.sandbox_id).state == "running"
    assert pid in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.run("cat /tmp/kept").stdout == "in memory"


def test_a_filesystem_pause_drops_processes_and_keeps_files(server: Server) -> None:
    sbx = Sandbox.create(timeout=300)
    try:
        sbx.files.write("/home/user/kept.txt", "on disk")
        sbx.files.write("/tmp/gone", "in memory")  # /tmp is memory (a tmpfs)
        sbx.commands.run("sleep 600", background=True)
        boot_id = "cat /proc/sys/kernel/random/boot_id"
        before = sbx.commands.run(boot_id).stdout
        assert sbx.pause(mode="filesystem") is True  # {"memory": false}
        info = sbx.get_info()
        assert info.state == SandboxState.PAUSED
        record = server.runtime().get(sbx.sandbox_id)
        assert record.suspended == "filesystem"
        assert server.runtime().cgroup(record.id).pids() == []  # no process, no memory
        assert sbx.pause(mode="filesystem") is False  # already paused
        back = Sandbox.connect(sbx.sandbox_id)  # boots afresh over the files
        assert back.files.read("/home/user/kept.txt") == "on disk"
        assert back.commands.run("pgrep -c -x sleep || true").stdout.strip() == "0"
        assert back.commands.run("cat /tmp/gone 2>/dev/null || echo none").stdout == "none\n"
        assert back.commands.run(boot_id).stdout not in ("", before)  # a boot of its own
        assert sbx.pause(keep_memory=False) is True  # the deprecated spelling of the same
    finally:
        sbx.kill()


def test_reboot_on_resume_drops_the_memory_of_a_paused_sandbox(
    server: Server, api: httpx.Client
) -> None:
    sbx = Sandbox.create(timeout=300)
    try:
        sbx.files.write("/home/user/kept.txt", "on disk")
        sbx.commands.run("sleep 600", background=True)
        assert sbx.pause() is True  # memory kept...
        back = Sandbox.connect(sbx.sandbox_id, on_resume="reboot")  # ...and dropped
        assert back.commands.run("pgrep -c -x sleep || true").stdout.strip() == "0"
        assert back.files.read("/home/user/kept.txt") == "on disk"
        back.commands.run("sleep 600", background=True)
        assert back.pause() is True
        r = api.post(f"/sandboxes/{sbx.sandbox_id}/resume", json={"timeout": 60, "memory": False})
        assert r.status_code == 201, r.text
        assert back.commands.run("pgrep -c -x sleep || true").stdout.strip() == "0"
    finally:
        sbx.kill()


def test_a_filesystem_auto_pause(server: Server, api: httpx.Client) -> None:
    tag = {"suite": uuid.uuid4().hex}
    # With auto-resume it is E2B's own refusal (the SDK refuses it before sending; raw here).
    body = {"templateID": "base", "autoPause": True, "autoPauseMemory": False,
            "autoResume": {"enabled": True}, "metadata": tag}  # fmt: skip
    r = api.post("/v2/sandboxes", json=body)
    assert r.status_code == 400 and "autoResume cannot be combined" in r.json()["message"]
    assert Sandbox.list(query=SandboxQuery(metadata=tag)).next_items() == []
    fs_pause = {"on_timeout": {"action": "pause", "mode": "filesystem"}}
    sbx = Sandbox.create(timeout=3, metadata=tag, lifecycle=fs_pause)  # type: ignore[arg-type]
    try:
        sbx.files.write("/home/user/kept.txt", "on disk")
        for _ in range(200):
            if sbx.get_info().state == SandboxState.PAUSED:
                break
            time.sleep(0.05)
        assert server.runtime().get(sbx.sandbox_id).suspended == "filesystem"
        back = Sandbox.connect(sbx.sandbox_id, timeout=60)
        assert back.files.read("/home/user/kept.txt") == "on disk"
    finally:
        sbx.kill()


def test_a_strict_pause_pauses_a_healthy_sandbox(server: Server) -> None:
    sbx = Sandbox.create(timeout=300)
    try:
        sbx.files.write("/tmp/kept", "in memory")
        pid = sbx.commands.run("sleep 600", background=True).pid
        assert sbx.pause(strict=True) is True  # {"requireHealthyGuest": true}
        assert sbx.get_info().state == SandboxState.PAUSED
        assert sbx.pause(strict=True) is False  # already paused
        back = Sandbox.connect(sbx.sandbox_id)
        assert pid in [p.pid for p in back.commands.list()]
        assert back.commands.run("cat /tmp/kept").stdout == "in memory"
    finally:
        sbx.kill()


def test_a_strict_pause_of_an_unresponsive_guest_is_refused(server: Server) -> None:
    """The agent stopped from the host (SIGSTOP: alive, answering nothing): a strict pause is
    E2B's 503 (ServiceBusyException) and the sandbox keeps running; a plain one pauses."""
    sbx = Sandbox.create(timeout=300)
    try:
        sbx.files.write("/tmp/kept", "in memory")
        pid = sbx.commands.run("sleep 600", background=True).pid
        end_at = sbx.get_info().end_at
        agent = server.runtime().get(sbx.sandbox_id).init_pid
        os.kill(agent, signal.SIGSTOP)
        try:
            with pytest.raises(ServiceBusyException, match="did not answer its health check"):
                sbx.pause(strict=True, retries=0)
            assert server.runtime().get(sbx.sandbox_id).state == "running"
        finally:
            os.kill(agent, signal.SIGCONT)
        running_unchanged(server, sbx, pid, end_at)
        assert sbx.pause(strict=True) is True  # answering again
    finally:
        sbx.kill()
