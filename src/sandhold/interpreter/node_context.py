"""JavaScript contexts: one persistent node process each, running ``js_runner.js``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import uuid
from pathlib import Path
from typing import Any

from sandhold.interpreter import outputs
from sandhold.interpreter.contexts import Job
from sandhold.interpreter.process_context import LINE_LIMIT, ProcessContext

log = logging.getLogger(__name__)

RUNNER = Path(__file__).with_name("js_runner.js")
START_TIMEOUT_S = 20.0


def node_binary() -> str:
    return shutil.which("node") or "/usr/bin/node"


class NodeContext(ProcessContext):
    language = "javascript"
    runner_flags: tuple[str, ...] = ()

    def __init__(self, context_id: str, cwd: str, env: dict[str, str]) -> None:
        super().__init__(context_id, cwd, env)
        self._events: asyncio.StreamReader | None = None
        self._events_transport: asyncio.BaseTransport | None = None
        self._ready_event: asyncio.Event | None = None
        self._cell_id: str | None = None
        self._done: asyncio.Event | None = None

    async def _start(self) -> None:
        read_fd, write_fd = os.pipe()
        try:
            await self._spawn(
                [node_binary(), str(RUNNER), "--events-fd", str(write_fd), *self.runner_flags],
                pass_fds=(write_fd,),
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        assert self.proc is not None and self.proc.stdout and self.proc.stderr
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=LINE_LIMIT)
        self._events_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", buffering=0)
        )
        self._events = reader
        self._ready_event = asyncio.Event()
        self._tasks.append(asyncio.create_task(self._read_events(reader)))
        # Output that bypasses process.stdout (child processes with inherited stdio).
        self._pump(self.proc.stdout, lambda b: self._raw("stdout", b))
        self._pump(self.proc.stderr, lambda b: self._raw("stderr", b))
        try:
            await asyncio.wait_for(self._ready_event.wait(), START_TIMEOUT_S)
        except TimeoutError:
            await self._stop()
            raise RuntimeError("node did not start in time") from None

    def _after_stop(self) -> None:
        if self._events_transport is not None:
            self._events_transport.close()
            self._events_transport = None
        if self._done is not None:
            self._done.set()

    def _raw(self, name: str, data: bytes) -> None:
        if self.job is not None:
            self.job.emit(outputs.stream(name, data.decode(errors="replace")))
        else:
            log.debug("context %s %s outside a cell: %r", self.id, name, data[:200])

    async def _read_events(self, reader: asyncio.StreamReader) -> None:
        while True:
            raw = await reader.readline()
            if not raw:
                return
            try:
                event = json.loads(raw)
            except ValueError:
                log.warning("context %s: bad event %r", self.id, raw[:200])
                continue
            self._on_event(event)

    def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "ready":
            if self._ready_event is not None:
                self._ready_event.set()
            return
        if event.get("id") != self._cell_id or self.job is None:
            return  # late output of an abandoned cell
        job = self.job
        if kind in ("stdout", "stderr"):
            job.emit(outputs.stream(kind, str(event.get("text", ""))))
        elif kind == "result":
            job.emit(outputs.result({"text/plain": event.get("text", "")}, is_main=True))
        elif kind == "error":
            job.emit(
                outputs.error(
                    str(event.get("name") or "Error"),
                    str(event.get("value", "")),
                    str(event.get("traceback", "")),
                )
            )
        elif kind == "done" and self._done is not None:
            self._done.set()

    async def _interrupt(self) -> None:
        if self.proc is not None:
            try:
                os.kill(self.proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass

    async def _run(self, job: Job) -> None:
        if self.proc is None or self.proc.stdin is None:
            await self.ensure_started()
        assert self.proc is not None and self.proc.stdin is not None
        self.count += 1
        job.emit(outputs.number_of_executions(self.count))
        self._cell_id = uuid.uuid4().hex
        self._done = asyncio.Event()
        self.job = job
        try:
            msg = {"id": self._cell_id, "code": job.code, "env": job.env_vars}
            self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
            await self.proc.stdin.drain()
            await self.wait_finished(self._done, job)
        finally:
            self.job = None
            self._cell_id = None


class TypeScriptContext(NodeContext):
    """TypeScript: each cell transpiled (TypeScript's own transpileModule: types erased, no type
    check, as ts-node's transpile-only) and run as a JavaScript cell of the same process."""

    language = "typescript"
    runner_flags = ("--typescript",)
