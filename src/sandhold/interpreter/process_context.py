"""Contexts backed by one long-lived child process (node, bash): spawning, output pumping and
killing its whole process group."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from abc import abstractmethod
from collections.abc import Callable

from sandhold.interpreter.contexts import Context, Job

log = logging.getLogger(__name__)

READ_CHUNK = 64 * 1024
COALESCE_S = 0.01
# Generous: a cell may print megabytes in one line (a JSON dump, a base64 blob).
LINE_LIMIT = 256 * 1024 * 1024


class ProcessContext(Context):
    def __init__(self, context_id: str, cwd: str, env: dict[str, str]) -> None:
        super().__init__(context_id, cwd, env)
        self.proc: asyncio.subprocess.Process | None = None
        self.job: Job | None = None
        self.count = 0
        self._tasks: list[asyncio.Task[None]] = []

    async def _spawn(self, argv: list[str], pass_fds: tuple[int, ...] = ()) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=self.cwd,
            env=self.env,
            pass_fds=pass_fds,
            # Its own process group: interrupts and kills reach what the cell started too.
            start_new_session=True,
            limit=LINE_LIMIT,
        )

    def _pump(self, stream: asyncio.StreamReader, on_data: Callable[[bytes], None]) -> None:
        async def pump() -> None:
            while True:
                data = await stream.read(READ_CHUNK)
                if not data:
                    return
                # Programs write a line in several small writes; gather what follows within a
                # few milliseconds so the client gets lines, not fragments.
                while len(data) < READ_CHUNK:
                    try:
                        more = await asyncio.wait_for(stream.read(READ_CHUNK), COALESCE_S)
                    except TimeoutError:
                        break
                    if not more:
                        break
                    data += more
                on_data(data)

        self._tasks.append(asyncio.create_task(pump()))

    def _alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    async def _stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                await proc.wait()
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        self._after_stop()

    def _after_stop(self) -> None:
        pass

    @abstractmethod
    async def _start(self) -> None: ...
