"""Whether a sandbox still runs, judged by its cgroup, and what becomes of one whose processes
are gone though nobody killed it (it is marked failed and kept until it is killed)."""

from __future__ import annotations

import logging
import time
from contextlib import suppress

from sandhold.errors import SandboxNotFound
from sandhold.runtime.host import Host
from sandhold.runtime.reaping import ending, pid_namespace
from sandhold.runtime.records import SandboxInfo

log = logging.getLogger(__name__)


def alive(host: Host, info: SandboxInfo) -> bool:
    """Whether its agent (pid 1 inside) runs, judged by the cgroup, never by a bare pid (pids
    wrap and are reused): its pid among the cgroup's, not ending. Not any process of the
    cgroup: bwrap outlives a killed agent by a moment, and a call then reached a dead one."""
    host.children.poll(info.id)
    if info.pid_ns is not None and info.pid_ns != pid_namespace():
        # Its pids are numbers of another namespace (a reader outside the server's, or one in
        # a pod): it lives while its group holds any process. A read must not mark it failed.
        return host.cgroup(info.id).populated()
    return info.init_pid in host.cgroup(info.id).pids() and not ending(info.init_pid)


def get(host: Host, sandbox_id: str) -> SandboxInfo:
    """The sandbox's record; one found dead is marked failed first."""
    d = host.records.dir(sandbox_id)
    try:
        info = host.records.load(d)
    except FileNotFoundError:
        raise SandboxNotFound(f"sandbox {sandbox_id!r} does not exist") from None
    if info.state != "failed" and not info.suspended and not alive(host, info):
        failed = reap(host, info)
        if failed is None:
            raise SandboxNotFound(f"sandbox {sandbox_id!r} does not exist")
        return failed
    return info


def reap(host: Host, info: SandboxInfo) -> SandboxInfo | None:
    """A sandbox whose processes are gone though nobody killed it: its agent, pid 1 of its
    pid namespace, died (a bug; the host's OOM killer or root; a reboot), and the kernel
    took everything else with it. It is marked failed and otherwise left as it is (its
    files, mounts and cgroups, and the workspace, untouched) until it is killed. Returns
    the record, or None if it was killed meanwhile."""
    try:
        with host.records.locked(info.id) as d:
            info = host.records.load(d)
            if info.state == "failed" or info.suspended or alive(host, info):
                return info
            bwrap = host.children.pop(info.id)  # exits with the agent's status
            info.state, info.failed_at = "failed", time.time()
            info.failure = _failure(host, info.id, bwrap.wait() if bwrap else None)
            host.records.save(info)
    except SandboxNotFound:
        return None
    log.warning("sandbox %s failed: %s; kept until it is killed", info.id, info.failure)
    return info


def _failure(host: Host, sandbox_id: str, status: int | None) -> str:
    what = "its agent (pid 1) is gone"
    if status is not None:  # bwrap exits with its child's status, 128 + n for signal n
        what += f", exit status {status}"
        if status > 128:
            what += f" (signal {status - 128})"
    with suppress(OSError, ValueError, KeyError):
        if ooms := host.cgroup(sandbox_id).usage()["oom_kills"]:
            what += f"; {ooms} OOM kill(s) in the sandbox"
    return what
