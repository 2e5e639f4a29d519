"""Getting out of the way of a checkpoint (CRIU, driven by the host), and carrying on after it.

CRIU cannot take along what the host handed the agent: its listening socket (made in the host's
network namespace, which CRIU's per-namespace socket lookup does not search), the connections
accepted on it, and stdout/stderr (the host's log file). So, asked by the host
(``POST /sandhold/quiesce``, a path the data plane never forwards), the agent answers, stops
listening, closes every connection and points stdout/stderr at ``/dev/null``. Then it waits for
the host to hand it a new listening socket and log file: the host listens on
``/run/sandbox-handoff/agent.sock`` (a read-only bind of a small tmpfs of the sandbox's own),
the agent connects, and the host, having checked by ``SO_PEERCRED`` that the peer is the agent's
own process, sends both descriptors over the connection. The same handoff serves a restore from
the checkpoint and a checkpoint that failed (the agent then carries on where it was).

A sandbox started from another's checkpoint (a warm template) is handed a third descriptor too:
its own configuration (``agent.json``: env, default user and workdir, file view), which the agent
takes before answering ``1`` on the connection (``0``: it could not), so that the create returns
only once the sandbox is its own.
"""

from __future__ import annotations

import array
import os
import socket
from collections.abc import Awaitable, Callable

from . import aio, log

QUIESCE_PATH = "/sandhold/quiesce"
HANDOFF = "/run/sandbox-handoff/agent.sock"
POLL_S = 0.002  # while it waits for the handoff: a restore waits on it too


def _receive(path: str) -> tuple[socket.socket, int, int | None, socket.socket] | None:
    """The listening socket, log file and (a warm start) configuration the host hands over at
    ``path``, if it is there, with the connection to acknowledge them on."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        conn.settimeout(5)
        fds = array.array("i")
        _msg, anc, _flags, _addr = conn.recvmsg(1, socket.CMSG_SPACE(3 * fds.itemsize))
    except OSError:
        conn.close()
        return None
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    if len(fds) not in (2, 3):
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    return socket.socket(fileno=fds[0]), fds[1], fds[2] if len(fds) == 3 else None, conn


async def quiesce(
    stop: Callable[[], Awaitable[None]],
    serve: Callable[[socket.socket], Awaitable[None]],
    rebind: Callable[[int], Awaitable[bool]],
) -> None:
    """``stop`` closes the listening socket and every connection; once the host has handed
    over new ones, ``rebind`` takes the configuration if one came and ``serve`` listens."""
    await stop()
    log.disable(True)  # stderr goes nowhere until the handoff
    null = os.open("/dev/null", os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(null, fd)
    os.close(null)
    while True:
        await aio.sleep(POLL_S)
        if os.path.exists(HANDOFF) and (got := _receive(HANDOFF)) is not None:
            break
    sock, logfile, config, conn = got
    for fd in (1, 2):
        os.dup2(logfile, fd)
    os.close(logfile)
    log.disable(False)
    with conn:
        ok = await rebind(config) if config is not None else True
        await serve(sock)
        try:
            conn.sendall(b"1" if ok else b"0")
        except OSError:
            log.warning("the host left before the handoff was acknowledged")
    log.info("handed a new socket after a checkpoint; listening again")
