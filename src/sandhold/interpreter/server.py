"""The code-interpreter service: E2B's port-49999 API (``/execute``, ``/contexts``, ``/health``).

It runs inside the sandbox as root (HOME=/root), in ``/home/user``, as E2B's Jupyter does, started
by the agent at boot::

    PYTHONPATH=/opt/sandhold/interpreter:/opt/sandhold/python \\
        /usr/bin/python3 -m sandhold.interpreter.server --port 49999 --cwd /home/user

and depends only on what the ``code-interpreter-v1`` template installs (starlette, uvicorn,
jupyter_client, ipykernel) plus ``/usr/bin/node`` for JavaScript.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandhold.interpreter import outputs
from sandhold.interpreter.bash_context import BashContext
from sandhold.interpreter.contexts import (
    ENV_PATH,
    READY_PATH,
    Context,
    ContextError,
    ContextManager,
    Job,
    normalize_language,
)
from sandhold.interpreter.java_context import JavaContext
from sandhold.interpreter.node_context import NodeContext, TypeScriptContext
from sandhold.interpreter.python_kernel import PythonContext
from sandhold.interpreter.r_kernel import RContext

log = logging.getLogger("sandhold.interpreter")

KEEPALIVE_S = 5.0
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FACTORIES = {
    "python": PythonContext,
    "javascript": NodeContext,
    "typescript": TypeScriptContext,
    "bash": BashContext,
    "r": RContext,
    "java": JavaContext,
}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


class Execution:
    """One ``/execute`` request: runs in its own task, so a client that goes away only
    *abandons* it (the context interrupts the code) instead of cancelling it half-way."""

    _background: set[asyncio.Task[None]] = set()

    def __init__(self, ctx: Context, code: str, env_vars: dict[str, str]) -> None:
        self.ctx = ctx
        self.queue: asyncio.Queue[outputs.Event] = asyncio.Queue()
        self.job = Job(code=code, env_vars=env_vars, emit=self.queue.put_nowait)
        self.started = False
        self.task = asyncio.create_task(self._run(), name=f"execute-{ctx.id}")
        Execution._background.add(self.task)
        self.task.add_done_callback(Execution._background.discard)

    async def _run(self) -> None:
        try:
            async with self.ctx.lock:
                self.started = True
                await self.ctx.run(self.job)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("execution in context %s failed", self.ctx.id)
            self.job.emit(outputs.error("InternalError", f"{type(e).__name__}: {e}"))
        finally:
            self.queue.put_nowait(outputs.END_OF_EXECUTION)

    def abandon(self) -> None:
        if self.task.done():
            return
        if not self.started:
            self.task.cancel()  # still queued behind another execution: just drop it
        else:
            self.job.abandoned.set()

    async def next_lines(self) -> tuple[bytes, bool]:
        """The NDJSON lines of every event ready now (waiting for one first, a keepalive line
        after KEEPALIVE_S without), and whether the execution has ended with them."""
        try:
            events = [await asyncio.wait_for(self.queue.get(), KEEPALIVE_S)]
        except TimeoutError:
            return outputs.line(outputs.KEEPALIVE), False
        while events[-1] is not outputs.END_OF_EXECUTION and not self.queue.empty():
            events.append(self.queue.get_nowait())
        return b"".join(map(outputs.line, events)), events[-1] is outputs.END_OF_EXECUTION


class ExecutionResponse:
    """The NDJSON stream of one execution, as an ASGI response. What is ready is sent in one
    write: an execution whose events are all ready by its first one (a short cell) is answered
    in one body (headers, then that body) instead of one chunk per event; a longer one streams
    (chunked), as it runs. A client that goes away abandons the execution (it is interrupted)."""

    media_type = "application/x-ndjson"

    def __init__(self, execution: Execution) -> None:
        self.execution = execution

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        watcher = asyncio.create_task(self._abandon_on_disconnect(receive))
        try:
            body, ended = await self.execution.next_lines()
            headers = [(b"content-type", self.media_type.encode())]
            if ended:
                headers.append((b"content-length", str(len(body)).encode()))
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": not ended})
            while not ended:
                body, ended = await self.execution.next_lines()
                await send({"type": "http.response.body", "body": body, "more_body": not ended})
        finally:
            # A no-op once the execution ended; on a client disconnect (timeout, kill, ctrl-c)
            # or a failed send this is what stops the code.
            watcher.cancel()
            self.execution.abandon()

    async def _abandon_on_disconnect(self, receive: Any) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.execution.abandon()


def _manager(request: Request) -> ContextManager:
    return request.app.state.contexts  # type: ignore[no-any-return]


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise ContextError(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ContextError("the request body must be a JSON object")
    return body


def _optional_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise ContextError(f"{key!r} must be a string or null")
    return value


async def execute(request: Request) -> Response:
    contexts = _manager(request)
    try:
        body = await _json_body(request)
        code = body.get("code")
        if not isinstance(code, str):
            raise ContextError("'code' (a string) is required")
        context_id = _optional_str(body, "context_id")
        language = _optional_str(body, "language")
        env_vars = body.get("env_vars") or {}
        if not isinstance(env_vars, dict) or not all(
            isinstance(k, str) and ENV_KEY_RE.match(k) and isinstance(v, str)
            for k, v in env_vars.items()
        ):
            raise ContextError("'env_vars' must map variable names to string values")
        if context_id and language:
            raise ContextError("give 'context_id' or 'language', not both")
        if context_id:
            ctx = contexts.get(context_id)
        else:
            ctx = contexts.default_for(normalize_language(language))
    except ContextError as e:
        return _error(e.status, str(e))
    execution = Execution(ctx, code, env_vars)
    return ExecutionResponse(execution)  # type: ignore[return-value]


async def create_context(request: Request) -> Response:
    try:
        body = await _json_body(request)
        ctx = await _manager(request).create(
            _optional_str(body, "language"), _optional_str(body, "cwd")
        )
    except ContextError as e:
        return _error(e.status, str(e))
    return JSONResponse(ctx.info())


async def list_contexts(request: Request) -> Response:
    return JSONResponse([c.info() for c in _manager(request).list()])


async def delete_context(request: Request) -> Response:
    try:
        await _manager(request).remove(request.path_params["context_id"])
    except ContextError as e:
        return _error(e.status, str(e))
    return Response(status_code=204)


async def restart_context(request: Request) -> Response:
    try:
        ctx = _manager(request).get(request.path_params["context_id"])
        await ctx.restart()
    except ContextError as e:
        return _error(e.status, str(e))
    except Exception as e:
        log.exception("restarting context failed")
        return _error(500, f"restarting the context failed: {e}")
    return Response(status_code=204)


async def set_env(request: Request) -> Response:
    """The sandbox's env, from the agent after a warm start (the service and its default
    kernel were started from the template's checkpoint, before the sandbox had one)."""
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "the body must be JSON")
    env = body.get("env") if isinstance(body, dict) else None
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        return _error(400, "'env' must map variable names to string values")
    _manager(request).set_env(env)
    return Response(status_code=204)


