"""Bash contexts: one persistent ``bash`` per context.

Each cell is written to a private file and ``source``d by the context's shell, so ``cd``,
variables, functions and aliases persist from cell to cell (like a terminal, or Jupyter's bash
kernel). After the cell, the shell prints an end marker with the exit status on stdout and one
on stderr; the cell is over when both have been read, which keeps all of its output in order.

Interrupting sends SIGINT to the shell's process group: the running program gets it, and the
shell's INT trap ``return``s from the ``source``, ending the cell (status 130) with the
shell and its state intact. A non-zero exit status is reported as an error.
"""

from __future__ import annotations

import asyncio
import codecs
import os
import re
import secrets
import shlex
import shutil
import signal
import tempfile

from sandhold.interpreter import outputs
from sandhold.interpreter.contexts import Job
from sandhold.interpreter.process_context import ProcessContext

MARK = b"\x1e"
INT_TRAP = "trap 'return 130 2>/dev/null' INT"


class _Stream:
    """Splits one output stream at the cell's end marker, decoding UTF-8 incrementally."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.buf = b""
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.marker: bytes | None = None
        self.finished = False
        self.tail = b""  # what followed the marker (e.g. the exit status)

    def reset(self, marker: bytes) -> None:
        self.marker = marker
        self.finished = False
        self.tail = b""
        self.buf = b""
        self.decoder.reset()

    @property
    def complete(self) -> bool:
        # stdout's marker is followed by "<status>\x1e", which may arrive in a later read.
        return self.finished and (self.name != "stdout" or MARK in self.tail)

    def feed(self, data: bytes) -> str:
        """Returns the text that belongs to the cell, holding back a possible partial marker."""
        if self.finished:
            if not self.complete:
                self.tail += data
            return ""  # otherwise: output after the cell ended (a background job)
        if self.marker is None:
            return ""
        self.buf += data
        idx = self.buf.find(self.marker)
        if idx >= 0:
            out, self.tail = self.buf[:idx], self.buf[idx + len(self.marker) :]
            self.buf = b""
            self.finished = True
            return self.decoder.decode(out, final=True)
        keep = 0
        last = self.buf.rfind(MARK)
        if last >= 0 and len(self.buf) - last < len(self.marker):
            keep = len(self.buf) - last
        out = self.buf[: len(self.buf) - keep]
        self.buf = self.buf[len(self.buf) - keep :]
        return self.decoder.decode(out)


class BashContext(ProcessContext):
    language = "bash"

    def __init__(self, context_id: str, cwd: str, env: dict[str, str]) -> None:
        super().__init__(context_id, cwd, env)
        self._dir: str | None = None
        self._streams = {"stdout": _Stream("stdout"), "stderr": _Stream("stderr")}
        self._done: asyncio.Event | None = None

    async def _start(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="sandhold-bash-")
        bash = shutil.which("bash") or "/bin/bash"
        await self._spawn([bash, "--noprofile", "--norc", "-s"])
        assert self.proc is not None and self.proc.stdout and self.proc.stderr
        self._pump(self.proc.stdout, lambda b: self._on_output("stdout", b))
        self._pump(self.proc.stderr, lambda b: self._on_output("stderr", b))

    def _after_stop(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        if self._done is not None:
            self._done.set()

    def _on_output(self, name: str, data: bytes) -> None:
        stream = self._streams[name]
        text = stream.feed(data)
        if text and self.job is not None:
            self.job.emit(outputs.stream(name, text))
        if all(s.complete for s in self._streams.values()) and self._done is not None:
            self._done.set()

    async def _interrupt(self) -> None:
        self._signal_group(signal.SIGINT)

    def _command(self, path: str, token: str, env_vars: dict[str, str]) -> str:
        parts = [INT_TRAP]
        if env_vars:
            names = " ".join(env_vars)
            # Remember the previous values (declare -p prints only the set ones), export the
            # cell's values, and put everything back afterwards.
            parts.append(f"__sandhold_env=$(declare -p {names} 2>/dev/null)")
            parts.append("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env_vars.items()))
        parts.append(f"source {shlex.quote(path)} </dev/null")
        parts.append("__sandhold_rc=$?")
        if env_vars:
            parts.append(
                f'unset {" ".join(env_vars)}; eval "$__sandhold_env"; unset __sandhold_env'
            )
        parts.append(f"printf '\\036{token}:%d\\036' \"$__sandhold_rc\"")
        parts.append(f"printf '\\036{token}\\036' >&2")
        return "; ".join(parts) + "\n"

    async def _run(self, job: Job) -> None:
        if self.proc is None or self.proc.stdin is None or self._dir is None:
            await self.ensure_started()
        assert self.proc is not None and self.proc.stdin is not None and self._dir is not None
        self.count += 1
        job.emit(outputs.number_of_executions(self.count))
        token = secrets.token_hex(8)
        path = os.path.join(self._dir, f"cell-{self.count}.sh")
        with open(path, "w", encoding="utf-8") as f:
            f.write(job.code if job.code.endswith("\n") else job.code + "\n")
        self._streams["stdout"].reset(MARK + f"{token}:".encode())
        self._streams["stderr"].reset(MARK + token.encode() + MARK)
        self._done = asyncio.Event()
        self.job = job
        generation = self.generation
        try:
            self.proc.stdin.write(self._command(path, token, job.env_vars).encode())
            await self.proc.stdin.drain()
            finished = await self.wait_finished(self._done, job)
        finally:
            self.job = None
            if self.generation == generation:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        if finished:
            status = self._exit_status()
            if status:
                job.emit(outputs.error("CommandExitError", f"exit status {status}"))

    def _exit_status(self) -> int:
        m = re.match(rb"(\d+)\x1e", self._streams["stdout"].tail)
        return int(m.group(1)) if m else 0
