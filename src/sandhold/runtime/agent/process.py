"""``process.Process``: start commands (pipes or a PTY), stream their output, feed their input,
signal and resize them.

Semantics follow envd: a process outlives the stream that started it (a client that goes away
only stops receiving), output with nobody attached is dropped, ``Connect`` attaches to future
output, the end event carries Go's ``ProcessState`` view of the exit ("exit status 1",
"signal: killed"), and ``Connect-Timeout-Ms`` on ``Start`` kills the command when it expires.
Each command leads its own session and process group; signals go to the whole group.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import logging
import os
import signal
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from .config import AgentConfig
from .connect import Call
from .rpc import (
    Message,
    RpcError,
    b64,
    get,
    get_bytes,
    get_enum,
    get_int,
    get_str,
)
from .users import (
    User,
    UserError,
    can_switch,
    check_can_act_as,
    effective_uid,
    fs_identity,
    group_ids,
    lookup_user,
)
from .users import resolve_path as _resolve_path

log = logging.getLogger("sandhold.agent")

STD_CHUNK = 32 << 10
PTY_CHUNK = 16 << 10
SUBSCRIBER_QUEUE = 64  # events buffered per attached stream before the process is held back
DRAIN_AFTER_EXIT = 64  # reads of leftover output once the process is gone
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
OOM_SCORE_ADJ = b"500"
# The command dies this long after its Connect-Timeout-Ms: the stream has ended with
# deadline_exceeded by then (the SDK's TimeoutException), as envd's request deadline, set when
# the request arrived, also fires before the command's own.
TIMEOUT_KILL_GRACE = 0.5

SIGNALS = {"SIGNAL_UNSPECIFIED": 0, "SIGNAL_SIGTERM": 15, "SIGNAL_SIGKILL": 9}

# Go's syscall.Signal.String() on Linux, which envd's end event status uses.
_GO_SIGNAL_NAMES = {
    1: "hangup", 2: "interrupt", 3: "quit", 4: "illegal instruction",
    5: "trace/breakpoint trap", 6: "aborted", 7: "bus error", 8: "floating point exception",
    9: "killed", 10: "user defined signal 1", 11: "segmentation fault",
    12: "user defined signal 2", 13: "broken pipe", 14: "alarm clock", 15: "terminated",
    16: "stack fault", 17: "child exited", 18: "continued", 19: "stopped (signal)",
    20: "stopped", 21: "stopped (tty input)", 22: "stopped (tty output)",
    23: "urgent I/O condition", 24: "CPU time limit exceeded", 25: "file size limit exceeded",
    26: "virtual timer expired", 27: "profiling timer expired", 28: "window changed",
    29: "I/O possible", 30: "power failure", 31: "bad system call",
}  # fmt: skip


def end_event(status: int) -> Message:
    """The EndEvent for a wait status, as Go's ProcessState reports it."""
    if os.WIFEXITED(status):
        code, exited = os.WEXITSTATUS(status), True
        text = f"exit status {code}"
    elif os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        code, exited = -1, False
        text = "signal: " + _GO_SIGNAL_NAMES.get(sig, f"signal {sig}")
        if os.WCOREDUMP(status):
            text += " (core dumped)"
    else:
        code, exited, text = -1, False, f"status {status}"
    event: Message = {"exitCode": code, "exited": exited, "status": text}
    if code != 0:
        event["error"] = text  # exec.Cmd.Wait's error for an unsuccessful exit
    return event


def _go_errno(e: OSError) -> str:
    text = e.strerror or str(e)
    return text[:1].lower() + text[1:]


class _Subscriber:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[Message] = asyncio.Queue(SUBSCRIBER_QUEUE)
        self.closed = False

    async def put(self, item: Message) -> None:
        if not self.closed:
            await self.queue.put(item)

    def close(self) -> None:
        # Emptying the queue releases a producer blocked on this (now gone) subscriber.
        self.closed = True
        while not self.queue.empty():
            self.queue.get_nowait()


