"""The running commands: ``Process`` (one command's output fan-out, input, signals, resize and
end event) and ``ProcessManager`` (the table by pid, SIGCHLD reaping).

Semantics follow envd: a process outlives the stream that started it (a client that goes away
only stops receiving), output with nobody attached is dropped, ``Connect`` attaches to future
output, and the end event carries Go's ``ProcessState`` view of the exit ("exit status 1",
"signal: killed"). Each command leads its own session and process group; signals go to the
whole group.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

from . import aio, log
from .config import AgentConfig
from .exit_status import end_event
from .rpc import Message, RpcError, b64, get_int, get_str
from .spawn import SpawnSpec, close_fd, go_errno, set_winsize, start_child
from .users import effective_uid

STD_CHUNK = 32 << 10
PTY_CHUNK = 16 << 10
SUBSCRIBER_QUEUE = 64  # events buffered per attached stream before the process is held back
DRAIN_AFTER_EXIT = 64  # reads of leftover output once the process is gone
# The command dies this long after its Connect-Timeout-Ms: the stream has ended with
# deadline_exceeded by then (the SDK's TimeoutException), as envd's request deadline, set when
# the request arrived, also fires before the command's own.
TIMEOUT_KILL_GRACE = 0.5


class Subscriber:
    """One attached stream's events; a full queue holds the process's output back."""

    def __init__(self) -> None:
        self.queue: aio.Queue[Message] = aio.Queue(SUBSCRIBER_QUEUE)
        self.closed = False

    async def put(self, item: Message) -> None:
        if not self.closed:
            await self.queue.put(item)

    def close(self) -> None:
        # Emptying the queue releases a producer blocked on this (now gone) subscriber.
        self.closed = True
        while not self.queue.empty():
            self.queue.get_nowait()


COMMAND_SHOWN = 300  # characters of a command line in the log


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
        self._subscribers: set[Subscriber] = set()
        self._waiters: set[aio.Future[None]] = set()
        self._input_lock = aio.Lock()
        self._tasks: list[aio.Task[Any]] = []
        self._timeout: aio.TimerHandle | None = None
        self._exited = aio.Event()

    # -- lifecycle ------------------------------------------------------------------------------
    def begin(self, timeout: float | None) -> None:
        """Start moving output; call after the starting stream has subscribed."""
        for fd, kind in self._outputs:
            os.set_blocking(fd, False)
            self._tasks.append(aio.ensure_future(self._pump(fd, kind)))
        self._tasks.append(aio.ensure_future(self._finish()))
        if timeout:
            loop = aio.get_running_loop()
            self._timeout = loop.call_later(timeout + TIMEOUT_KILL_GRACE, self._kill_on_timeout)

    def on_exit(self, status: int) -> None:
        self.status = status
        log.info("process %d ended: %s", self.pid, end_event(status)["status"])
        self._exited.set()
        if self._timeout is not None:
            self._timeout.cancel()
        self._wake()

    async def gone(self, within: float) -> None:
        """Return once the process has exited and been reaped (its pid no longer names it),
        or after ``within`` seconds."""
        with contextlib.suppress(TimeoutError):
            await aio.wait_for(self._exited.wait(), within)

    def _kill_on_timeout(self) -> None:
        if self.status is None:
            self.signal(signal.SIGKILL)

    async def _finish(self) -> None:
        await self._exited.wait()
        await aio.gather(*self._tasks[: len(self._outputs)], return_exceptions=True)
        for fd in (self.stdin_fd, self.pty_fd):
            if fd is not None:
                close_fd(fd)
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
                close_fd(fd)

    async def _broadcast(self, event: Message) -> None:
        for sub in list(self._subscribers):
            await sub.put(event)

    def subscribe(self) -> Subscriber:
        sub = Subscriber()
        if self.end is not None:
            sub.queue.put_nowait({"end": self.end})  # attached just as it finished
        else:
            self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subscribers.discard(sub)
        sub.close()

    async def follow(self, sub: Subscriber, keepalive: float) -> AsyncIterator[Message]:
        """Events for one stream: data, then end; keepalives while nothing happens."""
        while True:
            try:
                item = await aio.wait_for(sub.queue.get(), keepalive)
            except TimeoutError:
                yield {"event": {"keepalive": {}}}
                continue
            yield {"event": item}
            if "end" in item:
                return

    # -- fd readiness ---------------------------------------------------------------------------
    async def _wait_fd(self, fd: int, write: bool) -> None:
        await aio.wait_fd(fd, write, self._waiters)

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
                    f"{go_errno(e)}",
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
                    f"{go_errno(e)}",
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
                close_fd(self.stdin_fd)
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
            raise RpcError("internal", f"error sending signal: {go_errno(e)}") from None

    def resize(self, cols: int, rows: int) -> None:
        if self.pty_fd is None:
            raise RpcError("internal", "error resizing tty: tty not assigned to process")
        set_winsize(self.pty_fd, cols, rows)

    def info(self) -> Message:
        out: Message = {"config": self.config, "pid": self.pid}
        if self.tag is not None:
            out["tag"] = self.tag
        return out


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

    def install(self, loop: aio.Loop) -> None:
        loop.add_signal_handler(signal.SIGCHLD, self._reap)

    def _reap(self) -> None:
        # waitpid(-1): as the sandbox's init the agent adopts every orphan (a daemon's double
        # fork, the children of a killed command) and must reap it too, or zombies pile up.
        # Only the processes it started have a callback; the others' status goes nowhere.
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

    async def start_unlisted(self, spec: SpawnSpec) -> tuple[int, aio.Future[int]]:
        """Start ``spec`` outside the process table (not a command of envd's: sudo.py); its pid
        and its wait status, when it ends."""
        ended: aio.Future[int] = aio.get_running_loop().create_future()

        def exited(status: int) -> None:
            if not ended.done():
                ended.set_result(status)

        def forked(pid: int) -> None:
            self._exit_callbacks[pid] = exited

        child = await start_child(spec, self._max_fd, forked)
        return child.pid, ended

    async def spawn(
        self,
        spec: SpawnSpec,
        config: Message,
        tag: str | None,
    ) -> Process:
        proc_box: list[Process] = []
        early_status: list[int] = []

        def exited(status: int) -> None:
            if proc_box:
                proc_box[0].on_exit(status)
            else:
                early_status.append(status)

        def forked(pid: int) -> None:
            self._exit_callbacks[pid] = exited  # so an instant exit is not reaped unseen

        child = await start_child(spec, self._max_fd, forked)
        proc = Process(
            self, child.pid, config, tag, child.outputs, child.stdin_fd, child.pty_fd, spec.user.uid
        )
        proc_box.append(proc)
        log.info("process %d started (%s): %s", child.pid, spec.user.name, _command(config))
        if early_status:
            proc.on_exit(early_status[0])
        self.processes[child.pid] = proc
        return proc


def _command(config: Message) -> str:
    """A process's command line as its log line shows it (bounded)."""
    words = [str(config.get("cmd", "")), *(str(a) for a in config.get("args") or [])]
    line = " ".join(words)
    return line if len(line) <= COMMAND_SHOWN else line[: COMMAND_SHOWN - 3] + "..."
