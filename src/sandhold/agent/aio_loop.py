"""The agent's event loop (``aio``): futures, tasks and the loop itself, on one epoll.
One loop per process, run by ``run``; see ``aio`` for why it is not asyncio.
"""

from __future__ import annotations

import heapq
import os
import select
import signal
import sys
import time
import types
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")
TIMERS_COMPACT_MIN = 512  # timers in the heap before cancelled ones are swept out


class CancelledError(BaseException):
    """The task was cancelled (a BaseException, as asyncio's: ``except Exception`` lets it by)."""


class InvalidStateError(Exception):
    pass


def _report(what: str, exc: BaseException) -> None:
    """An error nobody could be told of (a callback's): on stderr, which is the agent's log."""
    import traceback  # only when it happens: it imports linecache and tokenize

    from . import log

    sys.stderr.write(f"{log.stamp()} sandhold-agent: ERROR {what}\n")
    traceback.print_exception(exc, file=sys.stderr)


class Handle:
    __slots__ = ("args", "callback", "cancelled", "when")

    def __init__(self, callback: Callable[..., Any], args: tuple[Any, ...], when: float = 0.0):
        self.callback, self.args, self.cancelled, self.when = callback, args, False, when

    def cancel(self) -> None:
        self.cancelled = True

    def __lt__(self, other: Handle) -> bool:
        return self.when < other.when

    def run(self) -> None:
        try:
            self.callback(*self.args)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as e:
            _report(f"exception in callback {self.callback!r}", e)


TimerHandle = Handle


