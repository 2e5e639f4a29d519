"""Sockets on the agent's loop (``aio``): waiting on descriptors, asyncio's ``sock_*`` calls,
stream readers and writers, servers and connections.

Streams pull: a reader calls ``recv`` when its buffer is empty and waits for the socket to be
readable only if nothing is there, so nothing is read that nobody asked for (no flow control to
get wrong). A writer sends at once what the socket takes and keeps the rest, flushed as the
socket drains; ``drain`` waits while more than HIGH_WATER is kept, and raises the error a send
met (``BrokenPipeError``, ``ConnectionResetError``: the peer is gone).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from .aio_loop import Future, Loop, _report, get_running_loop
from .aio_sync import shield

HIGH_WATER = 64 * 1024
ACCEPT_BATCH = 64  # connections taken per turn of the loop


async def wait_fd(fd: int, write: bool, waiters: set[Future[None]] | None = None) -> None:
    """Until ``fd`` is readable (or writable); ``waiters`` lets an owner wake it early."""
    loop = get_running_loop()
    fut: Future[None] = loop.create_future()

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
        # Only if it is still ours: were fd closed while this waited (its waiter cancelled)
        # and its number reused, the handle there now is another waiter's, whose wake-up
        # would be lost.
        loop.remove_if(fd, write, ready)


async def sock_accept(sock: socket.socket) -> tuple[socket.socket, Any]:
    while True:
        try:
            return sock.accept()
        except (BlockingIOError, InterruptedError):
            await wait_fd(sock.fileno(), write=False)


async def sock_recv(sock: socket.socket, n: int) -> bytes:
    while True:
        try:
            return sock.recv(n)
        except (BlockingIOError, InterruptedError):
            await wait_fd(sock.fileno(), write=False)


async def sock_sendall(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view) :]
        except (BlockingIOError, InterruptedError):
            await wait_fd(sock.fileno(), write=True)


async def sock_connect(sock: socket.socket, address: Any) -> None:
    try:
        sock.connect(address)
        return
    except (BlockingIOError, InterruptedError):
        pass
    await wait_fd(sock.fileno(), write=True)
    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err:
        raise OSError(err, f"Connect call failed {address}: {os.strerror(err)}")


class _Conn:
    """One connected socket, shared by its reader and writer."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.fd = sock.fileno()
        self.loop: Loop = get_running_loop()
        self.out = bytearray()
        self.error: OSError | None = None
        self.closing = False
        self.eof_after_flush = False
        self.closed: Future[None] = self.loop.create_future()
        self.read_waiters: set[Future[None]] = set()
        self.drain_waiters: set[Future[None]] = set()

    async def recv(self, n: int) -> bytes:
        while not self.closed.done():
            try:
                return self.sock.recv(n)
            except (BlockingIOError, InterruptedError):
                await wait_fd(self.fd, write=False, waiters=self.read_waiters)
        return b""

    def send(self, data: bytes) -> None:
        if self.closing or self.error is not None:
            return
        if not self.out:
            try:
                sent = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as e:
                self._fail(e)
                return
            if sent == len(data):
                return
            data = data[sent:]
            self.loop.add_writer(self.fd, self._flush)
        self.out += data

    def _flush(self) -> None:
        try:
            sent = self.sock.send(self.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._fail(e)
            return
        del self.out[:sent]
        if self.out:
            return
        self.loop.remove_writer(self.fd)
        self._wake(self.drain_waiters)
        if self.eof_after_flush:
            self.shutdown_write()
        if self.closing:
            self._close_now()

    def _fail(self, e: OSError) -> None:
        self.error = e
        self.out.clear()
        self._close_now()

    @staticmethod
    def _wake(waiters: set[Future[None]]) -> None:
        for fut in list(waiters):
            if not fut.done():
                fut.set_result(None)

    async def drain(self) -> None:
        while len(self.out) > HIGH_WATER and self.error is None and not self.closed.done():
            fut: Future[None] = self.loop.create_future()
            self.drain_waiters.add(fut)
            try:
                await fut
            finally:
                self.drain_waiters.discard(fut)
        if self.error is not None:
            raise self.error
        if self.closed.done() and not self.closing:
            raise ConnectionResetError("Connection lost")

    def shutdown_write(self) -> None:
        if self.out:
            self.eof_after_flush = True
            return
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        if not self.out:
            self._close_now()

    def _close_now(self) -> None:
        if self.closed.done():
            return
        self.loop.remove_reader(self.fd)
        self.loop.remove_writer(self.fd)
        self.sock.close()
        self.closed.set_result(None)
        self._wake(self.read_waiters)
        self._wake(self.drain_waiters)


class StreamReader:
    def __init__(self, conn: _Conn | None = None, limit: int = HIGH_WATER) -> None:
        self._conn = conn
        self._limit = limit
        self._buffer = bytearray()
        self._eof = False

    def at_eof(self) -> bool:
        return self._eof and not self._buffer

    async def _fill(self) -> bool:
        """More bytes into the buffer; False at the end of the stream."""
        if self._eof or self._conn is None:
            self._eof = True
            return False
        data = await self._conn.recv(self._limit)
        if not data:
            self._eof = True
            return False
        self._buffer += data
        return True

    async def read(self, n: int = -1) -> bytes:
        if n < 0:
            while await self._fill():
                pass
            data = bytes(self._buffer)
            self._buffer.clear()
            return data
        if n == 0:
            return b""
        if not self._buffer:
            if self._conn is None or self._eof:
                return b""
            data = await self._conn.recv(n)
            self._eof = not data
            return data
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    async def readline(self) -> bytes:
        """Up to and with the next newline (all that is left at the end). A line longer than
        the limit raises ValueError and is dropped, as asyncio's: no peer makes it buffer more."""
        start = 0
        while (i := self._buffer.find(b"\n", start)) < 0:
            start = len(self._buffer)
            if start > self._limit:
                self._buffer.clear()
                raise ValueError(f"a line longer than the limit ({self._limit} bytes)")
            if not await self._fill():
                i = len(self._buffer) - 1
                break
        data = bytes(self._buffer[: i + 1])
        del self._buffer[: i + 1]
        return data


class StreamWriter:
    def __init__(self, conn: _Conn) -> None:
        self._conn = conn

    def write(self, data: bytes) -> None:
        if data:
            self._conn.send(bytes(data))

    async def drain(self) -> None:
        await self._conn.drain()

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self._conn.shutdown_write()

    def is_closing(self) -> bool:
        return self._conn.closing or self._conn.closed.done()

    def close(self) -> None:
        self._conn.close()

    async def wait_closed(self) -> None:
        await shield(self._conn.closed)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._conn.sock if name == "socket" else default


def _streams(sock: socket.socket, limit: int) -> tuple[StreamReader, StreamWriter]:
    conn = _Conn(sock)
    return StreamReader(conn, limit), StreamWriter(conn)


Connected = Callable[[StreamReader, StreamWriter], Coroutine[Any, Any, None]]


class Server:
    """Accepts on a listening socket and runs ``connected`` in a task per connection."""

    def __init__(self, sock: socket.socket, connected: Connected, limit: int) -> None:
        sock.setblocking(False)
        self._sock, self._connected, self._limit = sock, connected, limit
        self._loop = get_running_loop()
        self._loop.add_reader(sock.fileno(), self._accept)
        self._serving = True

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return (self._sock,) if self._serving else ()

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:  # that one is gone before it was taken: the next
                continue
            except OSError as e:  # out of descriptors, say: try again in a while
                _report(f"accept failed: {e}", e)
                self._loop.remove_reader(self._sock.fileno())
                self._loop.call_later(1.0, self._resume)
                return
            self._loop.create_task(self._connected(*_streams(conn, self._limit)))

    def _resume(self) -> None:
        if self._serving:
            self._loop.add_reader(self._sock.fileno(), self._accept)

    def close(self) -> None:
        if self._serving:
            self._serving = False
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()

    async def wait_closed(self) -> None:
        pass


async def start_unix_server(
    connected: Connected, *, sock: socket.socket, limit: int = HIGH_WATER
) -> Server:
    return Server(sock, connected, limit)


async def start_server(
    connected: Connected, host: str, port: int, *, limit: int = HIGH_WATER
) -> Server:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(100)
    except OSError:
        sock.close()
        raise
    return Server(sock, connected, limit)


async def _connected(
    sock: socket.socket, address: Any, limit: int
) -> tuple[StreamReader, StreamWriter]:
    sock.setblocking(False)
    try:
        await sock_connect(sock, address)
    except BaseException:
        sock.close()
        raise
    return _streams(sock, limit)


async def open_connection(
    host: str | None = None,
    port: int | None = None,
    *,
    sock: socket.socket | None = None,
    limit: int = HIGH_WATER,
) -> tuple[StreamReader, StreamWriter]:
    """To ``host:port`` (an address, not a name), or on ``sock``, connected already."""
    if sock is not None:
        return _streams(sock, limit)
    assert host is not None and port is not None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return await _connected(socket.socket(family, socket.SOCK_STREAM), (host, port), limit)


async def open_unix_connection(
    path: str, *, limit: int = HIGH_WATER
) -> tuple[StreamReader, StreamWriter]:
    return await _connected(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), path, limit)
