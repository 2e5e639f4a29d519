"""Pause options through the official SDK: what is not built here (a filesystem-only pause, a
reboot on resume) is refused with a message that says so, and changes nothing; what is (a full
pause, a strict one that first checks the guest agent answers) works."""

from __future__ import annotations

import os
import signal
import uuid

import httpx
import pytest
from e2b import (
    Sandbox,
    SandboxException,
    SandboxLifecycle,
    SandboxQuery,
    SandboxState,
    ServiceBusyException,
)

from tests.e2b.conftest import Server

NOT_BUILT = "filesystem-only pause is not built yet"


def running_unchanged(server: Server, sbx: Sandbox, pid: int, end_at: object) -> None:
    """Still running (in the runtime's record too: not frozen), its process alive, its end time
    untouched."""
    info = sbx.get_info()
    assert info.state == SandboxState.RUNNING and info.end_at == end_at
    assert server.runtime().get(sbx.sandbox_id).state == "running"
    assert pid in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.run("cat /tmp/kept").stdout == "in memory"


def test_a_filesystem_pause_is_refused_and_the_sandbox_keeps_running(server: Server) -> None:
    sbx = Sandbox.create(timeout=300)
    try:
        sbx.files.write("/tmp/kept", "in memory")
        pid = sbx.commands.run("sleep 600", background=True).pid
        end_at = sbx.get_info().end_at
        with pytest.raises(SandboxException, match=NOT_BUILT) as refused:
            sbx.pause(mode="filesystem")  # {"memory": false}
        assert str(refused.value).startswith("400: ")
        assert "keeps running" in str(refused.value)
        running_unchanged(server, sbx, pid, end_at)
        with pytest.raises(SandboxException, match=NOT_BUILT):
            sbx.pause(keep_memory=False)  # the deprecated spelling of the same
        running_unchanged(server, sbx, pid, end_at)

        # What is built still works: {"memory": true}, then {} (the SDK's plain pause()).
        assert sbx.pause(mode="full") is True
        assert sbx.get_info().state == SandboxState.PAUSED
        # Asking a paused sandbox for a filesystem pause is a refusal too, not "already paused".
        with pytest.raises(SandboxException, match=NOT_BUILT):
            sbx.pause(mode="filesystem")
        back = Sandbox.connect(sbx.sandbox_id)
        assert back.commands.run("cat /tmp/kept").stdout == "in memory"
        assert back.pause() is True
        assert back.pause() is False  # already paused: the SDK's False
    finally:
        sbx.kill()


def test_reboot_on_resume_is_refused_saying_it_is_not_built(
    server: Server, api: httpx.Client
) -> None:
    sbx = Sandbox.create(timeout=300)
    try:
        sbx.files.write("/tmp/kept", "in memory")
        assert sbx.pause() is True
        with pytest.raises(SandboxException, match=NOT_BUILT) as refused:
            Sandbox.connect(sbx.sandbox_id, on_resume="reboot")  # {"memory": false}
        assert "still paused" in str(refused.value)
        r = api.post(f"/sandboxes/{sbx.sandbox_id}/resume", json={"memory": False})  # v1
        assert r.status_code == 400 and NOT_BUILT in r.json()["message"]
        assert sbx.get_info().state == SandboxState.PAUSED
        back = Sandbox.connect(sbx.sandbox_id, on_resume="restore")
        assert back.commands.run("cat /tmp/kept").stdout == "in memory"
    finally:
        sbx.kill()


def test_a_filesystem_auto_pause_is_refused_and_creates_nothing(
    server: Server, api: httpx.Client
) -> None:
    tag = {"suite": uuid.uuid4().hex}
    filesystem: SandboxLifecycle = {"on_timeout": {"action": "pause", "mode": "filesystem"}}
    with pytest.raises(SandboxException, match=NOT_BUILT) as refused:
        Sandbox.create(timeout=60, metadata=tag, lifecycle=filesystem)
    assert str(refused.value).startswith("400: ") and "autoPauseMemory" in str(refused.value)
    assert Sandbox.list(query=SandboxQuery(metadata=tag)).next_items() == []
    # With auto-resume it is E2B's own refusal (the SDK refuses it before sending; raw here).
    body = {"templateID": "base", "autoPause": True, "autoPauseMemory": False,
            "autoResume": {"enabled": True}, "metadata": tag}  # fmt: skip
    r = api.post("/v2/sandboxes", json=body)
    assert r.status_code == 400 and "autoResume cannot be combined" in r.json()["message"]
    # A full auto-pause is what is built.
    sbx = Sandbox.create(timeout=60, metadata=tag,
                         lifecycle={"on_timeout": {"action": "pause", "mode": "full"}})  # fmt: skip
    try:
        assert sbx.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
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
