"""``commands.kill(pid)`` and ``pty.kill(pid)`` answer True once the process is gone: a check
right after the answer finds no process to signal (issue 31; before, the answer came with the
signal, and a process with memory to give back could still be signalled for a moment)."""

from __future__ import annotations

import time

from e2b import Sandbox

# A process with 300 MiB to give back when it dies, and the pid it runs as.
BIG = "python3 -c 'b = bytearray(300 << 20); import time; time.sleep(600)'"


def rss_mib(sbx: Sandbox, pid: int) -> int:
    out = sbx.commands.run(f"grep VmRSS /proc/{pid}/status || true").stdout.split()
    return int(out[1]) >> 10 if len(out) > 1 else 0


def until_big(sbx: Sandbox, pid: int) -> None:
    deadline = time.monotonic() + 60
    while rss_mib(sbx, pid) < 290:
        assert time.monotonic() < deadline, "the process never grew"
        time.sleep(0.1)


def alive(sbx: Sandbox, pid: int) -> str:
    return sbx.commands.run(f"kill -0 {pid} 2>/dev/null && echo alive || echo gone").stdout.strip()


def test_a_killed_command_is_gone_when_kill_answers(sbx: Sandbox) -> None:
    for _ in range(3):
        handle = sbx.commands.run(f"exec {BIG}", background=True)
        until_big(sbx, handle.pid)
        assert sbx.commands.kill(handle.pid) is True
        assert alive(sbx, handle.pid) == "gone"


def test_a_killed_pty_is_gone_when_kill_answers(sbx: Sandbox) -> None:
    from e2b import PtySize

    for _ in range(3):
        term = sbx.pty.create(PtySize(rows=24, cols=80))
        sbx.pty.send_stdin(term.pid, f"exec {BIG}\n".encode())
        until_big(sbx, term.pid)
        assert sbx.pty.kill(term.pid) is True
        assert alive(sbx, term.pid) == "gone"
