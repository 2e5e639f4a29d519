"""Java contexts: one JShell per context (``JShellRunner.java``, run by the JDK's source
launcher), declarations kept from cell to cell; a cell's last expression is its result."""

from __future__ import annotations

import asyncio
import base64
import shutil
import signal
from pathlib import Path

from sandhold.interpreter import outputs
from sandhold.interpreter.contexts import Job
from sandhold.interpreter.process_context import ProcessContext

RUNNER = Path(__file__).with_name("JShellRunner.java")
START_TIMEOUT_S = 60.0


def java_binary() -> str | None:
    return shutil.which("java")


class JavaContext(ProcessContext):
    language = "java"

    def __init__(self, context_id: str, cwd: str, env: dict[str, str]) -> None:
        super().__init__(context_id, cwd, env)
        self._up: asyncio.Event | None = None
        self._done: asyncio.Event | None = None

    async def _start(self) -> None:
        java = java_binary()
        if java is None:
            raise RuntimeError("Java is not installed in this sandbox (a JDK's java)")
        self._up = asyncio.Event()
        self.pending_env = {}  # a new JVM starts with self.env
        await self._spawn([java, "-Xshare:auto", "-XX:+UseSerialGC", str(RUNNER)])
        assert self.proc is not None and self.proc.stdout and self.proc.stderr
        self._tasks.append(asyncio.create_task(self._read(self.proc.stdout)))
        self._pump(self.proc.stderr, self._on_jvm_stderr)
        await asyncio.wait_for(self._up.wait(), START_TIMEOUT_S)

    def _on_jvm_stderr(self, data: bytes) -> None:  # the JVM's own warnings
        if self.job is not None:
            self.job.emit(outputs.stream("stderr", data.decode(errors="replace")))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            kind, *fields = line.split()
            text = [base64.b64decode(f).decode(errors="replace") for f in fields]
            if kind == b"READY" and self._up is not None:
                self._up.set()
            elif kind == b"D" and self._done is not None:
                self._done.set()
            elif self.job is None:
                continue
            elif kind in (b"O", b"X"):
                self.job.emit(outputs.stream("stdout" if kind == b"O" else "stderr", text[0]))
            elif kind == b"R":
                self.job.emit(outputs.result({"text/plain": text[0]}, is_main=True))
            elif kind == b"E":
                self.job.emit(outputs.error(*text[:3]))

    async def _interrupt(self) -> None:
        self._signal_group(signal.SIGINT)  # JShell's stop()

    def _after_stop(self) -> None:
        if self._done is not None:
            self._done.set()

    async def _run(self, job: Job) -> None:
        if self.proc is None or self.proc.stdin is None:
            await self.ensure_started()
        assert self.proc is not None and self.proc.stdin is not None
        self.count += 1
        job.emit(outputs.number_of_executions(self.count))
        code = job.code.encode()
        # Environment variables as system properties (JShellRunner.java): the context's new ones
        # from now on, the call's for this cell.
        env = [(b"P", k, v) for k, v in self.pending_env.items()]
        env += [(b"C", k, v) for k, v in job.env_vars.items()]
        self.pending_env = {}
        block = b"".join(b"%s %s %s\n" % (kind, _b64(k), _b64(v)) for kind, k, v in env)
        self._done = asyncio.Event()
        self.job = job
        try:
            self.proc.stdin.write(b"CELL %d %d\n" % (len(code), len(block)) + code + block)
            await self.proc.stdin.drain()
            await self.wait_finished(self._done, job)
        finally:
            self.job = None


def _b64(text: str) -> bytes:
    return base64.b64encode(text.encode())
