"""Starting a sandbox's process tree: bubblewrap inside a user namespace whose uid map we write.

bwrap alone can map only one uid, but a sandbox needs two real users (``root`` and ``user``) that
are both unprivileged on the host. So bwrap runs as the first host uid of the sandbox's own range
(``host_uid``, see runtime/uids.py) and is told to wait (``--userns-block-fd``) until we, as host
root, have written the map ``n -> host_uid + n``; it reports its child's pid through ``--info-fd``.

The agent is that child, and the init of the sandbox's pid namespace (``--as-pid-1``): the kernel
drops every signal sent to it from inside for which it has no handler, SIGKILL and SIGSTOP
included, so root inside cannot kill it. Its socket is made and listened on by the host and
inherited, so nothing inside can remove it; its configuration comes on an inherited descriptor
too: no host directory is bound for either.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandhold.errors import HostUnsupported, SandboxStartFailed
from sandhold.runtime import safefs
from sandhold.runtime.cgroup_files import Group
from sandhold.runtime.idmap import ID_RANGE
from sandhold.runtime.seccomp import filter_fd

log = logging.getLogger(__name__)

AGENT_LIB = "/opt/sandhold/lib"
KIT_USR = "/.sandhold/usr"  # the host's /usr, for the agent of a root without our Python
RW_DIRS = ".sandhold-rw"  # in the sandbox's root: what Launch.rw_dirs binds
HANDOFF = "handoff"  # in the sandbox's directory: a tmpfs bound read-only at HANDOFF_AT
HANDOFF_AT = "/run/sandbox-handoff"  # where the host hands the agent its socket (checkpoint.py)
AGENT_MAIN = f"{AGENT_LIB}/sandhold/agent/__main__.py"
# The agent's /proc files that its owner (the sandbox's root has the same uid) could write to
# make it the OOM killer's first choice; bwrap covers each with a read-only view of itself, taken
# from the host's procfs (so its mount names the agent's host pid, nothing else). The agent has
# one thread: /proc/1/task/1 is the only other way to them.
OOM_FILES = ("oom_score_adj", "oom_adj")
BOOT_ID = "/proc/sys/kernel/random/boot_id"
BOOT_ID_FILE = "boot_id"  # in the sandbox's handoff tmpfs: what is bound at BOOT_ID


IDENTITY_FILE = "identity.json"  # in the handoff tmpfs too: E2B's E2B_SANDBOX_* env of commands
# What bwrap mounts over in every sandbox's root, besides the template's and the spec's binds.
# It makes a missing one itself, following links: each is made a real directory first
# (make_mount_points), so a link planted in an image or a layer cannot send it onto the host.
MOUNT_POINTS = ("/proc", "/dev", "/tmp", AGENT_LIB, HANDOFF_AT)


def new_boot(handoff: Path, sandbox_id: str, template: str) -> None:
    """What a sandbox's every boot (cold, fork, warm start, after a host reboot) gets anew: a
    boot id, and the identity its agent puts in each command's env."""
    identity = {"E2B_SANDBOX": "true", "E2B_SANDBOX_ID": sandbox_id, "E2B_TEMPLATE_ID": template}
    for name, text in ((BOOT_ID_FILE, f"{uuid.uuid4()}\n"), (IDENTITY_FILE, json.dumps(identity))):
        (handoff / name).write_text(text)
        (handoff / name).chmod(0o444)


# Capabilities the agent keeps (inside the user namespace only) to start processes as `user` and
# to drop everything, bounding set included, in those processes; to bind the DNS stub of a
# sandbox with egress to 127.0.0.1:53; and to give the user the directories the file service
# makes for it where it may not write (agent/fsutil.make_parents, as E2B's envd). Its processes
# drop them all but their template's root_caps.
AGENT_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_CHOWN")


@dataclass
class Launch:
    root: Path  # the merged copy-on-write root
    ro_binds: Sequence[tuple[str, str]]
    binds: Sequence[tuple[str, str, bool]]  # host, sandbox, read_only
    run_dir: Path
    agent_lib: Path
    env: dict[str, str]
    memory_mb: int  # sizes /tmp (half) and /dev/shm (a quarter), both charged to its memory
    handoff: Path  # where the host hands the agent its socket after a checkpoint
    root_caps: Sequence[str] = ()  # what its root keeps (a build sandbox's: templates.BUILD_CAPS)
    agent_kit: bool = False  # run the agent on the host's Python (an image's root: oci.py)
    rw_dirs: Sequence[str] = ()  # writable, from the root's RW_DIRS, over a read-only bind


