"""Waiting for a sandbox's processes to be gone: the runtime is a child subreaper, so a
sandbox's pid 1 (whose parent, bwrap, dies with it) is re-parented to us and reaped here."""

from __future__ import annotations

import ctypes
import functools
import os
import select
import time
from pathlib import Path

from sandhold.errors import SandboxStartFailed
from sandhold.runtime.cgroup_files import read_proc

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[1])
    except (FileNotFoundError, IndexError, ValueError):
        return None


PF_EXITING = 0x4  # of /proc/<pid>/stat's flags: the task is in do_exit


def ending(pid: int) -> bool:
    """Whether ``pid`` is gone or on its way out. A sandbox's dying pid 1 stays in its cgroup,
    its descriptors (the agent's socket) already closed, until the kernel has ended the rest
    of its pid namespace: calls sent then were refused though it looked alive."""
    try:
        fields = read_proc(f"/proc/{pid}/stat").rpartition(b")")[2].split()
    except (FileNotFoundError, ProcessLookupError):  # a read as it is reaped: ESRCH
        return True
    return fields[0] in (b"Z", b"X") or bool(int(fields[6]) & PF_EXITING)


def reap_init(init_pid: int | None, timeout: float = 5.0) -> None:
    """Wait until the sandbox's pid 1 is gone, reaping it if it was adopted by us."""
    if not init_pid:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if parent_of(init_pid) != os.getpid():
                raise ChildProcessError  # not adopted by us (yet), or a reused pid
            if os.waitpid(init_pid, os.WNOHANG)[0] == init_pid:
                return
        except ChildProcessError:
            # Not (yet) ours. A zombie that is not ours is dead already: whoever adopted it
            # (the host's init, after a server restart) reaps it in its own time.
            try:
                with open(f"/proc/{init_pid}/stat") as f:
                    if f.read().rpartition(")")[2].split()[0] == "Z":
                        return
            except FileNotFoundError:
                return
        time.sleep(0.001)


def read_ready(fd: int, timeout: float) -> bytes | None:
    """The first bytes the agent writes on its ready pipe, or None if none came in time (an
    empty result means the agent closed the pipe: it died before getting ready)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            if poller.poll(left * 1000):
                return os.read(fd, 64)
        except InterruptedError:
            continue


def wait_ready(fd: int, timeout: float, log_path: Path) -> None:
    """Until the agent says it is ready on ``fd``; SandboxStartFailed with its log's tail if it
    died first, or said nothing in time."""
    data = read_ready(fd, timeout)
    if data is None:
        raise SandboxStartFailed(f"the sandbox agent was not ready within {timeout} s")
    if not data.startswith(b"ready"):
        logtail = log_path.read_text(errors="replace")[-2000:]
        raise SandboxStartFailed(f"the sandbox agent failed to start: {logtail.strip()}")


@functools.cache
def pid_namespace() -> str:
    """This process's PID namespace (``pid:[inode]``): the one the pids it reads belong to."""
    return os.readlink("/proc/self/ns/pid")
