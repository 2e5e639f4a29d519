"""Python contexts: a real IPython kernel (ipykernel) per context, driven with jupyter_client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from jupyter_client import session as jupyter_session
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

from sandhold.interpreter import outputs
from sandhold.interpreter.contexts import Context, Job

log = logging.getLogger(__name__)

# jupyter_client parses every date of every message's headers (dateutil, a regex walk of both
# headers: ~0.1 ms a message pair here); the one this service reads, a stream's timestamp, is
# parsed where it is read instead (_timestamp).
jupyter_session.extract_dates = lambda obj: obj

STARTUP_FILE = Path(__file__).with_name("kernel_startup.py")
LAUNCHER_FILE = Path(__file__).with_name("kernel_launcher.py")
KERNEL_NAME = "sandhold-python"
START_TIMEOUT_S = 60.0


def kernel_argv() -> list[str]:
    startup = f"import runpy as _r; _r.run_path({str(STARTUP_FILE)!r}); del _r"
    return [
        sys.executable, str(LAUNCHER_FILE), "-f", "{connection_file}",
        f"--IPKernelApp.exec_lines={json.dumps([startup])}",
        # No sqlite history file per kernel: faster start, nothing written to $HOME.
        "--HistoryManager.enabled=False",
        # Tracebacks are read by models and people in logs, not by terminals.
        "--InteractiveShell.colors=nocolor",
        # ipykernel sleeps 0.5 ms after each execution, before its reply, in case output still
        # trails on IOPub; executions here end on the IOPub idle status, which comes after it.
        "--IPythonKernel._execute_sleep=0",
    ]  # fmt: skip


class _SpecManager(KernelSpecManager):
    """A context's kernel, described in code: no kernel.json to install or to find."""

    def __init__(self, spec: KernelSpec) -> None:
        super().__init__()
        self.spec = spec

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return self.spec


def _timestamp(msg: dict[str, Any]) -> str:
    date = msg.get("header", {}).get("date")
    if isinstance(date, str):
        try:
            return datetime.fromisoformat(date).isoformat()
        except ValueError:
            return date
    if isinstance(date, datetime):
        return date.isoformat()
    return str(date) if date else outputs.now_iso()


class _Pending:
    """Collects the IOPub messages of one execute request until the kernel is idle again."""

    def __init__(self, job: Job | None, displays_are_main: bool = False) -> None:
        self.job = job
        self.displays_are_main = displays_are_main  # IRkernel shows a cell's value so
        self.done = asyncio.Event()
        self.error: tuple[str, str] | None = None

    def emit(self, event: outputs.Event) -> None:
        if self.job is not None:
            self.job.emit(event)

    def on_iopub(self, msg: dict[str, Any]) -> None:
        kind = msg["msg_type"]
        content = msg.get("content", {})
        if kind == "execute_input":
            self.emit(outputs.number_of_executions(int(content.get("execution_count", 0))))
        elif kind == "stream":
            name = "stderr" if content.get("name") == "stderr" else "stdout"
            self.emit(outputs.stream(name, content.get("text", ""), _timestamp(msg)))
        elif kind in ("execute_result", "display_data"):
            bundle = dict(content.get("data", {}))
            main = kind == "execute_result" or self.displays_are_main
            self.emit(outputs.result(bundle, is_main=main))
        elif kind == "error":
            self.error = (content.get("ename", "Error"), content.get("evalue", ""))
            self.emit(
                outputs.error(
                    content.get("ename", "Error"),
                    content.get("evalue", ""),
                    "\n".join(content.get("traceback", [])),
                )
            )
        elif kind == "status" and content.get("execution_state") == "idle":
            self.done.set()