def bwrap_argv(
    launch: Launch,
    *,
    info_fd: int,
    block_fd: int,
    seccomp_fd: int,
    ready_fd: int,
    config_fd: int,
    socket_fd: int,
) -> list[str]:
    argv = [
        "bwrap",
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup", "--as-pid-1",
        "--uid", "0", "--gid", "0",
        "--userns-block-fd", str(block_fd), "--info-fd", str(info_fd),
        "--cap-drop", "ALL",
    ]  # fmt: skip
    for cap in (*AGENT_CAPS, *launch.root_caps):
        argv += ["--cap-add", cap]
    argv += [
        "--new-session", "--hostname", "sandbox",
        "--bind", str(launch.root), "/",
    ]  # fmt: skip
    for src, dst in launch.ro_binds:
        argv += ["--ro-bind", src, dst]
    for d in launch.rw_dirs:
        argv += ["--bind", str(launch.root / RW_DIRS / d.lstrip("/")), d]
    argv += ["--proc", "/proc"]
    for name in OOM_FILES:
        argv += [
            "--ro-bind",
            f"/proc/self/{name}",
            f"/proc/1/{name}",
            "--ro-bind",
            f"/proc/thread-self/{name}",
            f"/proc/1/task/1/{name}",
        ]
    # Its own boot id (the host's is every sandbox's), new at each boot: what tells software
    # inside that the machine rebooted (a filesystem-only pause's resume does). Kept in the
    # handoff tmpfs: mountinfo names no host path for it.
    argv += ["--ro-bind", str(launch.handoff / BOOT_ID_FILE), BOOT_ID]
    argv += [
        "--dev", "/dev",
        "--perms", "1777", "--size", str(launch.memory_mb << 19), "--tmpfs", "/tmp",
        "--perms", "1777", "--size", str(launch.memory_mb << 18), "--tmpfs", "/dev/shm",
        "--ro-bind", str(launch.agent_lib), AGENT_LIB,
        "--ro-bind", str(launch.handoff), HANDOFF_AT,
    ]  # fmt: skip
    python = ["/usr/bin/python3"]
    if launch.agent_kit:  # a root without (our) Python: the agent runs on the host's, bound in
        argv += ["--ro-bind", "/usr", KIT_USR]
        python = agent_kit_argv()
    for src, dst, ro in launch.binds:
        argv += ["--ro-bind" if ro else "--bind", src, dst]
    argv += ["--seccomp", str(seccomp_fd), "--clearenv"]
    for k, v in launch.env.items():
        argv += ["--setenv", k, v]
    argv += ["--chdir", "/", *python, "-I", "-S", AGENT_MAIN,
             "--config-fd", str(config_fd), "--socket-fd", str(socket_fd),
             "--ready-fd", str(ready_fd)]  # fmt: skip
    return argv


def root_mount_points(agent_kit: bool) -> list[str]:
    """The mount points of the runtime's own in a root (the template's binds aside)."""
    return [*MOUNT_POINTS, KIT_USR] if agent_kit else list(MOUNT_POINTS)


def make_mount_points(launch: Launch, owner: int) -> None:
    """Make every point of the root that bwrap binds or mounts over (or binds from: the
    writable dirs) a chain of real directories (a real file for a file's bind), the missing
    ones ``owner``'s, mode 0755 (bwrap would make them 0700, hiding the mounts from `user`);
    one that goes through a link is refused (safefs). Nothing in the sandbox runs meanwhile."""
    points = root_mount_points(launch.agent_kit)
    points += [f"/{RW_DIRS}/{d.lstrip('/')}" for d in launch.rw_dirs]
    files: list[str] = []
    for src, dst in [*launch.ro_binds, *((src, dst) for src, dst, _ro in launch.binds)]:
        (points if os.path.isdir(src) else files).append(dst)
    for point in points:
        safefs.make_dirs(launch.root, point, 0o755, owner)
    for point in files:
        safefs.make_file(launch.root, point, owner)