class Future(Generic[T]):
    """A result to come: awaited by tasks, completed by callbacks."""

    _asyncio_future_blocking = False  # what a task checks that it was handed a Future
    _unretrieved = False  # a task's exception nobody has asked for yet (Task.__del__)

    def __init__(self, loop: Loop | None = None) -> None:
        self._loop = loop or get_running_loop()
        self._state = "PENDING"
        self._result: T | None = None
        self._exception: BaseException | None = None
        self._callbacks: list[Callable[[Future[T]], object]] = []

    def get_loop(self) -> Loop:
        return self._loop

    def done(self) -> bool:
        return self._state != "PENDING"

    def cancelled(self) -> bool:
        return self._state == "CANCELLED"

    def cancel(self, msg: object = None) -> bool:
        if self._state != "PENDING":
            return False
        self._state = "CANCELLED"
        self._schedule_callbacks()
        return True

    def result(self) -> T:
        if self._state == "CANCELLED":
            raise CancelledError()
        if self._state == "PENDING":
            raise InvalidStateError("result is not set")
        self._unretrieved = False
        if self._exception is not None:
            raise self._exception
        return self._result  # type: ignore[return-value]

    def exception(self) -> BaseException | None:
        if self._state == "CANCELLED":
            raise CancelledError()
        if self._state == "PENDING":
            raise InvalidStateError("exception is not set")
        self._unretrieved = False
        return self._exception

    def set_result(self, result: T) -> None:
        if self._state != "PENDING":
            raise InvalidStateError(f"future is {self._state}")
        self._result, self._state = result, "FINISHED"
        self._schedule_callbacks()

    def set_exception(self, exc: BaseException) -> None:
        if self._state != "PENDING":
            raise InvalidStateError(f"future is {self._state}")
        if isinstance(exc, type):
            exc = exc()
        self._exception, self._state = exc, "FINISHED"
        self._schedule_callbacks()

    def add_done_callback(self, fn: Callable[[Future[T]], object]) -> None:
        if self._state != "PENDING":
            self._loop.call_soon(fn, self)
        else:
            self._callbacks.append(fn)

    def remove_done_callback(self, fn: Callable[[Future[T]], object]) -> int:
        before = len(self._callbacks)
        self._callbacks = [f for f in self._callbacks if f != fn]
        return before - len(self._callbacks)

    def _schedule_callbacks(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            self._loop.call_soon(fn, self)

    def __await__(self) -> Generator[Any, None, T]:
        if not self.done():
            self._asyncio_future_blocking = True
            yield self
        return self.result()


class Task(Future[T]):
    """Runs a coroutine on the loop, one step per wake-up."""

    def __init__(self, coro: Coroutine[Any, Any, T], loop: Loop | None = None) -> None:
        super().__init__(loop)
        self._coro = coro
        self._waiting_on: Future[Any] | None = None
        self._must_cancel = False
        self._cancel_requests = 0
        self._loop.call_soon(self._step)

    def __del__(self) -> None:
        # As asyncio's "Task exception was never retrieved": a fire-and-forget task (a
        # connection's, sudo's, a service's) that failed would otherwise leave no trace.
        if self._unretrieved and self._exception is not None:
            try:
                _report(f"task exception was never retrieved: {self._coro!r}", self._exception)
            except Exception:
                pass  # at interpreter exit the modules it needs may be gone

    def cancel(self, msg: object = None) -> bool:
        if self.done():
            return False
        self._cancel_requests += 1
        if self._waiting_on is not None and self._waiting_on.cancel():
            return True  # its wake-up throws CancelledError in
        self._must_cancel = True
        return True

    def cancelling(self) -> int:
        return self._cancel_requests

    def uncancel(self) -> int:
        if self._cancel_requests > 0:
            self._cancel_requests -= 1
            if self._cancel_requests == 0:
                self._must_cancel = False  # a cancel not yet delivered is withdrawn too
        return self._cancel_requests

    def _step(self, exc: BaseException | None = None) -> None:
        if self.done():
            return
        if self._must_cancel:
            if not isinstance(exc, CancelledError):
                exc = CancelledError()
            self._must_cancel = False
        self._waiting_on = None
        loop = self._loop
        loop.current = self
        try:
            yielded = self._coro.send(None) if exc is None else self._coro.throw(exc)
        except StopIteration as stop:
            if self._must_cancel:  # cancelled while it was finishing: as asyncio, cancelled
                self._must_cancel = False
                super().cancel()
            else:
                self.set_result(stop.value)
        except CancelledError:
            super().cancel()
        except (KeyboardInterrupt, SystemExit) as e:
            super().set_exception(e)
            raise
        except BaseException as e:
            super().set_exception(e)
            self._unretrieved = True  # until someone asks: else reported when collected
        else:
            # The flag is asyncio's Future protocol (every Future has it), not private state.
            if isinstance(yielded, Future) and yielded._asyncio_future_blocking:  # noqa: SLF001
                yielded._asyncio_future_blocking = False  # noqa: SLF001
                self._waiting_on = yielded
                yielded.add_done_callback(self._wakeup)
                if self._must_cancel and yielded.cancel():
                    self._must_cancel = False
            elif yielded is None:  # a bare yield: sleep(0)
                loop.call_soon(self._step)
            else:
                loop.call_soon(self._step, RuntimeError(f"task got bad yield: {yielded!r}"))
        finally:
            loop.current = None

    def _wakeup(self, fut: Future[Any]) -> None:
        try:
            fut.result()
        except BaseException as e:
            self._step(e)
        else:
            self._step()


class Loop:
    """Ready callbacks, timers, and epoll for descriptors and (through a wake-up pipe) signals."""

    def __init__(self) -> None:
        self._ready: deque[Handle] = deque()
        self._timers: list[Handle] = []
        self._epoll = select.epoll()
        self._readers: dict[int, Handle] = {}
        self._writers: dict[int, Handle] = {}
        self._signals: dict[int, Handle] = {}
        self._registered: set[int] = set()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.current: Task[Any] | None = None  # the task whose step is running
        self._closed = False
        self._timers_compact_at = TIMERS_COMPACT_MIN

    # -- scheduling -------------------------------------------------------------------------
    def time(self) -> float:
        return time.monotonic()

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> Handle:
        h = Handle(callback, args)
        self._ready.append(h)
        return h

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> Handle:
        h = Handle(callback, args, when)
        timers = self._timers
        if len(timers) >= self._timers_compact_at:
            # A cancelled timer leaves the heap only once it reaches the top: every wait_for
            # cancels one (a 90 s keepalive per streamed message), each holding its task.
            timers[:] = [t for t in timers if not t.cancelled]
            heapq.heapify(timers)
            self._timers_compact_at = max(TIMERS_COMPACT_MIN, 2 * len(timers))
        heapq.heappush(timers, h)
        return h

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Handle:
        return self.call_at(self.time() + delay, callback, *args)

    def create_future(self) -> Future[Any]:
        return Future(self)

    def create_task(self, coro: Coroutine[Any, Any, T]) -> Task[T]:
        return Task(coro, self)

    # -- descriptors ------------------------------------------------------------------------
    def _update(self, fd: int) -> None:
        mask = (select.EPOLLIN if fd in self._readers else 0) | (
            select.EPOLLOUT if fd in self._writers else 0
        )
        if not mask:
            if fd in self._registered:
                self._registered.discard(fd)
                try:
                    self._epoll.unregister(fd)
                except OSError:
                    pass  # closed already: the kernel dropped it
            return
        try:
            if fd in self._registered:
                self._epoll.modify(fd, mask)
            else:
                self._epoll.register(fd, mask)
        except FileNotFoundError:  # closed and its number reused since: a new registration
            self._epoll.register(fd, mask)
        except FileExistsError:
            self._epoll.modify(fd, mask)
        self._registered.add(fd)

    # A handle replaced or removed is cancelled, as asyncio's: if this turn's poll queued it
    # already, it must not run (a writer's flush after its socket was closed, say).
    def _replace(self, table: dict[int, Handle], fd: int, new: Handle | None) -> bool:
        """Put ``new`` (None: nothing) in ``fd``'s place in ``table``; whether one was there."""
        old = table.pop(fd, None)
        if old is not None:
            old.cancel()
        if new is not None:
            table[fd] = new
        # A removal on a closed loop only drops the handle (a task's finally run when it is
        # collected after run()).
        if new is not None or (old is not None and not self._closed):
            self._update(fd)
        return old is not None

    def add_reader(self, fd: int, callback: Callable[..., Any], *args: Any) -> None:
        self._replace(self._readers, fd, Handle(callback, args))

    def add_writer(self, fd: int, callback: Callable[..., Any], *args: Any) -> None:
        self._replace(self._writers, fd, Handle(callback, args))

    def remove_reader(self, fd: int) -> bool:
        return self._replace(self._readers, fd, None)

    def remove_writer(self, fd: int) -> bool:
        return self._replace(self._writers, fd, None)

    def remove_if(self, fd: int, write: bool, callback: Callable[..., Any]) -> bool:
        """Remove ``fd``'s reader (writer: ``write``) only if its callback is still ``callback``;
        whether it was."""
        table = self._writers if write else self._readers
        handle = table.get(fd)
        if handle is None or handle.callback is not callback:
            return False
        return self._replace(table, fd, None)

    # -- signals ----------------------------------------------------------------------------
    def add_signal_handler(self, sig: int, callback: Callable[..., Any], *args: Any) -> None:
        """As asyncio's: the handler only writes the signal's number to the wake-up pipe (the
        kernel restarts interrupted calls); the loop runs ``callback`` on its next turn."""
        if not self._signals:
            signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
            self._readers[self._wake_r] = Handle(self._read_signals, ())
            self._update(self._wake_r)
        self._signals[sig] = Handle(callback, args)
        signal.signal(sig, _no_op)
        signal.siginterrupt(sig, False)

    def _read_signals(self) -> None:
        try:
            got = os.read(self._wake_r, 4096)
        except BlockingIOError:
            return
        for sig in dict.fromkeys(got):  # once per kind and turn: a handler drains all of it
            handle = self._signals.get(sig)
            if handle is not None:
                self._ready.append(Handle(handle.callback, handle.args))

    # -- running ----------------------------------------------------------------------------
    def _run_once(self) -> None:
        timers = self._timers
        while timers and timers[0].cancelled:
            heapq.heappop(timers)
        if self._ready:
            timeout = 0.0
        elif timers:
            timeout = max(0.0, timers[0].when - self.time())
        else:
            timeout = -1.0
        for fd, events in self._epoll.poll(timeout):
            if events & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                handle = self._readers.get(fd)
                if handle is not None:
                    self._ready.append(handle)
            if events & (select.EPOLLOUT | select.EPOLLHUP | select.EPOLLERR):
                handle = self._writers.get(fd)
                if handle is not None:
                    self._ready.append(handle)
        now = self.time()
        while timers and timers[0].when <= now:
            handle = heapq.heappop(timers)
            if not handle.cancelled:
                self._ready.append(handle)
        for _ in range(len(self._ready)):  # only those ready now: new ones wait a turn
            handle = self._ready.popleft()
            if not handle.cancelled:
                handle.run()

    def run_until_complete(self, main: Future[T]) -> T:
        global _running
        _running = self
        try:
            while not main.done():
                self._run_once()
        finally:
            _running = None
        return main.result()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            # As asyncio's: the signals handled get their defaults back (else they stay
            # ignored), and none is written any more to the wake-up pipe's number, soon reused.
            for sig in self._signals:
                default = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
                signal.signal(sig, default)
            if self._signals:
                signal.set_wakeup_fd(-1)
            self._epoll.close()
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)