class PythonContext(Context):
    """A Jupyter kernel per context; the Python one here, other languages' kernels override
    ``kernel_spec``, ``kernel_env`` and the env snippets (r_kernel.py)."""

    language = "python"
    displays_are_main = False

    def kernel_spec(self) -> KernelSpec:
        return KernelSpec(
            name=KERNEL_NAME,
            argv=kernel_argv(),
            display_name="Python 3 (sandhold)",
            language="python",
            interrupt_mode="signal",
        )

    def kernel_env(self) -> dict[str, str]:
        # The inline backend turns figures into display_data (PNG + our e2b/chart) at the end
        # of each cell; scripts in the sandbox keep the template's Agg.
        return {**self.env, "MPLBACKEND": "module://matplotlib_inline.backend_inline"}

    def set_env_code(self, env: dict[str, str]) -> str:
        return f"__import__('os').environ.update({env!r})"

    def push_env_code(self, env: dict[str, str]) -> str:
        return f"__import__('_sandhold').push_env({env!r})"

    def pop_env_code(self) -> str:
        return "__import__('_sandhold').pop_env()"

    def __init__(self, context_id: str, cwd: str, env: dict[str, str]) -> None:
        super().__init__(context_id, cwd, env)
        self.km: AsyncKernelManager | None = None
        self.kc: AsyncKernelClient | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[str, _Pending] = {}
        self._runtime_dir: tempfile.TemporaryDirectory[str] | None = None

    async def _start(self) -> None:
        self._runtime_dir = tempfile.TemporaryDirectory(prefix="sandhold-kernel-")
        # IPC (unix sockets in a private directory) rather than TCP: no port races between
        # kernels, and nothing else in the sandbox can reach the kernel's channels.
        spec = self.kernel_spec()
        km = AsyncKernelManager(
            kernel_name=spec.name,
            kernel_spec_manager=_SpecManager(spec),
            transport="ipc",
            ip=os.path.join(self._runtime_dir.name, "kernel"),
        )
        km.connection_file = os.path.join(self._runtime_dir.name, "kernel.json")
        self.pending_env = {}  # a new kernel starts with self.env
        self.km = km
        await km.start_kernel(cwd=self.cwd, env=self.kernel_env())
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=START_TIMEOUT_S)
        except RuntimeError:
            kc.stop_channels()
            await self._stop()
            raise
        self.kc = kc
        self._reader = asyncio.create_task(self._read_iopub(kc), name=f"iopub-{self.id}")

    async def _stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        if self.kc is not None:
            self.kc.stop_channels()
            self.kc = None
        if self.km is not None:
            km, self.km = self.km, None
            with contextlib.suppress(Exception):
                await km.shutdown_kernel(now=True)
        for pending in self._pending.values():
            pending.done.set()
        self._pending.clear()
        if self._runtime_dir is not None:
            self._runtime_dir.cleanup()
            self._runtime_dir = None

    def _alive(self) -> bool:
        km = self.km
        if km is None or km.provisioner is None:
            return False
        process = getattr(km.provisioner, "process", None)
        return process is not None and process.poll() is None

    async def _interrupt(self) -> None:
        if self.km is not None:
            with contextlib.suppress(Exception):
                await self.km.interrupt_kernel()

    async def _read_iopub(self, kc: AsyncKernelClient) -> None:
        while True:
            try:
                msg = await kc.get_iopub_msg()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reading the kernel's IOPub channel failed")
                await asyncio.sleep(0.1)
                continue
            parent = msg.get("parent_header", {}).get("msg_id")
            pending = self._pending.get(parent) if parent else None
            if pending is not None:
                pending.on_iopub(msg)

    def _send(self, code: str, job: Job | None, *, silent: bool) -> _Pending:
        assert self.kc is not None
        msg_id = self.kc.execute(
            code, silent=silent, store_history=not silent, allow_stdin=False, stop_on_error=False
        )
        pending = _Pending(job, self.displays_are_main)
        self._pending[msg_id] = pending
        return pending

    async def _silent(self, code: str) -> None:
        """Run helper code without output, history or an execution count."""
        pending = self._send(code, None, silent=True)
        try:
            await asyncio.wait_for(pending.done.wait(), START_TIMEOUT_S)
        finally:
            self._pending = {k: v for k, v in self._pending.items() if v is not pending}
        if pending.error is not None:
            log.warning("helper code failed in context %s: %s", self.id, pending.error)

    async def _run(self, job: Job) -> None:
        if self.kc is None:  # restarted between our start check and now
            await self.ensure_started()
        if self.pending_env:  # the kernel's own MPLBACKEND stays: see kernel_env
            changed = {k: v for k, v in self.pending_env.items() if k != "MPLBACKEND"}
            self.pending_env = {}
            if changed:
                await self._silent(self.set_env_code(changed))
        if job.env_vars:
            await self._silent(self.push_env_code(job.env_vars))
        generation = self.generation
        pending = self._send(job.code, job, silent=False)
        try:
            await self.wait_finished(pending.done, job)
        finally:
            self._pending = {k: v for k, v in self._pending.items() if v is not pending}
        if job.env_vars and self.generation == generation and self.kc is not None:
            await self._silent(self.pop_env_code())
