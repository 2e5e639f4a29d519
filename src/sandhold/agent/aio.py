"""The agent's event loop: the part of asyncio's API the agent uses, and nothing else.

Why not asyncio: every sandbox runs an agent, and asyncio with what it imports (inspect, ast,
logging, threading, concurrent.futures, subprocess, ...) is ~3.7 MiB of each agent's memory, a
third of an idle sandbox. These modules keep asyncio's names and its semantics where the agent
relies on them:
- tasks are coroutines stepped by one loop on one epoll (``aio_loop``); ``Task.cancel`` throws
  ``CancelledError`` (a BaseException) in at the task's ``await``;
- ``timeout`` turns its own cancellation into ``TimeoutError``; cancel requests are counted, as
  in asyncio, so a cancel from outside is never swallowed; ``wait_for`` awaits in the caller's
  task (as Python 3.12's);
- ``shield`` and ``wait`` never cancel what they wait for; ``gather`` cancels its awaitables
  when it is cancelled (``aio_sync``);
- sockets, streams and servers (``aio_net``).
"""

from .aio_loop import (
    CancelledError,
    Future,
    Loop,
    Task,
    TimerHandle,
    current_task,
    ensure_future,
    get_running_loop,
    run,
    sleep,
)
from .aio_net import (
    Server,
    StreamReader,
    StreamWriter,
    open_connection,
    open_unix_connection,
    sock_accept,
    sock_connect,
    sock_recv,
    sock_sendall,
    start_server,
    start_unix_server,
    wait_fd,
)
from .aio_sync import (
    FIRST_COMPLETED,
    Event,
    Lock,
    Queue,
    QueueEmpty,
    QueueFull,
    gather,
    shield,
    timeout,
    wait,
    wait_for,
)

__all__ = [
    "FIRST_COMPLETED",
    "CancelledError",
    "Event",
    "Future",
    "Lock",
    "Loop",
    "Queue",
    "QueueEmpty",
    "QueueFull",
    "Server",
    "StreamReader",
    "StreamWriter",
    "Task",
    "TimerHandle",
    "current_task",
    "ensure_future",
    "gather",
    "get_running_loop",
    "open_connection",
    "open_unix_connection",
    "run",
    "shield",
    "sleep",
    "sock_accept",
    "sock_connect",
    "sock_recv",
    "sock_sendall",
    "start_server",
    "start_unix_server",
    "timeout",
    "wait",
    "wait_fd",
    "wait_for",
]
