"""Starting a command: pipes or a PTY, fork, and in the child a new session, the descriptors,
the privilege drop (capabilities, groups, uid) and exec.

The child reports a failure (its stage and errno text) up a close-on-exec pipe, so the parent
knows whether exec happened before it returns: a command that cannot start is an RPC error, as
in envd, not a process that exits 127. Also the descriptor helpers running processes share.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable

from .aio import wait_fd
from .rpc import RpcError
from .users import User, can_switch, group_ids

OOM_SCORE_ADJ = b"500"
HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandhold-spawn")
# A command starts with every signal at its default, whatever the agent inherited or set: an
# ignored signal stays ignored across exec (Python ignores SIGPIPE and SIGXFSZ; a server started
# in the background by a shell ignores SIGINT and SIGQUIT, and bwrap passes that on).
DEFAULT_SIGNALS = tuple(sorted(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}))
# The compiled one-step spawn (native.c), if it was built for this Python. Loaded with the
# agent, not at its first command (~0.6 ms of a pooled sandbox's first command here; 0.01 MiB
# per idle agent).
try:
    from ._native import spawn as _native_spawn  # type: ignore[import-not-found]
except ImportError:
    _native_spawn = None
_ext_spawn: Callable[..., int] | None = _native_spawn


def go_errno(e: OSError) -> str:
    text = e.strerror or str(e)
    return text[:1].lower() + text[1:]


def close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def set_winsize(fd: int, cols: int, rows: int) -> None:
    import fcntl
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class SpawnSpec:
    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        user: User,
        pty_size: tuple[int, int] | None,
        stdin: bool,
    ) -> None:
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.user = user
        self.groups = group_ids(user)  # read here: the child should only make syscalls
        self.pty_size = pty_size
        self.stdin = stdin
        self.root_caps: frozenset[int] = frozenset()  # what a root process keeps (a build's)
        self.stdio: tuple[int, int, int] | None = None  # given descriptors instead of pipes


class Spawned:
    """A started command's pid and the parent's ends of its descriptors."""

    def __init__(
        self,
        pid: int,
        outputs: list[tuple[int, str]],
        stdin_fd: int | None,
        pty_fd: int | None,
    ) -> None:
        self.pid = pid
        self.outputs = outputs
        self.stdin_fd = stdin_fd
        self.pty_fd = pty_fd


async def start_child(spec: SpawnSpec, max_fd: int, on_fork: Callable[[int], None]) -> Spawned:
    """Fork and exec ``spec``; ``on_fork(pid)`` runs in the parent right after the fork, before
    any await, so the caller can be ready for an exit that comes at once."""
    ext = _ext_spawn
    helper = ext is None and os.path.exists(HELPER)
    if can_switch() and ext is None and not helper:
        from . import libc  # noqa: F401  loaded before the fork; the child only calls it

    fds: dict[str, int] = {}
    parent_fds: list[int] = []
    child_fds: list[int] = []
    outputs: list[tuple[int, str]] = []
    stdin_fd: int | None = None
    pty_fd: int | None = None
    try:
        if spec.stdio is not None:  # sudo.py: the caller's own stdin, stdout and stderr
            fds["stdin"], fds["stdout"], fds["stderr"] = spec.stdio
        elif spec.pty_size is not None:
            master, slave = os.openpty()
            cols, rows = spec.pty_size
            set_winsize(master, cols, rows)
            fds["slave"] = slave
            parent_fds.append(master)
            child_fds.append(slave)
            pty_fd = master
            outputs.append((master, "pty"))
        else:
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            parent_fds += [out_r, err_r]
            child_fds += [out_w, err_w]
            fds["stdout"], fds["stderr"] = out_w, err_w
            outputs += [(out_r, "stdout"), (err_r, "stderr")]
            if spec.stdin:
                in_r, in_w = os.pipe()
                parent_fds.append(in_w)
                child_fds.append(in_r)
                fds["stdin"] = in_r
                stdin_fd = in_w
            else:
                fds["stdin"] = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                child_fds.append(fds["stdin"])
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        child_fds.append(err_w)
        parent_fds.append(err_r)
    except OSError as e:
        for fd in parent_fds + child_fds:
            close_fd(fd)
        raise RpcError("internal", f"error creating pipes: {go_errno(e)}") from None

    try:
        if ext is not None:
            pid = _spawn_in_one_step(ext, spec, fds, err_w)
        else:
            pid = _spawn(spec, fds, err_w) if helper else os.fork()
    except OSError as e:
        for fd in parent_fds + child_fds:
            close_fd(fd)
        raise RpcError(
            "resource_exhausted" if e.errno == errno.EAGAIN else "internal",
            f"error starting process '{' '.join(spec.argv)}': fork/exec {spec.argv[0]}: "
            f"{go_errno(e)}",
        ) from None
    if pid == 0:  # pragma: no cover - child
        _run_in_child(spec, fds, err_w, max_fd)
    on_fork(pid)
    for fd in child_fds:
        close_fd(fd)
    try:
        failure = await _read_to_eof(err_r)
    finally:
        close_fd(err_r)
    if failure:
        for fd in parent_fds:
            if fd != err_r:
                close_fd(fd)
        stage, _, rest = failure.decode(errors="replace").partition("\0")
        code, _, text = rest.partition("\0")
        if not text and code.isdigit():  # the compiled children send the errno alone
            text = os.strerror(int(code))
        text = text[:1].lower() + text[1:]  # strerror's words, as go_errno puts them
        usercmd = " ".join(spec.argv)
        if stage == "exec":
            detail = f"fork/exec {spec.argv[0]}: {text}"
        elif stage == "chdir":
            detail = f"chdir {spec.cwd}: {text}"
        else:
            detail = f"{stage}: {text}"
        raise RpcError("invalid_argument", f"error starting process '{usercmd}': {detail}")
    return Spawned(pid, outputs, stdin_fd, pty_fd)


def _spawn_in_one_step(
    ext: Callable[..., int], spec: SpawnSpec, fds: dict[str, int], err_w: int
) -> int:
    """The child through the extension: a vfork-style clone that drops privileges and execs
    the command itself, one exec instead of the helper's two."""
    user = spec.user
    keep = spec.root_caps if user.uid == 0 else frozenset()
    tty = "slave" in fds
    std = (fds["slave"],) * 3 if tty else (fds["stdin"], fds["stdout"], fds["stderr"])
    env = []
    for k, v in spec.env.items():
        if not k or "=" in k:
            raise ValueError("illegal environment variable name")  # as os.posix_spawn says
        env.append(f"{k}={v}")
    return ext(
        spec.argv[0],
        spec.argv,
        env,
        std,
        err_w,
        can_switch(),
        user.uid,
        user.gid,
        spec.groups,
        sum(1 << c for c in keep),
        tty,
        spec.cwd,
    )


