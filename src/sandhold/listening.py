"""Serving on a listening socket someone else bound (``--fd``): what it is really bound to, and
the socket option uvicorn does not set on it. Shared by ``sandhold serve`` and the gateway."""

from __future__ import annotations

import socket

from sandhold.errors import InvalidRequest


def listening_host(fd: int) -> str:
    """The address an inherited listening socket (``--fd``) is really bound to: what the bind
    check judges, whatever the host setting says. A unix socket counts as loopback."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as e:
        raise InvalidRequest(f"--fd {fd} is not an open socket: {e.strerror}") from None
    try:
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        if sock.type != socket.SOCK_STREAM or not listening:
            raise InvalidRequest(f"--fd {fd} is not a listening stream socket")
        if sock.family == socket.AF_UNIX:
            return "localhost"
        return str(sock.getsockname()[0])
    finally:
        sock.detach()  # the descriptor stays open for the server


def no_delay(fd: int) -> None:
    """Switch Nagle off on an inherited listening TCP socket (``--fd``). uvicorn opens the
    descriptor as AF_UNIX whatever it is, so asyncio does not set TCP_NODELAY on the connections
    it accepts; on Linux they inherit it from the listener."""
    sock = socket.socket(fileno=fd)
    try:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    finally:
        sock.detach()
