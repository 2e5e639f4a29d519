"""The agent's own event loop (``aio``) in this process, held to asyncio's semantics for what the
agent uses: plain tests, each running a coroutine with ``aio.run`` (aio has its own loop). Where
two things must land in one turn of the loop, a callback blocks the loop past both."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import time
from typing import Any

import pytest

from sandhold.agent import aio
from sandhold.agent.aio_loop import TIMERS_COMPACT_MIN

BOUND = 10.0  # seconds: a guard against hanging, never reached when the loop works


# Every test twice: on the agent's loop, and on asyncio, the reference it is held to (conftest).
pytestmark = pytest.mark.usefixtures("loop_module")


async def _ended(task: aio.Future[Any]) -> str:
    try:
        await task
    except aio.CancelledError:
        return "cancelled"
    return "done"


async def _waits(log: list[str], name: str) -> None:
    """Waits ~forever; logs ``name`` once its wait has ended (cancelled, that is)."""
    try:
        await aio.sleep(BOUND)
    finally:
        log.append(name)


async def _after(s: float, v: Any) -> Any:
    await aio.sleep(s)
    if isinstance(v, Exception):
        raise v
    return v


# -- tasks and cancellation -----------------------------------------------------------------
def test_cancel_while_awaiting_before_the_first_step_while_running_and_as_it_wakes() -> None:
    log: list[str] = []

    async def cancels_itself() -> int:
        aio.current_task().cancel()  # type: ignore[union-attr]
        return 1  # finishing in the same step: cancelled all the same, as asyncio

    async def main() -> None:
        t = aio.ensure_future(_waits(log, "at the await"))
        await aio.sleep(0.01)
        assert t.cancel() and not t.done()
        assert await _ended(t) == "cancelled" and t.cancelled() and not t.cancel()
        t = aio.ensure_future(_waits(log, "the body ran"))
        t.cancel()  # before its first step: the body never runs
        assert await _ended(t) == "cancelled"
        assert await _ended(aio.ensure_future(cancels_itself())) == "cancelled"
        fut: aio.Future[int] = aio.get_running_loop().create_future()
        t = aio.ensure_future(aio.wait_for(fut, None))
        await aio.sleep(0)
        fut.set_result(5)  # its wake-up is queued ...
        t.cancel()  # ... and the cancel still lands at that await: the 5 is not returned
        assert await _ended(t) == "cancelled"

    aio.run(main())
    assert log == ["at the await"]


# -- timeout and wait_for ---------------------------------------------------------------------
def test_timeout_raises_timeout_error_leaves_nothing_behind_and_nests() -> None:
    async def main() -> list[str]:
        with pytest.raises(TimeoutError):
            async with aio.timeout(0.01):
                await aio.sleep(BOUND)
        assert aio.current_task().cancelling() == 0  # type: ignore[union-attr]
        await aio.sleep(0.02)  # no late cancel
        async with aio.timeout(None):
            await aio.sleep(0)
        assert await aio.wait_for(aio.sleep(0, "r"), BOUND) == "r"
        log: list[str] = []
        with pytest.raises(TimeoutError):
            async with aio.timeout(0.01):
                try:
                    async with aio.timeout(BOUND):
                        await aio.sleep(BOUND)
                except aio.CancelledError:
                    log.append("inner passed the outer's cancel on")
                    raise
        async with aio.timeout(BOUND):
            try:
                async with aio.timeout(0.01):
                    await aio.sleep(BOUND)
            except TimeoutError:
                log.append("inner timed out")
            await aio.sleep(0.02)  # the outer's limit is intact
            log.append("outer went on")
        return log

    assert aio.run(main()) == [
        "inner passed the outer's cancel on",
        "inner timed out",
        "outer went on",
    ]


@pytest.mark.parametrize("cancel_at", [0.001, 0.02], ids=["cancel-first", "expiry-first"])
def test_outside_cancel_inside_timeout_stays_a_cancel(cancel_at: float) -> None:
    async def worker() -> None:
        async with aio.timeout(0.01):
            await aio.sleep(BOUND)

    async def main() -> None:
        loop = aio.get_running_loop()
        t = aio.ensure_future(worker())
        await aio.sleep(0)
        loop.call_later(cancel_at, t.cancel)
        loop.call_soon(time.sleep, 0.05)  # the expiry and the cancel: in one turn
        assert await _ended(t) == "cancelled"  # not TimeoutError

        t = aio.ensure_future(worker())  # an outside cancel alone
        await aio.sleep(0)
        t.cancel()
        assert await _ended(t) == "cancelled"

    aio.run(main())


@pytest.mark.parametrize("put_at", [0.005, 0.03], ids=["put-first", "expiry-first"])
def test_wait_for_queue_get_loses_no_item_at_its_limit(put_at: float) -> None:
    async def main() -> list[str]:
        loop = aio.get_running_loop()
        q: aio.Queue[str] = aio.Queue()
        loop.call_later(put_at, q.put_nowait, "item")
        loop.call_soon(time.sleep, 0.06)  # the put and the expiry: in one turn
        got = []
        with contextlib.suppress(TimeoutError):
            got.append(await aio.wait_for(q.get(), 0.01))
        return got + [q.get_nowait() for _ in range(q.qsize())]

    assert aio.run(main()) == ["item"]


@pytest.mark.aio_only
def test_cancelled_timers_do_not_pile_up() -> None:
    async def main() -> int:
        q: aio.Queue[int] = aio.Queue()
        for i in range(3 * TIMERS_COMPACT_MIN):
            q.put_nowait(i)
            assert await aio.wait_for(q.get(), 90) == i  # each leaves a cancelled 90 s timer
        return len(aio.get_running_loop()._timers)

    assert aio.run(main()) <= 2 * TIMERS_COMPACT_MIN


# -- gather, wait, shield ---------------------------------------------------------------------
def test_gather_results_in_order_and_first_error() -> None:
    async def main() -> None:
        assert await aio.gather(_after(0.03, "a"), _after(0.01, "b"), _after(0.02, "c")) == list(
            "abc"
        )
        assert await aio.gather() == []
        slow = aio.ensure_future(_after(0.05, "slow"))
        with pytest.raises(ValueError, match="boom"):
            await aio.gather(slow, _after(0.01, ValueError("boom")))
        assert not slow.done()  # the others run on
        assert await slow == "slow"
        cancelled = aio.ensure_future(aio.sleep(BOUND))
        cancelled.cancel()
        out = await aio.gather(
            _after(0, 1), _after(0.01, KeyError("k")), cancelled, return_exceptions=True
        )
        assert out[0] == 1 and isinstance(out[1], KeyError)
        assert isinstance(out[2], aio.CancelledError)

    aio.run(main())


@pytest.mark.parametrize("return_exceptions", [False, True])
def test_gather_cancelled_cancels_its_children_first(return_exceptions: bool) -> None:
    log: list[str] = []

    async def parent(kids: list[aio.Task[None]]) -> None:
        try:
            await aio.gather(*kids, return_exceptions=return_exceptions)
        finally:
            log.append("parent")

    async def main() -> None:
        kids = [aio.ensure_future(_waits(log, "a")), aio.ensure_future(_waits(log, "b"))]
        t = aio.ensure_future(parent(kids))
        await aio.sleep(0.01)
        t.cancel()
        assert await _ended(t) == "cancelled"
        assert all(k.cancelled() for k in kids)

    aio.run(main())
    assert sorted(log[:2]) == ["a", "b"] and log[2] == "parent"  # their cleanup ran first


def test_wait_first_completed_and_shield_cancel_nothing() -> None:
    async def main() -> None:
        fast = aio.ensure_future(aio.sleep(0.01, "fast"))
        slow = aio.ensure_future(aio.sleep(0.05, "slow"))
        done, pending = await aio.wait({fast, slow}, return_when=aio.FIRST_COMPLETED)
        assert done == {fast} and pending == {slow} and not slow.cancelled()
        w = aio.ensure_future(aio.wait({slow}))
        await aio.sleep(0)
        w.cancel()
        assert await _ended(w) == "cancelled"
        assert await slow == "slow"
        done, pending = await aio.wait({fast, slow})
        assert done == {fast, slow} and not pending

        inner = aio.ensure_future(aio.sleep(0.03, 5))  # shield: the inner runs on

        async def outer() -> int:
            return await aio.shield(inner)

        t = aio.ensure_future(outer())
        await aio.sleep(0.01)
        t.cancel()
        assert await _ended(t) == "cancelled" and not inner.done()
        assert await inner == 5

    aio.run(main())


# -- Event, Queue, Lock -----------------------------------------------------------------------
def test_event_wakes_every_waiter_and_a_bounded_queue_holds_back() -> None:
    async def main() -> None:
        ev = aio.Event()
        waiters = [aio.ensure_future(ev.wait()) for _ in range(4)]
        await aio.sleep(0)
        waiters.pop().cancel()
        await aio.sleep(0)
        assert not any(w.done() for w in waiters)
        ev.set()
        assert await aio.wait_for(aio.gather(*waiters), BOUND) == [True] * 3
        assert ev.is_set() and await ev.wait()
        ev.clear()
        with pytest.raises(TimeoutError):
            await aio.wait_for(ev.wait(), 0.01)

        q: aio.Queue[int] = aio.Queue(maxsize=2)
        with pytest.raises(aio.QueueEmpty):
            q.get_nowait()
        await q.put(1)
        q.put_nowait(2)
        assert q.full() and q.qsize() == 2
        with pytest.raises(aio.QueueFull):
            q.put_nowait(3)
        putter = aio.ensure_future(q.put(3))
        await aio.sleep(0.01)
        assert not putter.done()  # held back while full
        assert await q.get() == 1
        await aio.wait_for(putter, BOUND)
        assert [await q.get(), await q.get()] == [2, 3] and q.empty()
        getter = aio.ensure_future(q.get())
        await aio.sleep(0)
        q.put_nowait(4)
        assert await aio.wait_for(getter, BOUND) == 4

    aio.run(main())


def test_queue_cancelled_woken_waiter_hands_its_wakeup_on() -> None:
    async def main() -> None:
        q: aio.Queue[str] = aio.Queue(maxsize=1)
        g1, g2 = aio.ensure_future(q.get()), aio.ensure_future(q.get())
        await aio.sleep(0)
        q.put_nowait("x")  # wakes g1 ...
        g1.cancel()  # ... which is cancelled before it ran
        assert await aio.wait_for(g2, BOUND) == "x"
        assert g1.cancelled()

        q.put_nowait("full")
        p1, p2 = aio.ensure_future(q.put("p1")), aio.ensure_future(q.put("p2"))
        await aio.sleep(0)
        assert q.get_nowait() == "full"  # wakes p1 ...
        p1.cancel()
        await aio.wait_for(p2, BOUND)
        assert q.get_nowait() == "p2" and p1.cancelled()

    aio.run(main())


def test_lock_is_fair_and_a_cancelled_waiter_hands_it_on() -> None:
    async def main() -> None:
        lock = aio.Lock()
        order: list[str] = []

        async def user(name: str) -> None:
            async with lock:
                order.append(name)

        await lock.acquire()
        b = aio.ensure_future(user("b"))
        await aio.sleep(0)
        lock.release()
        await lock.acquire()  # back at once, but b started waiting first
        order.append("a")
        lock.release()
        await aio.wait_for(b, BOUND)
        assert order == ["b", "a"]

        await lock.acquire()
        c, d = aio.ensure_future(user("c")), aio.ensure_future(user("d"))
        await aio.sleep(0)
        lock.release()  # handed to c ...
        c.cancel()  # ... cancelled before it ran: d gets it
        await aio.wait_for(d, BOUND)
        assert order[2:] == ["d"] and c.cancelled() and not lock.locked()
        with pytest.raises(RuntimeError):
            lock.release()

    aio.run(main())


# -- the loop: timers, callbacks, descriptors, signals ------------------------------------------
def test_sleep_order_and_call_later_cancel() -> None:
    async def main() -> list[str]:
        loop = aio.get_running_loop()
        log: list[str] = []

        async def sleeper(s: float) -> None:
            await aio.sleep(s)
            log.append(f"sleep {s}")

        h = loop.call_later(0.01, log.append, "cancelled timer")
        loop.call_later(0.02, log.append, "timer")
        h.cancel()
        await aio.gather(*(sleeper(s) for s in (0.04, 0.01, 0.02, 0, 0.03)))
        log.remove("timer")  # ran (and where among the sleeps depends on the host's load)
        return log

    assert aio.run(main()) == ["sleep 0", "sleep 0.01", "sleep 0.02", "sleep 0.03", "sleep 0.04"]


def test_a_raising_callback_is_reported_and_the_loop_goes_on(capsys: Any, caplog: Any) -> None:
    async def main() -> list[int]:
        log: list[int] = []
        aio.get_running_loop().call_soon(int, "callback broke")  # raises ValueError
        aio.get_running_loop().call_soon(log.append, 1)
        await aio.sleep(0.01)
        return log

    assert aio.run(main()) == [1]
    # (aio writes it to stderr, the agent's log; asyncio to its logger)
    assert "'callback broke'" in capsys.readouterr().err + caplog.text


def test_a_failed_task_nobody_awaited_is_reported_once_collected(capsys: Any, caplog: Any) -> None:
    async def fails(what: str) -> None:
        raise ValueError(what)

    async def main() -> None:
        aio.ensure_future(fails("left alone"))  # nobody keeps it or asks for its result
        asked = aio.ensure_future(fails("asked for"))
        await aio.sleep(0.01)
        assert isinstance(asked.exception(), ValueError)
        del asked

    aio.run(main())
    gc.collect()
    err = capsys.readouterr().err + caplog.text
    assert "never retrieved" in err and "ValueError: left alone" in err, err
    assert "asked for" not in err


def test_a_reader_removed_this_turn_does_not_run() -> None:
    async def main() -> list[int]:
        loop, ran = aio.get_running_loop(), []
        pairs = [socket.socketpair() for _ in range(2)]
        for _a, b in pairs:
            b.send(b"x")  # both readable when the loop polls: both queued in that turn

        def on(i: int) -> None:  # the first to run removes both
            ran.append(i)
            for a, _b in pairs:
                loop.remove_reader(a.fileno())

        for i, (a, _b) in enumerate(pairs):
            loop.add_reader(a.fileno(), on, i)
        await aio.sleep(0.02)
        for s in (s for p in pairs for s in p):
            s.close()
        return ran

    assert len(aio.run(main())) == 1


@pytest.mark.aio_only  # (aio.sock_recv: asyncio has it on the loop)
def test_a_closed_fds_number_reused_keeps_its_new_waiter() -> None:
    async def main() -> bytes:
        a, b = socket.socketpair()
        a.setblocking(False)
        old = aio.ensure_future(aio.sock_recv(a, 10))
        await aio.sleep(0)
        number = a.fileno()
        old.cancel()  # its finally runs next turn ...
        a.close()
        c, d = socket.socketpair()  # ... after c has taken a's number and waits on it
        try:
            assert c.fileno() == number
            c.setblocking(False)
            aio.get_running_loop().call_later(0.02, d.send, b"hi")
            return await aio.wait_for(aio.sock_recv(c, 10), BOUND)
        finally:
            for s in (b, c, d):
                s.close()

    assert aio.run(main()) == b"hi"


def test_signal_handler_runs_on_the_loop() -> None:
    old = signal.getsignal(signal.SIGUSR1)
    try:

        async def main() -> list[str]:
            got: list[str] = []
            ev = aio.Event()

            def on_usr1(tag: str) -> None:
                got.append(tag)
                ev.set()

            aio.get_running_loop().add_signal_handler(signal.SIGUSR1, on_usr1, "usr1")
            os.kill(os.getpid(), signal.SIGUSR1)
            assert got == []  # not in the signal handler: on a later turn of the loop
            await aio.wait_for(ev.wait(), BOUND)
            return got

        assert aio.run(main()) == ["usr1"]
        # Closing the loop gave the signal its default back and unhooked the wake-up pipe.
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
        assert signal.set_wakeup_fd(-1) == -1
    finally:
        signal.signal(signal.SIGUSR1, old)
        signal.set_wakeup_fd(-1)
