"""Waiting on several things, limits in time, and the agent loop's synchronisation primitives,
with asyncio's names and semantics (``aio``)."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Iterable
from typing import Any, Generic, TypeVar

from .aio_loop import (
    CancelledError,
    Future,
    Handle,
    Task,
    _set_if_pending,
    current_task,
    ensure_future,
    get_running_loop,
)

T = TypeVar("T")
FIRST_COMPLETED = "FIRST_COMPLETED"
ALL_COMPLETED = "ALL_COMPLETED"


async def wait(
    fs: Iterable[Future[Any]], return_when: str = ALL_COMPLETED
) -> tuple[set[Future[Any]], set[Future[Any]]]:
    """Until one (FIRST_COMPLETED) or all of ``fs`` are done; cancels none of them."""
    futs = {ensure_future(f) for f in fs}
    if not futs:
        raise ValueError("set of awaitables is empty")
    left = [sum(not f.done() for f in futs)]
    if left[0] and not (return_when == FIRST_COMPLETED and left[0] < len(futs)):
        waiter: Future[None] = get_running_loop().create_future()

        def one_done(_f: Future[Any]) -> None:
            left[0] -= 1
            if left[0] == 0 or return_when == FIRST_COMPLETED:
                _set_if_pending(waiter, None)

        for f in futs:
            f.add_done_callback(one_done)
        try:
            await waiter
        finally:
            for f in futs:
                f.remove_done_callback(one_done)
    done = {f for f in futs if f.done()}
    return done, futs - done


async def gather(*aws: Awaitable[Any], return_exceptions: bool = False) -> list[Any]:
    """Each result in order; the first error is raised (the others run on) unless
    ``return_exceptions``; cancelled, it cancels them all."""
    futs = [ensure_future(a) for a in aws]
    pending = {f for f in futs if not f.done()}
    while pending:
        if not return_exceptions:
            for f in futs:
                if f.done() and (f.cancelled() or f.exception() is not None):
                    f.result()  # raises it
        try:
            _done, pending = await wait(pending, return_when=FIRST_COMPLETED)
        except CancelledError:
            for f in futs:
                f.cancel()
            # As asyncio's: the caller sees its cancellation once the children have taken
            # theirs (all, with return_exceptions; else the first to end), not before: its
            # finally would close what they still use before their own cleanup ran.
            rest = {f for f in futs if not f.done()}
            if rest:
                await wait(rest, ALL_COMPLETED if return_exceptions else FIRST_COMPLETED)
            raise
    out: list[Any] = []
    for f in futs:
        if f.cancelled():
            if not return_exceptions:
                raise CancelledError()
            out.append(CancelledError())
        elif f.exception() is not None:
            if not return_exceptions:
                raise f.exception()  # type: ignore[misc]
            out.append(f.exception())
        else:
            out.append(f.result())
    return out


def shield(aw: Awaitable[T]) -> Future[T]:
    """A future of ``aw``'s result whose cancellation leaves ``aw`` running."""
    inner = ensure_future(aw)
    if inner.done():
        return inner
    outer: Future[T] = inner.get_loop().create_future()

    def copy(f: Future[T]) -> None:
        if outer.done():
            return
        if f.cancelled():
            outer.cancel()
        elif f.exception() is not None:
            outer.set_exception(f.exception())  # type: ignore[arg-type]
        else:
            outer.set_result(f.result())

    inner.add_done_callback(copy)
    return outer


class timeout:
    """``async with timeout(s)``: past ``s`` seconds the task is cancelled at its ``await`` and
    the block raises ``TimeoutError``. None: no limit."""

    def __init__(self, delay: float | None) -> None:
        self._delay = delay
        self._task: Task[Any] | None = None
        self._handle: Handle | None = None
        self._expired = False
        self._cancelling = 0

    async def __aenter__(self) -> timeout:
        self._task = current_task()
        if self._task is None:
            raise RuntimeError("timeout() must be used inside a task")
        self._cancelling = self._task.cancelling()
        if self._delay is not None:
            self._handle = get_running_loop().call_later(self._delay, self._expire)
        return self

    def _expire(self) -> None:
        assert self._task is not None
        self._expired = True
        self._task.cancel()

    async def __aexit__(self, et: type[BaseException] | None, e: object, tb: object) -> None:
        if self._handle is not None:
            self._handle.cancel()
        assert self._task is not None
        if self._expired and self._task.uncancel() <= self._cancelling and et is CancelledError:
            raise TimeoutError from None


async def wait_for(aw: Awaitable[T], timeout_s: float | None) -> T:
    """``aw``, or TimeoutError past ``timeout_s``: awaited in this task, so what it waits on is
    cancelled at the limit, and nothing it got is lost to a task of its own."""
    async with timeout(timeout_s):
        return await aw


class Event:
    def __init__(self) -> None:
        self._set = False
        self._waiters: deque[Future[None]] = deque()

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            for fut in self._waiters:
                _set_if_pending(fut, None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> bool:
        if self._set:
            return True
        fut: Future[None] = get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
            return True
        finally:
            self._waiters.remove(fut)


def _wake_first(waiters: deque[Future[None]]) -> bool:
    """Wake the first waiter still waiting; False if there was none."""
    while waiters:
        fut = waiters.popleft()
        if not fut.done():
            fut.set_result(None)
            return True
    return False


class QueueFull(Exception):
    pass


class QueueEmpty(Exception):
    pass


class Queue(Generic[T]):
    """FIFO with an optional bound: ``put_nowait`` past it raises ``QueueFull``."""

    def __init__(self, maxsize: int = 0) -> None:
        self.maxsize = maxsize
        self._items: deque[T] = deque()
        self._getters: deque[Future[None]] = deque()
        self._putters: deque[Future[None]] = deque()

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def full(self) -> bool:
        return 0 < self.maxsize <= len(self._items)

    def put_nowait(self, item: T) -> None:
        if self.full():
            raise QueueFull
        self._items.append(item)
        _wake_first(self._getters)

    def get_nowait(self) -> T:
        if not self._items:
            raise QueueEmpty
        item = self._items.popleft()
        _wake_first(self._putters)
        return item

    async def put(self, item: T) -> None:
        while self.full():
            await self._park(self._putters)
        self.put_nowait(item)

    async def get(self) -> T:
        while not self._items:
            await self._park(self._getters)
        return self.get_nowait()

    async def _park(self, waiters: deque[Future[None]]) -> None:
        fut: Future[None] = get_running_loop().create_future()
        waiters.append(fut)
        try:
            await fut
        except CancelledError:
            # Woken and then cancelled: hand the wake-up on, or it would be lost.
            if fut.done() and not fut.cancelled():
                _wake_first(waiters)
            raise
        finally:
            if fut in waiters:
                waiters.remove(fut)


class Lock:
    """Fair, as asyncio's: the first to wait is the first to get it. ``release`` hands the
    lock straight to the first waiter (it stays locked), so a task calling ``acquire`` before
    that waiter has run cannot take it first (two stdin writes would swap)."""

    def __init__(self) -> None:
        self._locked = False
        self._waiters: deque[Future[None]] = deque()

    def locked(self) -> bool:
        return self._locked

    async def acquire(self) -> bool:
        if not self._locked:
            self._locked = True
            return True
        fut: Future[None] = get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # handed the lock, then cancelled: hand it on
            raise
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)
        return True

    def release(self) -> None:
        if not self._locked:
            raise RuntimeError("Lock is not acquired")
        if not _wake_first(self._waiters):
            self._locked = False

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()