def agent_kit_argv() -> list[str]:
    """The host's Python under KIT_USR, run by the host's dynamic loader with the host's
    libraries: it needs nothing of the sandbox's root (an image's may be another libc's)."""
    python = Path(os.path.realpath("/usr/bin/python3"))
    loader = next(Path("/usr/lib").glob("*-linux-gnu/ld-linux*.so.*"), None)
    if loader is None:
        raise HostUnsupported("no dynamic loader found under /usr/lib/*-linux-gnu")

    def inside(path: Path) -> str:
        return KIT_USR + str(path).removeprefix("/usr")

    return [inside(loader), "--library-path", inside(loader.parent), inside(python)]


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


def listen(path: Path) -> socket.socket:
    """The agent's socket, bound by host root: mode 0600 in a 0700 directory, never seen inside."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))  # no umask games: other threads create files meanwhile
        os.chmod(path, 0o600)
        sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    return sock


_oom_warned = False


def protect_from_oom(pid: int) -> bool:
    """Exempt the sandbox's agent (not yet running) from the OOM killer: ``oom_score_adj`` 0 first,
    which, written with CAP_SYS_RESOURCE, is also the floor below which neither it nor anything
    it starts may go; then the legacy ``oom_adj`` -17, i.e. -1000, which leaves that floor alone.
    So user processes (500, see the agent's spawn) can never protect themselves at -1000. Without
    CAP_SYS_RESOURCE (e.g. in a container) the agent stays at 0; returns whether it is exempt."""
    global _oom_warned
    for name, value in (("oom_score_adj", b"0"), ("oom_adj", b"-17")):
        try:
            fd = os.open(f"/proc/{pid}/{name}", os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, value)
            finally:
                os.close(fd)
        except PermissionError:
            if name == "oom_adj":
                if not _oom_warned:
                    _oom_warned = True
                    log.warning(
                        "no CAP_SYS_RESOURCE: sandbox agents stay at oom_score_adj 0, "
                        "user processes at 500, instead of being exempt"
                    )
                return False
    return True


def spawn(
    launch: Launch, cgroups: Group, host_uid: int, ready_w: int, log_path: Path
) -> tuple[subprocess.Popen[bytes], int]:
    """Start the sandbox; returns bwrap's Popen and the host pid of the sandbox's init (its
    agent). ``launch.run_dir`` holds ``agent.json`` and gets the agent's socket."""
    make_mount_points(launch, host_uid)
    sock = listen(launch.run_dir / "agent.sock")
    try:
        config = os.open(launch.run_dir / "agent.json", os.O_RDONLY | os.O_CLOEXEC)
    except BaseException:
        sock.close()
        raise
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    seccomp = filter_fd()
    argv = bwrap_argv(
        launch,
        info_fd=info_w,
        block_fd=block_r,
        seccomp_fd=seccomp,
        ready_fd=ready_w,
        config_fd=config,
        socket_fd=sock.fileno(),
    )

    # Before bwrap creates the cgroup namespace, its process must be in the sandbox's cgroups
    # (so the sandbox sees its own group as the root, not the host's paths) and be the
    # unprivileged owner of the sandbox's user namespace. A shell joins the cgroups, setpriv
    # drops to host_uid, both exec in place (same pid); unlike a Python preexec_fn this lets
    # Popen vfork, which saved ~5 ms per create.
    procs = cgroups.procs_files()
    setpriv = [SETPRIV, f"--reuid={host_uid}", f"--regid={host_uid}", "--clear-groups", "--"]
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", JOIN_AND_EXEC, "sh", *procs, "--", *setpriv, *argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=(info_w, block_r, seccomp, ready_w, config, sock.fileno()),
            start_new_session=True,  # survives the server: no shared session or signals
        )
    finally:
        for fd in (info_w, block_r, seccomp, log, config):
            os.close(fd)
        sock.close()  # the agent has its own copy
    try:
        child = int(_read_info(info_r, 5.0)["child-pid"])
        mapping = f"0 {host_uid} {ID_RANGE}\n"
        with open(f"/proc/{child}/uid_map", "w") as f:
            f.write(mapping)
        with open(f"/proc/{child}/gid_map", "w") as f:
            f.write(mapping)
        protect_from_oom(child)  # before it runs anything: what it starts inherits the floor
        os.write(block_w, b"1")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        os.close(info_r)
        os.close(block_w)
    return proc, child
