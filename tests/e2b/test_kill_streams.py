"""A sandbox killed while streams are open: each stream ends the way the official SDK reports a
killed sandbox (``SandboxNotRunningException``: "... killed or reached its end of life ..."), and
the server logs no broken response. The stream is cut, as E2B's proxy resets a dead sandbox's
stream: the SDK probes ``/health`` (502) and says the sandbox was killed (the JavaScript SDK
probes on a cut connection only: tests/js)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox, SandboxNotRunningException

from tests.support.e2b_server import Server

# An HTTP service inside the sandbox whose response never ends: a plain (non-Connect) stream.
TICKER = r"""
import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while True:
            self.wfile.write(b"5\r\ntick\n\r\n"); self.wfile.flush(); time.sleep(0.1)
    def log_message(self, *args): pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), H).serve_forever()
"""
BROKEN = ("ASGI callable returned without completing response", "Traceback", "Exception in ASGI")


@pytest.fixture
def clean_log(server: Server) -> Iterator[None]:
    """Fails the test if the server logged a broken response or a traceback meanwhile."""
    offset = server.log.stat().st_size
    yield
    time.sleep(0.5)  # the server logs a broken response once its handler has returned
    with open(server.log, "rb") as f:
        f.seek(offset)
        written = f.read().decode(errors="replace")
    assert not [line for line in written.splitlines() if any(b in line for b in BROKEN)], written


def kill_soon(sbx: Sandbox, after: float = 1.0) -> threading.Timer:
    timer = threading.Timer(after, sbx.kill)
    timer.start()
    return timer


def assert_killed(e: BaseException) -> None:
    assert isinstance(e, SandboxNotRunningException), repr(e)
    assert "killed or reached its end of life" in str(e), str(e)


@pytest.mark.usefixtures("clean_log")
def test_background_command_being_waited_for() -> None:
    sbx = Sandbox.create(timeout=120)
    handle = sbx.commands.run("sleep 60", background=True)
    timer = kill_soon(sbx)
    with pytest.raises(SandboxNotRunningException) as exc:
        handle.wait()
    assert_killed(exc.value)
    timer.join()


@pytest.mark.usefixtures("clean_log")
def test_foreground_command_with_output() -> None:
    sbx = Sandbox.create(timeout=120)
    seen: list[str] = []
    timer = kill_soon(sbx)
    with pytest.raises(SandboxNotRunningException) as exc:
        sbx.commands.run("while true; do echo tick; sleep 0.1; done", on_stdout=seen.append)
    assert_killed(exc.value)
    timer.join()
    assert seen and set("".join(seen).split()) == {"tick"}  # every chunk whole, up to the end


@pytest.mark.usefixtures("clean_log")
def test_watch_stream_and_polled_watch() -> None:
    async def streamed() -> BaseException | None:
        sbx = await AsyncSandbox.create(timeout=120)
        ended = asyncio.Event()
        errors: list[BaseException | None] = []

        def on_exit(error: BaseException | None) -> None:
            errors.append(error)
            ended.set()

        await sbx.files.watch_dir("/home/user", lambda _e: None, on_exit=on_exit)
        await sbx.files.write("/home/user/a.txt", "a")
        await asyncio.sleep(0.5)
        await sbx.kill()
        await asyncio.wait_for(ended.wait(), 30)
        return errors[0]

    error = asyncio.run(streamed())
    assert error is not None
    assert_killed(error)

    sbx = Sandbox.create(timeout=120)  # the sync SDK polls its watcher
    watcher = sbx.files.watch_dir("/home/user")
    sbx.files.write("/home/user/b.txt", "b")
    sbx.kill()
    with pytest.raises(SandboxNotRunningException):
        watcher.get_new_events()


@pytest.mark.usefixtures("clean_log")
def test_plain_http_stream_through_a_port(server: Server) -> None:
    sbx = Sandbox.create(timeout=120)
    sbx.files.write("/tmp/ticker.py", TICKER)
    sbx.commands.run("python3 /tmp/ticker.py", background=True)
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000",
               "X-Access-Token": sbx._envd_access_token or ""}  # fmt: skip
    deadline = time.monotonic() + 10
    with httpx.Client(base_url=server.url, timeout=30) as c:
        while True:
            with c.stream("GET", "/", headers=headers) as r:
                if r.status_code == 502:  # not listening yet
                    assert time.monotonic() < deadline, r.read()
                    time.sleep(0.1)
                    continue
                chunks = r.iter_bytes()
                assert next(chunks).startswith(b"tick")
                timer = kill_soon(sbx, 0.3)
                # The only signal plain HTTP has: the connection closes before the body's end.
                with pytest.raises(httpx.RemoteProtocolError):
                    for _ in chunks:
                        pass
                break
    timer.join()  # the kill has returned: the sandbox is gone, not going
    assert not sbx.is_running()
