"""Entry point of the in-sandbox agent.

Started as ``/usr/bin/python3 -I -S /opt/sandhold/lib/sandhold/runtime/agent/__main__.py
--config /run/sandhold/agent.json``: isolated mode, no site-packages, so the directory four
levels up (which holds the ``sandhold`` and ``h11`` packages) goes on sys.path first.
"""

import os
import socket
import sys


def _bootstrap() -> None:
    lib = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    )
    if lib not in sys.path:
        sys.path.insert(0, lib)
    # asyncio imports ssl if it can, which maps OpenSSL (~2.5 MiB per agent); it works without
    # it, and nothing here speaks TLS.
    sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]
    # Descriptors 0-2 must exist, or a new pipe could land on them and be clobbered by dup2.
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)


def listen(path: str) -> socket.socket:
    """Bind and listen on the agent socket (0600 from the first moment)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old_umask)
    sock.listen(1024)
    return sock


def signal_ready(fd: int | None) -> None:
    if fd is not None:
        try:
            os.write(fd, b"ready\n")
        finally:
            os.close(fd)


def _parse(argv: list[str]) -> str:
    if len(argv) == 2 and argv[0] == "--config":
        return argv[1]
    if len(argv) == 1 and argv[0].startswith("--config="):
        return argv[0].split("=", 1)[1]
    sys.stderr.write("usage: __main__.py --config FILE\n")
    raise SystemExit(2)


if __name__ == "__main__":
    _bootstrap()
    from sandhold.runtime.agent.config import AgentConfig

    config = AgentConfig.load(_parse(sys.argv[1:]))
    sock = listen(config.socket)
    # Ready as soon as connections are accepted: they wait in the backlog while the rest of the
    # agent (asyncio is most of its start-up time) is imported.
    signal_ready(config.ready_fd)
    config.ready_fd = None
    from sandhold.runtime.agent.server import main

    raise SystemExit(main(config, sock))
