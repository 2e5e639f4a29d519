"""Starting a sandbox's process tree: bubblewrap inside a user namespace whose uid map we write.

bwrap alone can map only one uid, but a sandbox needs two real users (``root`` and ``user``) that
are both unprivileged on the host. So bwrap runs as the unprivileged host uid ``uid_base`` and is
told to wait (``--userns-block-fd``) until we, as host root, have written the map
``0 -> uid_base, n -> uid_base + n``; it reports its child's pid through ``--info-fd``.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandhold.errors import SandboxStartFailed
from sandhold.runtime.cgroups import CgroupSet
from sandhold.runtime.seccomp import filter_fd

ID_RANGE = 65536
AGENT_LIB = "/opt/sandhold/lib"
AGENT_RUN = "/run/sandhold"
AGENT_MAIN = f"{AGENT_LIB}/sandhold/runtime/agent/__main__.py"
AGENT_SOCKET = f"{AGENT_RUN}/agent.sock"
# Capabilities the agent keeps (inside the user namespace only) to start processes as `user` and
# to drop everything, bounding set included, in those processes; and to bind the DNS stub of a
# sandbox with egress to 127.0.0.1:53 (its processes drop that one too).
AGENT_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE")


@dataclass
class Launch:
    root: Path  # the merged copy-on-write root
    ro_binds: Sequence[tuple[str, str]]
    binds: Sequence[tuple[str, str, bool]]  # host, sandbox, read_only
    run_dir: Path
    agent_lib: Path
    env: dict[str, str]


def bwrap_argv(
    launch: Launch, *, info_fd: int, block_fd: int, seccomp_fd: int, ready_fd: int
) -> list[str]:
    argv = [
        "bwrap",
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup",
        "--uid", "0", "--gid", "0",
        "--userns-block-fd", str(block_fd), "--info-fd", str(info_fd),
        "--cap-drop", "ALL",
    ]  # fmt: skip
    for cap in AGENT_CAPS:
        argv += ["--cap-add", cap]
    argv += [
        "--new-session", "--hostname", "sandbox",
        "--bind", str(launch.root), "/",
    ]  # fmt: skip
    for src, dst in launch.ro_binds:
        argv += ["--ro-bind", src, dst]
    argv += [
        "--proc", "/proc", "--dev", "/dev",
        "--perms", "1777", "--tmpfs", "/tmp",
        "--perms", "1777", "--tmpfs", "/dev/shm",
        "--bind", str(launch.run_dir), AGENT_RUN,
        "--ro-bind", str(launch.agent_lib), AGENT_LIB,
    ]  # fmt: skip
    for src, dst, ro in launch.binds:
        argv += ["--ro-bind" if ro else "--bind", src, dst]
    argv += ["--seccomp", str(seccomp_fd), "--clearenv"]
    for k, v in launch.env.items():
        argv += ["--setenv", k, v]
    argv += ["--chdir", "/", "/usr/bin/python3", "-I", "-S", AGENT_MAIN,
             "--config", f"{AGENT_RUN}/agent.json", "--socket", AGENT_SOCKET,
             "--ready-fd", str(ready_fd)]  # fmt: skip
    return argv


SETPRIV = "/usr/bin/setpriv"  # util-linux
# argv: cgroup.procs files, "--", the command to exec once the shell's pid is in all of them
JOIN_AND_EXEC = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 97; shift; done; shift; exec "$@"'


def _read_info(fd: int, timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    data = b""
    while b"}" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise SandboxStartFailed("bwrap did not report its child pid in time")
        chunk = os.read(fd, 4096)
        if not chunk:
            raise SandboxStartFailed("bwrap exited before starting the sandbox")
        data += chunk
    return json.loads(data[: data.index(b"}") + 1])


def spawn(
    launch: Launch, cgroups: CgroupSet, uid_base: int, ready_w: int, log_path: Path
) -> tuple[subprocess.Popen[bytes], int]:
    """Start the sandbox; returns bwrap's Popen and the host pid of the sandbox's init."""
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    seccomp = filter_fd()
    argv = bwrap_argv(
        launch, info_fd=info_w, block_fd=block_r, seccomp_fd=seccomp, ready_fd=ready_w
    )

    # Before bwrap creates the cgroup namespace, its process must be in the sandbox's cgroups
    # (so the sandbox sees its own group as the root, not the host's paths) and be the
    # unprivileged owner of the sandbox's user namespace. A shell joins the cgroups, setpriv
    # drops to uid_base, both exec in place (same pid); unlike a Python preexec_fn this lets
    # Popen vfork, which saved ~5 ms per create.
    procs = [str(d / "cgroup.procs") for d in cgroups.dirs()]
    setpriv = [SETPRIV, f"--reuid={uid_base}", f"--regid={uid_base}", "--clear-groups", "--"]
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", JOIN_AND_EXEC, "sh", *procs, "--", *setpriv, *argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=(info_w, block_r, seccomp, ready_w),
            start_new_session=True,  # survives the server: no shared session or signals
        )
    finally:
        for fd in (info_w, block_r, seccomp, log):
            os.close(fd)
    try:
        child = int(_read_info(info_r, 5.0)["child-pid"])
        mapping = f"0 {uid_base} {ID_RANGE}\n"
        with open(f"/proc/{child}/uid_map", "w") as f:
            f.write(mapping)
        with open(f"/proc/{child}/gid_map", "w") as f:
            f.write(mapping)
        os.write(block_w, b"1")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        os.close(info_r)
        os.close(block_w)
    return proc, child