def _no_op(signum: int, frame: object) -> None:
    pass


_running: Loop | None = None


def get_running_loop() -> Loop:
    if _running is None:
        raise RuntimeError("no running event loop")
    return _running


def current_task() -> Task[Any] | None:
    return get_running_loop().current


def run(main: Coroutine[Any, Any, T]) -> T:
    loop = Loop()
    try:
        return loop.run_until_complete(Task(main, loop))
    finally:
        loop.close()


@overload
def ensure_future(aw: Coroutine[Any, Any, T]) -> Task[T]: ...
@overload
def ensure_future(aw: Awaitable[T]) -> Future[T]: ...
def ensure_future(aw: Awaitable[T]) -> Future[T]:
    if isinstance(aw, Future):
        return aw
    if isinstance(aw, types.CoroutineType):
        return Task(aw)
    raise TypeError(f"a coroutine or Future is required, not {aw!r}")


@types.coroutine
def _yield_once() -> Generator[None, None, None]:
    yield


async def sleep(delay: float, result: T | None = None) -> T | None:
    if delay <= 0:
        await _yield_once()
        return result
    loop = get_running_loop()
    fut: Future[None] = loop.create_future()
    h = loop.call_later(delay, _set_if_pending, fut, None)
    try:
        await fut
    finally:
        h.cancel()
    return result


def _set_if_pending(fut: Future[Any], result: Any) -> None:
    if not fut.done():
        fut.set_result(result)
