"""Processes and PTYs through the data plane (Connect-JSON streams proxied to the agent)."""

from __future__ import annotations

import asyncio

import pytest
from e2b import (
    AsyncSandbox,
    CommandExitException,
    PtySize,
    Sandbox,
    TimeoutException,
)

from tests.support.e2b_server import Server


def test_foreground_output_env_cwd_user(sbx: Sandbox) -> None:
    r = sbx.commands.run("echo out; echo err >&2; echo $FOO; pwd; whoami",
                         envs={"FOO": "bar baz"}, cwd="/tmp")  # fmt: skip
    assert r.exit_code == 0
    assert r.stdout == "out\nbar baz\n/tmp\nuser\n" and r.stderr == "err\n"
    assert sbx.commands.run("whoami", user="root").stdout == "root\n"
    assert sbx.commands.run("pwd").stdout == "/home/user\n"


def test_nonzero_exit_raises(sbx: Sandbox) -> None:
    with pytest.raises(CommandExitException) as exc:
        sbx.commands.run("echo partial; echo broken >&2; exit 3")
    assert exc.value.exit_code == 3
    assert exc.value.stdout == "partial\n" and exc.value.stderr == "broken\n"


def test_streaming_callbacks(sbx: Sandbox) -> None:
    seen: list[str] = []
    r = sbx.commands.run("for i in 1 2 3; do echo line$i; sleep 0.05; done",
                         on_stdout=seen.append)  # fmt: skip
    assert "".join(seen) == r.stdout == "line1\nline2\nline3\n"


def test_timeout(sbx: Sandbox) -> None:
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 30", timeout=1)
    assert sbx.commands.run("echo still fine").stdout == "still fine\n"


def test_background_list_connect_kill(sbx: Sandbox) -> None:
    h = sbx.commands.run("for i in $(seq 1 5); do echo tick$i; sleep 0.2; done",
                         background=True)  # fmt: skip
    assert h.pid in [p.pid for p in sbx.commands.list()]
    other = sbx.commands.connect(h.pid)  # a second client attached to the running command
    result = other.wait()
    assert result.exit_code == 0 and "tick5" in result.stdout
    sleeper = sbx.commands.run("sleep 600", background=True)
    assert sleeper.kill() is True
    with pytest.raises(CommandExitException):
        sleeper.wait()
    assert sleeper.pid not in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(sleeper.pid) is False  # not found any more


def test_stdin(sbx: Sandbox) -> None:
    h = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "hello ")
    sbx.commands.send_stdin(h.pid, b"world\n")
    sbx.commands.close_stdin(h.pid)
    assert h.wait().stdout == "hello world\n"


def test_pty(sbx: Sandbox) -> None:
    pty = sbx.pty.create(PtySize(rows=24, cols=80), envs={"PS1": "$ "})
    sbx.pty.send_stdin(pty.pid, b"stty size\n")
    out = bytearray()
    for _, _, data in pty:  # (stdout, stderr, pty) tuples, streamed
        out.extend(data or b"")
        if b"24 80" in out:
            break
    sbx.pty.resize(pty.pid, PtySize(rows=40, cols=132))
    sbx.pty.send_stdin(pty.pid, b"stty size; tty; exit 7\n")
    with pytest.raises(CommandExitException) as exc:
        pty.wait(on_pty=out.extend)
    assert exc.value.exit_code == 7
    text = out.decode(errors="replace")
    assert "40 132" in text and "/dev/pts/" in text


def test_pty_kill(sbx: Sandbox) -> None:
    pty = sbx.pty.create(PtySize(rows=24, cols=80))
    assert sbx.pty.kill(pty.pid) is True
    with pytest.raises(CommandExitException):
        pty.wait()


async def test_async_commands_and_pty(server: Server) -> None:
    s = await AsyncSandbox.create(timeout=120)
    try:
        r = await s.commands.run("echo $X", envs={"X": "async"})
        assert r.stdout == "async\n"
        with pytest.raises(CommandExitException):
            await s.commands.run("exit 5")
        h = await s.commands.run("cat", background=True, stdin=True)
        await s.commands.send_stdin(h.pid, "piped\n")
        await s.commands.close_stdin(h.pid)
        assert (await h.wait()).stdout == "piped\n"
        long = await s.commands.run("sleep 600", background=True)
        assert await long.kill() is True
        chunks: list[bytes] = []
        pty = await s.pty.create(PtySize(rows=10, cols=50), on_data=chunks.append)
        await s.pty.send_stdin(pty.pid, b"stty size; exit\n")
        await pty.wait()
        assert "10 50" in b"".join(chunks).decode(errors="replace")
        with pytest.raises(TimeoutException):
            await s.commands.run("sleep 30", timeout=1)
    finally:
        await s.kill()


async def test_a_killed_sandbox_breaks_its_streams(server: Server) -> None:
    s = await AsyncSandbox.create(timeout=60)
    h = await s.commands.run("sleep 600", background=True)
    waiter = asyncio.create_task(h.wait())
    await asyncio.sleep(0.2)
    await AsyncSandbox.kill(s.sandbox_id)
    with pytest.raises(Exception) as exc:
        await asyncio.wait_for(waiter, 30)
    assert "TimeoutError" not in type(exc.value).__name__
    assert await s.is_running() is False


def test_sudo_and_python_as_in_e2bs_base(sbx: Sandbox) -> None:
    r = sbx.commands.run("sudo whoami; python -c 'print(6 * 7)'")
    assert r.stdout.split() == ["root", "42"], r
