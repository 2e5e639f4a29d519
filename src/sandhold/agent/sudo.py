"""``sudo`` inside the sandbox, as E2B's base has it (passwordless, for everyone inside): setuid
binaries grant nothing here (no_new_privs), so the ``sudo`` command of the template
(``runtime/templates/store.py`` SUDO_CLIENT) asks the agent, over an abstract unix socket (one per
network namespace: only the sandbox's own processes reach it), to run a command as another
user with the caller's stdin, stdout and stderr (passed as descriptors). The command runs as any
command of the agent's does: root inside, no capabilities, the sandbox's seccomp, its uid range:
no one outside. It ends with the caller: a caller gone (its connection closed) kills it.

Request (one message, the three descriptors attached): JSON ``{"argv", "user", "cwd", "env",
"login"}``. Answer: JSON ``{"exit": status}`` or ``{"error": message}``.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import signal
import socket
from typing import Any

from . import aio, log
from .config import AgentConfig
from .process import spawn_spec
from .process_table import ProcessManager
from .rpc import RpcError
from .users import lookup_user

ADDRESS = "\0sandhold-sudo"  # abstract: in the sandbox's network namespace only
MAX_REQUEST = 256 << 10


class SudoServer:
    def __init__(self, config: AgentConfig, manager: ProcessManager) -> None:
        self.config = config
        self.manager = manager
        self._sock: socket.socket | None = None
        self._tasks: set[aio.Task[None]] = set()

    async def start(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(ADDRESS)
        except OSError as e:  # another agent in this namespace: a test outside a sandbox
            log.warning("sudo is not served: %s", e)
            sock.close()
            return
        sock.listen(64)
        sock.setblocking(False)
        self._sock = sock
        self._spawn(self._accept(sock))

    def _spawn(self, coro: Any) -> None:
        task = aio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, sock: socket.socket) -> None:
        while True:
            conn, _ = await aio.sock_accept(sock)
            conn.setblocking(False)
            self._spawn(self._serve(conn))

    async def _serve(self, conn: socket.socket) -> None:
        fds: list[int] = []
        with conn:
            try:
                req, fds = await _receive(conn)
                status = await self._run(conn, req, fds)
                answer: dict[str, Any] = {"exit": status}
            except (RpcError, ValueError, KeyError, TypeError) as e:
                answer = {"error": e.message if isinstance(e, RpcError) else str(e)}
            except OSError as e:
                answer = {"error": f"sudo: {e.strerror or e}"}
            finally:
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            with contextlib.suppress(OSError):
                await aio.sock_sendall(conn, json.dumps(answer).encode())

    async def _run(self, conn: socket.socket, req: dict[str, Any], fds: list[int]) -> int:
        if len(fds) != 3:
            raise ValueError("sudo: the caller's stdin, stdout and stderr are needed")
        name = str(req.get("user") or "root")
        user = lookup_user(name)
        if user is None:
            raise ValueError(f"sudo: unknown user {name}")
        argv = [str(a) for a in req.get("argv") or []]
        if req.get("login") or not argv:  # -i / -s: the user's shell, a login one for -i
            shell = user.shell or "/bin/sh"
            login = ["-l"] if req.get("login") else []
            argv = [shell, *login, *(["-c", " ".join(argv)] if argv else [])]
        env = {str(k): str(v) for k, v in (req.get("env") or {}).items()}
        msg = {
            "process": {
                "cmd": argv[0],
                "args": argv[1:],
                "envs": env,
                "cwd": str(req.get("cwd") or ""),
            },
            "stdin": True,
        }
        spec, _ = spawn_spec(msg, user, self.config)
        spec.stdio = (fds[0], fds[1], fds[2])
        pid, ended = await self.manager.start_unlisted(spec)
        gone = aio.ensure_future(_closed(conn))
        try:
            waits: set[aio.Future[Any]] = {ended, gone}
            await aio.wait(waits, return_when=aio.FIRST_COMPLETED)
            if not ended.done():  # the caller went away: so does its command
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
            status = await ended
        finally:
            gone.cancel()
        code = os.waitstatus_to_exitcode(status)
        return 128 - code if code < 0 else code  # killed by a signal: as a shell says it


async def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    await aio.wait_fd(conn.fileno(), write=False)
    fds = array.array("i")
    data, anc, _flags, _addr = conn.recvmsg(MAX_REQUEST, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    req = json.loads(data)
    if not isinstance(req, dict):
        raise ValueError("sudo: a JSON object is expected")
    return req, list(fds)


async def _closed(conn: socket.socket) -> None:
    """Returns when the caller has closed its end (nothing more is ever sent)."""
    while await aio.sock_recv(conn, 1):
        pass
