"""Entry point of the in-sandbox agent.

Started as ``/usr/bin/python3 -I -S /opt/sandhold/lib/sandhold/agent/__main__.py
--config-fd N --socket-fd N --ready-fd N`` (in a sandbox: descriptors the host opened) or
``--config FILE [--socket PATH]`` (tests on a host): isolated mode, no site-packages, so the
directory three levels up (which holds the ``sandhold`` and ``h11`` packages) goes on sys.path
first.
"""

import _socket  # the C module: `socket` alone imports enum and re (~10 ms on a slow core)
import os
import sys


def _bootstrap() -> None:
    lib = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if lib not in sys.path:
        sys.path.insert(0, lib)
    # Descriptors 0-2 must exist, or a new pipe could land on them and be clobbered by dup2.
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)


def listen(path: str) -> int:
    """Bind and listen on the agent socket (0600 from the first moment); returns its fd."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old_umask)
    sock.listen(1024)
    return sock.detach()


def signal_ready(fd: int | None) -> None:
    if fd is not None:
        try:
            os.write(fd, b"ready\n")
        finally:
            os.close(fd)


OPTIONS = ("--config", "--config-fd", "--socket", "--socket-fd", "--ready-fd")
USAGE = (
    "usage: __main__.py (--config FILE | --config-fd N) [--socket PATH | --socket-fd N] "
    "[--ready-fd N]\n"
)


def _parse(argv: list[str]) -> dict[str, str]:
    """With a socket and ``--ready-fd`` the agent is ready before it imports anything but ``os``
    (the host passes what the config file also says)."""
    opts: dict[str, str] = {}
    while len(argv) >= 2 and argv[0] in OPTIONS:
        opts[argv[0][2:]] = argv[1]
        argv = argv[2:]
    if argv or ("config" in opts) == ("config-fd" in opts) or {"socket", "socket-fd"} <= set(opts):
        sys.stderr.write(USAGE)
        raise SystemExit(2)
    return opts


if __name__ == "__main__":
    _bootstrap()
    opts = _parse(sys.argv[1:])
    early = ("socket" in opts or "socket-fd" in opts) and "ready-fd" in opts
    if early:
        # Ready as soon as connections are accepted: they wait in the backlog while the rest of
        # the agent (json, h11 and its own modules: most of its start-up time) is imported.
        listening = int(opts["socket-fd"]) if "socket-fd" in opts else listen(opts["socket"])
        signal_ready(int(opts["ready-fd"]))
    import socket

    from sandhold.agent.config import AgentConfig

    config = AgentConfig.load(int(opts["config-fd"]) if "config-fd" in opts else opts["config"])
    config.socket_owned = "socket-fd" not in opts
    if not early:
        listening = int(opts["socket-fd"]) if "socket-fd" in opts else listen(config.socket)
        signal_ready(config.ready_fd)
    config.ready_fd = None
    from sandhold.agent.server import main

    raise SystemExit(main(config, socket.socket(fileno=listening)))
