"""An ASGI app served by uvicorn on a thread of the test, on a loopback port of its own: the
stand-ins for remote services (a control plane, a compromised gateway)."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn

from tests.support.e2b_server import listen


class ThreadServer:
    def __init__(self, app: Any, what: str = "the server") -> None:
        self.what = what
        self.sock = listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, f"{self.what} did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