class Process:
    def __init__(
        self,
        manager: ProcessManager,
        pid: int,
        config: Message,
        tag: str | None,
        outputs: list[tuple[int, str]],
        stdin_fd: int | None,
        pty_fd: int | None,
        uid: int,
    ) -> None:
        self.manager = manager
        self.pid = pid
        self.uid = uid
        self.config = config
        self.tag = tag
        self._outputs = outputs
        self.stdin_fd = stdin_fd
        self.pty_fd = pty_fd
        self.status: int | None = None
        self.end: Message | None = None
        self._subscribers: set[_Subscriber] = set()
        self._waiters: set[asyncio.Future[None]] = set()
        self._input_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[Any]] = []
        self._timeout: asyncio.TimerHandle | None = None
        self._exited = asyncio.Event()

    # -- lifecycle ------------------------------------------------------------------------------
    def begin(self, timeout: float | None) -> None:
        """Start moving output; call after the starting stream has subscribed."""
        for fd, kind in self._outputs:
            os.set_blocking(fd, False)
            self._tasks.append(asyncio.ensure_future(self._pump(fd, kind)))
        self._tasks.append(asyncio.ensure_future(self._finish()))
        if timeout:
            loop = asyncio.get_running_loop()
            self._timeout = loop.call_later(timeout + TIMEOUT_KILL_GRACE, self._kill_on_timeout)

    def on_exit(self, status: int) -> None:
        self.status = status
        self._exited.set()
        if self._timeout is not None:
            self._timeout.cancel()
        self._wake()

    def _kill_on_timeout(self) -> None:
        if self.status is None:
            self.signal(signal.SIGKILL)

    async def _finish(self) -> None:
        await self._exited.wait()
        await asyncio.gather(*self._tasks[: len(self._outputs)], return_exceptions=True)
        for fd in (self.stdin_fd, self.pty_fd):
            if fd is not None:
                _close(fd)
        self.stdin_fd = self.pty_fd = None
        assert self.status is not None
        self.end = end_event(self.status)
        for sub in list(self._subscribers):
            await sub.put({"end": self.end})
        self.manager.forget(self)

    # -- output ---------------------------------------------------------------------------------
    async def _pump(self, fd: int, kind: str) -> None:
        chunk = PTY_CHUNK if kind == "pty" else STD_CHUNK
        budget = DRAIN_AFTER_EXIT
        try:
            while True:
                try:
                    data = os.read(fd, chunk)
                except BlockingIOError:
                    if self._exited.is_set():
                        break  # the process is gone and so is what it wrote
                    await self._wait_fd(fd, write=False)
                    continue
                except OSError:
                    break  # EIO: the PTY's last slave descriptor closed
                if not data:
                    break
                await self._broadcast({"data": {kind: b64(data)}})
                if self._exited.is_set():
                    budget -= 1
                    if budget <= 0:
                        break  # something the process left behind keeps writing
        finally:
            if fd != self.pty_fd:
                _close(fd)

    async def _broadcast(self, event: Message) -> None:
        for sub in list(self._subscribers):
            await sub.put(event)

    def subscribe(self) -> _Subscriber:
        sub = _Subscriber()
        if self.end is not None:
            sub.queue.put_nowait({"end": self.end})  # attached just as it finished
        else:
            self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: _Subscriber) -> None:
        self._subscribers.discard(sub)
        sub.close()

    async def follow(self, sub: _Subscriber, keepalive: float) -> AsyncIterator[Message]:
        """Events for one stream: data, then end; keepalives while nothing happens."""
        while True:
            try:
                item = await asyncio.wait_for(sub.queue.get(), keepalive)
            except TimeoutError:
                yield {"event": {"keepalive": {}}}
                continue
            yield {"event": item}
            if "end" in item:
                return

    # -- fd readiness ---------------------------------------------------------------------------
    async def _wait_fd(self, fd: int, write: bool) -> None:
        await wait_fd(fd, write, self._waiters)

    def _wake(self) -> None:
        for fut in list(self._waiters):
            if not fut.done():
                fut.set_result(None)

    # -- input, signals, resize -----------------------------------------------------------------
    async def _write_all(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(fd, view)
            except BlockingIOError:
                if self.status is not None:
                    raise OSError(errno.EPIPE, "process exited") from None
                await self._wait_fd(fd, write=True)
                continue
            view = view[n:]

    async def write_stdin(self, data: bytes) -> None:
        if self.pty_fd is not None:
            raise RpcError(
                "internal",
                "error writing to stdin: tty assigned to process — input should be written "
                "to the pty, not the stdin",
            )
        async with self._input_lock:
            if self.stdin_fd is None:
                raise RpcError("internal", "error writing to stdin: stdin not enabled or closed")
            try:
                await self._write_all(self.stdin_fd, data)
            except OSError as e:
                raise RpcError(
                    "internal",
                    f"error writing to stdin: error writing to stdin of process '{self.pid}': "
                    f"{_go_errno(e)}",
                ) from None

    async def write_pty(self, data: bytes) -> None:
        async with self._input_lock:
            if self.pty_fd is None:
                raise RpcError(
                    "internal",
                    "error writing to tty: tty not assigned to process — input should be "
                    "written to the stdin, not the tty",
                )
            try:
                await self._write_all(self.pty_fd, data)
            except OSError as e:
                raise RpcError(
                    "internal",
                    f"error writing to tty: error writing to tty of process '{self.pid}': "
                    f"{_go_errno(e)}",
                ) from None

    async def close_stdin(self) -> None:
        if self.pty_fd is not None:
            raise RpcError(
                "unknown",
                "error closing stdin: cannot close stdin for PTY process — send Ctrl+D (0x04) "
                "instead",
            )
        async with self._input_lock:  # after any write in flight, keeping order with it
            if self.stdin_fd is not None:
                _close(self.stdin_fd)
                self.stdin_fd = None

    def signal(self, sig: int) -> None:
        try:
            with effective_uid(self.uid):
                try:
                    os.killpg(self.pid, sig)
                except ProcessLookupError:
                    os.kill(self.pid, sig)  # it left its group; still signal the process
        except ProcessLookupError:
            pass
        except PermissionError as e:
            raise RpcError("internal", f"error sending signal: {_go_errno(e)}") from None

    def resize(self, cols: int, rows: int) -> None:
        if self.pty_fd is None:
            raise RpcError("internal", "error resizing tty: tty not assigned to process")
        _set_winsize(self.pty_fd, cols, rows)

    def info(self) -> Message:
        out: Message = {"config": self.config, "pid": self.pid}
        if self.tag is not None:
            out["tag"] = self.tag
        return out


async def wait_fd(fd: int, write: bool, waiters: set[asyncio.Future[None]] | None = None) -> None:
    """Until ``fd`` is readable (or writable); ``waiters`` lets an owner wake it early."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, ready)
    if waiters is not None:
        waiters.add(fut)
    try:
        await fut
    finally:
        if waiters is not None:
            waiters.discard(fut)
        (loop.remove_writer if write else loop.remove_reader)(fd)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _set_winsize(fd: int, cols: int, rows: int) -> None:
    import fcntl
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


# -- spawning ---------------------------------------------------------------------------------


class _SpawnSpec:
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


def _child(spec: _SpawnSpec, fds: dict[str, int], errpipe: int, max_fd: int) -> None:
    """Runs in the forked child; never returns. Failures go up ``errpipe`` before exiting."""
    stage = "setup"
    try:
        signal.set_wakeup_fd(-1)  # the parent's event loop must not hear our signals
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
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

            libc.drop_all_capabilities()
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
                libc.clear_capability_sets()
            except OSError:
                pass
        stage = "chdir"
        os.chdir(spec.cwd)
        stage = "exec"
        os.execvpe(spec.argv[0], spec.argv, spec.env)
    except BaseException as e:
        code = getattr(e, "errno", 0) or 0
        text = _go_errno(e) if isinstance(e, OSError) else str(e)
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


class ProcessManager:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.processes: dict[int, Process] = {}
        self._exit_callbacks: dict[int, Callable[[int], None]] = {}
        self._max_fd = 1 << 16
        try:
            self._max_fd = max(int(os.sysconf("SC_OPEN_MAX")), 256)
        except (ValueError, OSError):
            pass

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.add_signal_handler(signal.SIGCHLD, self._reap)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            callback = self._exit_callbacks.pop(pid, None)
            if callback is not None:
                callback(status)

    def forget(self, proc: Process) -> None:
        if self.processes.get(proc.pid) is proc:
            del self.processes[proc.pid]

    def kill_all(self) -> None:
        for proc in list(self.processes.values()):
            if proc.status is None:
                proc.signal(signal.SIGKILL)

    def select(self, selector: Message | None) -> Process:
        if selector and "pid" in selector:
            pid = get_int(selector, "pid")
            proc = self.processes.get(pid)
            if proc is None:
                raise RpcError("not_found", f"process with pid {pid} not found")
            return proc
        if selector and "tag" in selector:
            tag = get_str(selector, "tag")
            for proc in self.processes.values():
                if proc.tag == tag:
                    return proc
            raise RpcError("not_found", f"process with tag {tag} not found")
        raise RpcError("unimplemented", "invalid input type <nil>")

    async def spawn(
        self,
        spec: _SpawnSpec,
        config: Message,
        tag: str | None,
    ) -> Process:
        if can_switch():
            from . import libc  # noqa: F401  loaded before the fork; the child only calls it

        fds: dict[str, int] = {}
        parent_fds: list[int] = []
        child_fds: list[int] = []
        outputs: list[tuple[int, str]] = []
        stdin_fd: int | None = None
        pty_fd: int | None = None
        try:
            if spec.pty_size is not None:
                master, slave = os.openpty()
                cols, rows = spec.pty_size
                _set_winsize(master, cols, rows)
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
                _close(fd)
            raise RpcError("internal", f"error creating pipes: {_go_errno(e)}") from None

        proc_box: list[Process] = []
        early_status: list[int] = []

        def exited(status: int) -> None:
            if proc_box:
                proc_box[0].on_exit(status)
            else:
                early_status.append(status)

        try:
            pid = os.fork()
        except OSError as e:
            for fd in parent_fds + child_fds:
                _close(fd)
            raise RpcError(
                "resource_exhausted" if e.errno == errno.EAGAIN else "internal",
                f"error starting process '{' '.join(spec.argv)}': fork/exec {spec.argv[0]}: "
                f"{_go_errno(e)}",
            ) from None
        if pid == 0:  # pragma: no cover - child
            _child(spec, fds, err_w, self._max_fd)
        # Registered before any await, so an instant exit is not reaped unseen.
        self._exit_callbacks[pid] = exited
        for fd in child_fds:
            _close(fd)
        try:
            failure = await _read_to_eof(err_r)
        finally:
            _close(err_r)
        if failure:
            for fd in parent_fds:
                if fd != err_r:
                    _close(fd)
            stage, _, rest = failure.decode(errors="replace").partition("\0")
            _, _, text = rest.partition("\0")
            usercmd = " ".join(spec.argv)
            if stage == "exec":
                detail = f"fork/exec {spec.argv[0]}: {text}"
            elif stage == "chdir":
                detail = f"chdir {spec.cwd}: {text}"
            else:
                detail = f"{stage}: {text}"
            raise RpcError("invalid_argument", f"error starting process '{usercmd}': {detail}")
        proc = Process(self, pid, config, tag, outputs, stdin_fd, pty_fd, spec.user.uid)
        proc_box.append(proc)
        if early_status:
            proc.on_exit(early_status[0])
        self.processes[pid] = proc
        return proc


def _drop_subscription(task: asyncio.Task[tuple[Process, _Subscriber]]) -> None:
    if not task.cancelled() and task.exception() is None:
        proc, sub = task.result()
        proc.unsubscribe(sub)


class ProcessService:
    def __init__(self, config: AgentConfig, manager: ProcessManager) -> None:
        self.config = config
        self.manager = manager
        self._service_tasks: set[asyncio.Task[None]] = set()

    def _spec(self, msg: Message, user: User) -> tuple[_SpawnSpec, Message]:
        proc_cfg = get(msg, "process") or {}
        if not isinstance(proc_cfg, dict):
            raise RpcError("invalid_argument", "process must be an object")
        cmd = get_str(proc_cfg, "cmd")
        if not cmd:
            raise RpcError("invalid_argument", "process.cmd is required")
        args = get(proc_cfg, "args") or []
        envs = get(proc_cfg, "envs") or {}
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise RpcError("invalid_argument", "process.args must be a list of strings")
        if not isinstance(envs, dict):
            raise RpcError("invalid_argument", "process.envs must be a map")
        envs = {str(k): str(v) for k, v in envs.items()}
        cwd_req = get(proc_cfg, "cwd")

        try:
            cwd = _resolve_path(cwd_req or "", user, self.config.default_workdir)
        except ValueError as e:
            raise RpcError("invalid_argument", str(e)) from None
        try:
            check_can_act_as(user)
        except UserError as e:
            raise RpcError("permission_denied", str(e)) from None
        try:
            with fs_identity(user):
                os.stat(cwd)
        except FileNotFoundError:
            raise RpcError("invalid_argument", f"cwd '{cwd}' does not exist") from None
        except OSError:
            pass  # the child's chdir reports anything else

        env = {
            "PATH": os.environ.get("PATH") or DEFAULT_PATH,
            "HOME": user.home,
            "USER": user.name,
            "LOGNAME": user.name,
            "SHELL": user.shell or "/bin/sh",
        }
        env.update(self.config.env)
        env.update(envs)

        pty = get(msg, "pty")
        pty_size: tuple[int, int] | None = None
        if pty is not None:
            size = get(pty, "size") or {}
            cols, rows = get_int(size, "cols"), get_int(size, "rows")
            pty_size = (cols or 80, rows or 24)
            env.setdefault("TERM", "xterm-256color")
        stdin = get(msg, "stdin")
        spec = _SpawnSpec(
            [cmd, *args], env, cwd, user, pty_size, True if stdin is None else bool(stdin)
        )
        config: Message = {"cmd": cmd, "args": args, "envs": envs}
        if cwd_req is not None:
            config["cwd"] = cwd_req
        return spec, config

    # -- services -------------------------------------------------------------------------------
    async def start_services(self, services: list[dict[str, Any]]) -> None:
        """Start the configured services and keep them running; one failing does not stop the
        others, and one that ends is started again after a growing delay (0.5 s up to 30 s)."""
        for svc in services:
            self._service_tasks.add(asyncio.ensure_future(self._supervise(svc)))

    async def _spawn_service(self, svc: dict[str, Any], name: str) -> Process:
        user = lookup_user(str(svc.get("user") or self.config.default_user))
        if user is None:
            raise RpcError("unauthenticated", f"invalid username: '{svc.get('user')}'")
        process: Message = {
            "cmd": svc["argv"][0],
            "args": svc["argv"][1:],
            "envs": svc.get("env") or {},
        }
        if svc.get("cwd"):
            process["cwd"] = svc["cwd"]
        spec, config = self._spec({"process": process, "stdin": False}, user)
        return await self.manager.spawn(spec, config, name)

    async def _supervise(self, svc: dict[str, Any]) -> None:
        name = str(svc.get("name") or svc["argv"][0])
        delay = 0.5
        while True:
            try:
                proc = await self._spawn_service(svc, name)
            except RpcError as e:
                log.error("service %s did not start: %s", name, e.message)
                return  # a configuration error: retrying would not help
            sub = proc.subscribe()
            proc.begin(None)
            log.info("service %s started, pid %d", name, proc.pid)
            started = time.monotonic()
            tail = b""
            try:
                while True:
                    item = await sub.queue.get()
                    if "end" in item:
                        text = tail.decode(errors="replace").strip()
                        log.warning("service %s ended (%s): %s", name, item["end"]["status"], text)
                        break
                    for data in item["data"].values():
                        tail = (tail + base64.b64decode(data))[-2000:]
            finally:
                proc.unsubscribe(sub)
            delay = 0.5 if time.monotonic() - started > 60 else min(delay * 2, 30.0)
            await asyncio.sleep(delay)

    # -- streams --------------------------------------------------------------------------------
    async def start(self, msg: Message, call: Call) -> AsyncGenerator[Message, None]:
        spec, config = self._spec(msg, call.user)
        tag = get(msg, "tag")

        async def launch() -> tuple[Process, _Subscriber]:
            proc = await self.manager.spawn(spec, config, str(tag) if tag is not None else None)
            sub = proc.subscribe()  # before any output moves, so none is missed
            proc.begin(call.timeout)
            return proc, sub

        # Once forked, the command must end up managed even if this client goes away now.
        task = asyncio.ensure_future(launch())
        try:
            proc, sub = await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(_drop_subscription)
            raise
        try:
            yield {"event": {"start": {"pid": proc.pid}}}
            async for event in proc.follow(sub, call.keepalive_interval):
                yield event
        finally:
            proc.unsubscribe(sub)

    async def connect(self, msg: Message, call: Call) -> AsyncGenerator[Message, None]:
        proc = self.manager.select(get(msg, "process"))
        sub = proc.subscribe()
        try:
            yield {"event": {"start": {"pid": proc.pid}}}
            async for event in proc.follow(sub, call.keepalive_interval):
                yield event
        finally:
            proc.unsubscribe(sub)

    # -- unary ----------------------------------------------------------------------------------
    async def list(self, msg: Message, call: Call) -> Message:
        return {"processes": [p.info() for p in self.manager.processes.values()]}

    async def _input(self, proc: Process, data: Message | None) -> None:
        if data and "stdin" in data:
            await proc.write_stdin(get_bytes(data, "stdin"))
        elif data and "pty" in data:
            await proc.write_pty(get_bytes(data, "pty"))
        else:
            raise RpcError("unimplemented", "invalid input type <nil>")

    async def send_input(self, msg: Message, call: Call) -> Message:
        proc = self.manager.select(get(msg, "process"))
        await self._input(proc, get(msg, "input"))
        return {}

    async def stream_input(self, messages: AsyncIterator[Message], call: Call) -> Message:
        proc: Process | None = None
        async for msg in messages:
            if "start" in msg:
                proc = self.manager.select(get(get(msg, "start"), "process"))
            elif "data" in msg:
                if proc is None:
                    raise RpcError("failed_precondition", "data sent before the start event")
                await self._input(proc, get(get(msg, "data"), "input"))
            elif "keepalive" in msg:
                continue
            else:
                raise RpcError("unimplemented", "invalid event type <nil>")
        return {}

    async def send_signal(self, msg: Message, call: Call) -> Message:
        proc = self.manager.select(get(msg, "process"))
        sig = get_enum(msg, "signal", SIGNALS)
        if sig not in (signal.SIGKILL, signal.SIGTERM):
            name = next((k for k, v in SIGNALS.items() if v == sig), str(sig))
            raise RpcError("unimplemented", f"invalid signal: {name}")
        proc.signal(sig)
        return {}

    async def close_stdin(self, msg: Message, call: Call) -> Message:
        await self.manager.select(get(msg, "process")).close_stdin()
        return {}

    async def update(self, msg: Message, call: Call) -> Message:
        proc = self.manager.select(get(msg, "process"))
        pty = get(msg, "pty")
        if pty is not None:
            size = get(pty, "size") or {}
            try:
                proc.resize(get_int(size, "cols"), get_int(size, "rows"))
            except OSError as e:
                raise RpcError("internal", f"error resizing tty: {_go_errno(e)}") from None
        return {}