async def health(request: Request) -> Response:
    return JSONResponse("OK")


async def ready(request: Request) -> Response:
    """Answers once the default Python kernel has started (what a warm template waits for
    before its checkpoint is taken)."""
    try:
        await _manager(request).default_for("python").ensure_started()
    except Exception as e:
        return _error(503, f"the default Python kernel did not start: {e}")
    return JSONResponse("OK")


def create_app(
    default_cwd: str | None = None, *, eager: tuple[str, ...] = ("python",)
) -> Starlette:
    cwd = default_cwd or os.environ.get("HOME") or "/"

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        manager = ContextManager(cwd, dict(FACTORIES))
        app.state.contexts = manager
        manager.start_defaults(eager)
        try:
            yield
        finally:
            await manager.close()

    routes = [
        Route("/health", health, methods=["GET"]),
        Route(READY_PATH, ready, methods=["GET"]),
        Route(ENV_PATH, set_env, methods=["POST"]),
        Route("/execute", execute, methods=["POST"]),
        Route("/contexts", create_context, methods=["POST"]),
        Route("/contexts", list_contexts, methods=["GET"]),
        Route("/contexts/{context_id}", delete_context, methods=["DELETE"]),
        Route("/contexts/{context_id}/restart", restart_context, methods=["POST"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Sandhold code-interpreter service")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=49999)
    parser.add_argument("--cwd", default=None, help="default cwd of contexts (default: $HOME)")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument(
        "--lazy", action="store_true", help="do not start the default Python kernel at boot"
    )
    args = parser.parse_args(argv)
    # Contexts inherit it. On E2B the SDK's `user` reads and overwrites whatever a cell (root)
    # made, because envd does file I/O as root; our agent acts as that user, so what cells make
    # is left readable and writable by everyone (only root and `user` live in a sandbox).
    os.umask(0)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    app = create_app(args.cwd, eager=() if args.lazy else ("python",))
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        http="h11",
        loop="asyncio",
        lifespan="on",
        # Clients (and the host's proxy) pool connections for minutes; closing an idle one
        # just before it is reused turns into a spurious error on their side.
        timeout_keep_alive=300,
        access_log=False,
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