def _spawn(spec: SpawnSpec, fds: dict[str, int], err_w: int) -> int:
    """The child through the helper (spawn_helper.c), started by posix_spawn: a vfork, so the
    agent's memory is neither copied nor made copy-on-write."""
    user = spec.user
    switch = can_switch()
    keep = spec.root_caps if user.uid == 0 else frozenset()
    argv = [
        HELPER,
        "1" if switch else "0",
        str(user.uid),
        str(user.gid),
        ",".join(map(str, spec.groups)) or "-",
        f"{sum(1 << c for c in keep):x}",
        "1" if "slave" in fds else "0",
        spec.cwd,
        "--",
        *spec.argv,
    ]
    std = [fds["slave"]] * 3 if "slave" in fds else [fds["stdin"], fds["stdout"], fds["stderr"]]
    actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(std)]
    actions.append((os.POSIX_SPAWN_DUP2, err_w, 3))  # last: a source may have been fd 3
    return os.posix_spawn(
        HELPER,
        argv,
        spec.env,
        file_actions=actions,
        setsid=True,
        setsigmask=(),
        setsigdef=DEFAULT_SIGNALS,
    )


def _run_in_child(spec: SpawnSpec, fds: dict[str, int], errpipe: int, max_fd: int) -> None:
    """Runs in the forked child; never returns. Failures go up ``errpipe`` before exiting."""
    stage = "setup"
    try:
        signal.set_wakeup_fd(-1)  # the parent's event loop must not hear our signals
        for sig in DEFAULT_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        os.setsid()
        if "slave" in fds:
            import fcntl
            import termios

            fcntl.ioctl(fds["slave"], termios.TIOCSCTTY, 0)
            for target in (0, 1, 2):
                os.dup2(fds["slave"], target)
        else:
            os.dup2(fds["stdin"], 0)
            os.dup2(fds["stdout"], 1)
            os.dup2(fds["stderr"], 2)
        os.closerange(3, errpipe)
        os.closerange(errpipe + 1, max_fd)
        try:
            fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
            os.write(fd, OOM_SCORE_ADJ)  # the OOM killer should pick commands, not the agent
            os.close(fd)
        except OSError:
            pass
        user = spec.user
        if can_switch():
            from . import libc

            keep = spec.root_caps if user.uid == 0 else frozenset()
            libc.drop_all_capabilities(keep)
            if (os.getuid(), os.getgid()) != (user.uid, user.gid):
                stage = "setgroups"
                try:
                    os.setgroups(spec.groups)
                except PermissionError:
                    pass  # setgroups is denied in this user namespace: keep what we have
                stage = "setgid"
                os.setresgid(user.gid, user.gid, user.gid)
                stage = "setuid"
                os.setresuid(user.uid, user.uid, user.uid)
            try:
                libc.clear_capability_sets(keep)
            except OSError:
                pass
        stage = "chdir"
        os.chdir(spec.cwd)
        stage = "exec"
        os.execvpe(spec.argv[0], spec.argv, spec.env)
    except BaseException as e:
        code = getattr(e, "errno", 0) or 0
        text = go_errno(e) if isinstance(e, OSError) else str(e)
        try:
            os.write(errpipe, f"{stage}\0{code}\0{text}".encode(errors="replace"))
        except BaseException:
            pass
    finally:
        os._exit(127)


async def _read_to_eof(fd: int) -> bytes:
    os.set_blocking(fd, False)
    out = bytearray()
    while True:
        try:
            data = os.read(fd, 4096)
        except BlockingIOError:
            await wait_fd(fd, write=False)
            continue
        if not data:
            return bytes(out)
        out += data
