"""The agent's own event loop (``aio``): its streams and servers over real sockets (socketpairs,
a unix server, a TCP server on loopback), each test running a coroutine with ``aio.run``."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import pytest

from sandhold.agent import aio

BOUND = 10.0  # seconds: a guard against hanging, never reached when the loop works


# Every test twice: on the agent's loop, and on asyncio, the reference it is held to (conftest).
pytestmark = pytest.mark.usefixtures("loop_module")


# -- streams and servers ----------------------------------------------------------------------
def test_write_then_close_flushes_everything_before_closing() -> None:
    payload = bytes(range(256)) * (4 * 4096)  # 4 MiB, far more than the socket holds

    async def main() -> bytes:
        a, b = socket.socketpair()
        _ra, wa = await aio.open_connection(sock=a)
        rb, wb = await aio.open_connection(sock=b)
        wa.write(payload)
        wa.write(b"end")
        wa.close()
        assert wa.is_closing()
        got = await aio.wait_for(rb.read(), BOUND)
        await aio.wait_for(wa.wait_closed(), BOUND)
        assert a.fileno() == -1  # closed once all of it was sent
        wb.close()
        return got

    assert aio.run(main()) == payload + b"end"


def test_drain_raises_once_the_peer_is_gone() -> None:
    async def main() -> None:
        a, b = socket.socketpair()
        b.close()
        _r, w = await aio.open_connection(sock=a)
        w.write(b"x")
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            await w.drain()
        w.write(b"more")  # after the peer is gone: dropped, no raise
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            await w.drain()
        assert w.is_closing()
        with contextlib.suppress(OSError):  # (asyncio's raises the connection's error again)
            await aio.wait_for(w.wait_closed(), BOUND)

    aio.run(main())


def test_readline_and_read_to_eof() -> None:
    async def main() -> None:
        a, b = socket.socketpair()
        r, w = await aio.open_connection(sock=a)
        b.sendall(b"one\ntwo\nthr")
        assert await r.readline() == b"one\n"
        assert await r.read(2) == b"tw"
        assert await r.readline() == b"o\n"
        aio.get_running_loop().call_later(0.01, b.sendall, b"ee\nrest")
        aio.get_running_loop().call_later(0.02, b.close)
        assert await aio.wait_for(r.readline(), BOUND) == b"three\n"
        assert await aio.wait_for(r.read(), BOUND) == b"rest"
        assert r.at_eof()
        assert await r.readline() == b"" and await r.read() == b"" and await r.read(5) == b""
        w.close()
        a, b = socket.socketpair()
        r, w = await aio.open_connection(sock=a)
        b.sendall(b"partial")
        b.close()
        assert await aio.wait_for(r.readline(), BOUND) == b"partial"  # the end, no newline
        w.close()

    aio.run(main())


def test_a_line_longer_than_the_limit_is_refused_not_buffered() -> None:
    async def main() -> None:
        a, b = socket.socketpair()
        r, w = await aio.open_connection(sock=a, limit=1024)

        def send() -> None:  # a peer that never ends its line
            with contextlib.suppress(OSError):  # (until the reader hangs up)
                b.sendall(b"x" * 1_000_000)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        with pytest.raises(ValueError, match="limit"):
            await aio.wait_for(r.readline(), BOUND)
        w.close()
        sender.join(BOUND)
        b.close()

    aio.run(main())


def test_unix_server_serves_many_connections_at_once(tmp_path: Any) -> None:
    path = str(tmp_path / "s.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(128)

    async def echo(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
        line = await reader.readline()
        await aio.sleep(0.01)  # all of them open at once
        writer.write(line.upper())
        await writer.drain()
        writer.close()

    async def client(i: int) -> bytes:
        reader, writer = await aio.open_unix_connection(path)
        writer.write(b"hello %d\n" % i)
        got = await reader.read()
        writer.close()
        return got

    async def main() -> list[bytes]:
        server = await aio.start_unix_server(echo, sock=listener)
        try:
            return await aio.wait_for(aio.gather(*(client(i) for i in range(50))), BOUND)
        finally:
            server.close()
            await server.wait_closed()

    assert aio.run(main()) == [b"HELLO %d\n" % i for i in range(50)]
    assert listener.fileno() == -1


def test_open_connection_to_a_tcp_server() -> None:
    async def main() -> None:
        gone = aio.Event()

        async def handler(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
            line = await reader.readline()
            if line == b"bye\n":
                writer.close()  # the client writes on: its drain must raise
                gone.set()
                return
            writer.write(b"got " + line)
            await writer.drain()
            writer.close()

        server = await aio.start_server(handler, "127.0.0.1", 0)
        try:
            port = server.sockets[0].getsockname()[1]
            reader, writer = await aio.open_connection("127.0.0.1", port)
            writer.write(b"ping\n")
            await writer.drain()
            assert await aio.wait_for(reader.read(), BOUND) == b"got ping\n"
            writer.close()

            reader, writer = await aio.open_connection("127.0.0.1", port)
            writer.write(b"bye\n")
            await aio.wait_for(gone.wait(), BOUND)
            with pytest.raises((BrokenPipeError, ConnectionResetError)):
                for _ in range(1000):
                    writer.write(b"x" * 65536)
                    await writer.drain()
                    await aio.sleep(0.001)
            writer.close()
        finally:
            server.close()

    aio.run(main())
