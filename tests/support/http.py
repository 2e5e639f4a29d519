"""HTTP helpers of the tests: waiting for a server to answer, and raw HTTP over a socket for
what an HTTP client library would not send (a request that announces a huge body and sends
only its first MiB)."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable

import httpx


def answers(url: str, timeout: float, running: Callable[[], bool] = lambda: True) -> bool:
    """Whether GET ``url`` answers 200 before ``timeout`` s pass or ``running()`` turns false."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and running():
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    return False


def announced(
    port: int, method: str, path: str, size: int, headers: dict[str, str], chunked: bool = False
) -> bytes:
    """The answer to a request that announces a ``size``-byte body (by its Content-Length, or
    chunks of 1 MiB sent for as long as the server reads them) and sends its first MiB only: a
    server that read the body whole before answering would keep waiting, and the socket time
    out."""
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    mib = b"[" + b" " * ((1 << 20) - 1)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        if chunked:
            s.sendall(f"{head}Transfer-Encoding: chunked\r\n\r\n".encode())
            try:
                for _ in range(size >> 20):
                    s.sendall(b"100000\r\n" + mib + b"\r\n")
            except OSError:  # (the server answered and closed: the rest is not read)
                pass
        else:
            s.sendall(f"{head}Content-Length: {size}\r\n\r\n".encode() + mib)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _length(answer):
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
        return answer


def _length(answer: bytes) -> int:
    m = re.search(rb"content-length: (\d+)", answer.lower())
    return int(m[1]) if m else 0
