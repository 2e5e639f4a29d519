"""The ``agent_toolset_20260401`` tools (bash, read, write, edit, glob, grep) run in a session's
Sandhold sandbox, as ``anthropic`` SDK tools: each is a ``beta_async_tool`` with the SDK's own
input schema (``BetaManagedAgentsAgentToolset20260401*Input``), so the SDK's session runner
validates the input, runs the tool and turns a ``ToolError`` into an ``is_error`` result.

What each returns follows the SDK's reference implementation (``lib/tools/agent_toolset.py``)
where it can: the same messages, limits and shapes, with the files and the shell in the
sandbox instead of the worker's host. The differences:

- file paths are the session's file view (docs/gateway.md, "File views"), not a working
  directory: relative paths are under ``/workspace``; reads are allowed under ``/workspace``,
  ``/skills``, ``/reference``, ``/tmp``, ``/home/user``, writes under ``/workspace``, ``/tmp``,
  ``/home/user``; the gateway refuses the rest (``view_denied``) and records every file call in
  the session's timeline;
- ``grep`` uses Python regular expressions in the sandbox (the SDK's fallback when ``rg`` is
  missing), which sandbox templates need not have;
- a file larger than the gateway's ``gateway_max_payload_bytes`` cannot be read.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import posixpath
import shlex
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import PurePosixPath
from typing import Any

from anthropic.lib.environments import BetaAnyRunnableTool
from anthropic.lib.tools import BetaFunctionToolResultType, ToolError, beta_async_tool
from anthropic.types.beta import (
    BetaManagedAgentsAgentToolset20260401BashInput,
    BetaManagedAgentsAgentToolset20260401EditInput,
    BetaManagedAgentsAgentToolset20260401GlobInput,
    BetaManagedAgentsAgentToolset20260401GrepInput,
    BetaManagedAgentsAgentToolset20260401ReadInput,
    BetaManagedAgentsAgentToolset20260401WriteInput,
)
from pydantic import BaseModel

from sandhold.gateway.views import READ_ROOTS
from sandhold.worker import sandbox_search
from sandhold.worker.gateway import Gateway
from sandhold.worker.shell import RESET_SCRIPT, command_script, shell_output

WORKSPACE = "/workspace"
SEARCH_TIMEOUT_S = 30.0
# `read` returns these as content blocks (base64), as the SDK's tool does, within its caps.
BINARY_MEDIA_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".pdf": "application/pdf",
}
MAX_IMAGE_BASE64_BYTES = 5 * 1024 * 1024
MAX_PDF_BYTES = 20 * 1024 * 1024
SEARCH_PROGRAM = inspect.getsource(sandbox_search)


class SandboxTools:
    """The toolset of one session: every call goes to the session's sandbox via the gateway."""

    def __init__(
        self,
        gateway: Gateway,
        session_id: str,
        *,
        max_file_bytes: int,
        bash_timeout_s: float,
        in_flight: InFlight | None = None,
    ) -> None:
        self.gw = gateway
        self.session_id = session_id
        self.max_file_bytes = max_file_bytes
        self.bash_timeout_s = bash_timeout_s
        self.in_flight = in_flight or InFlight()

    async def _call(self, name: str, tool: str, budget_s: float = 0.0, **args: Any) -> Any:
        return await self.gw.call(name, self.session_id, tool, budget_s, **args)

    # -- bash -----------------------------------------------------------------------------------
    async def bash(
        self,
        command: str | None = None,
        restart: bool | None = None,
        timeout_ms: int | None = None,
    ) -> str:
        """Run a command in the session's persistent bash shell (in its sandbox)."""
        if restart:
            await self._call("bash", "run_command", command=RESET_SCRIPT, timeout_s=30)
            return "bash session restarted"
        if not command:
            raise ToolError("bash: command is required")
        timeout = min(timeout_ms / 1000.0, 140.0) if timeout_ms else self.bash_timeout_s
        result = await self._call(
            "bash", "run_command", timeout, command=command_script(command), timeout_s=timeout
        )
        out = shell_output(result)
        if out.exit_code is None:
            raise ToolError(f"bash: bash command timed out after {timeout:g}s\n{out.text}".strip())
        if out.exit_code != 0:
            raise ToolError(out.text or f"(exit status {out.exit_code})")
        return out.text

    # -- files ----------------------------------------------------------------------------------
    async def read(
        self, file_path: str, view_range: list[int] | None = None
    ) -> BetaFunctionToolResultType:
        """Read a file of the session's sandbox."""
        if view_range and len(view_range) != 2:
            raise ToolError("read: view_range must be [start_line, end_line]")
        media_type = BINARY_MEDIA_TYPES.get(PurePosixPath(file_path).suffix.lower())
        if media_type is not None:
            if view_range:
                raise ToolError("read: view_range is not supported for image/PDF files")
            return [await self._binary_block(file_path, media_type)]
        text, size = await self._text(file_path, "read")
        if not view_range:
            if size > self.max_file_bytes:
                raise ToolError(
                    f"read: {file_path} is {size} bytes, exceeds {self.max_file_bytes}-byte "
                    "limit. Use the view_range parameter to read specific line ranges, e.g. "
                    "view_range: [1, 500]."
                )
            return text
        start_line, end_line = view_range
        lines = text.split("\n")
        end = end_line if end_line > 0 else len(lines)
        selected = "\n".join(lines[max(0, start_line - 1) : end])
        if len(selected.encode()) > self.max_file_bytes:
            raise ToolError(
                f"read: lines {start_line}-{end_line} of {file_path} exceed the "
                f"{self.max_file_bytes}-byte limit; read a narrower view_range"
            )
        return selected

    async def _text(self, file_path: str, op: str) -> tuple[str, int]:
        try:
            r = await self._call(op, "read_file", path=file_path)
        except ToolError as e:
            if "not UTF-8" in str(e):
                raise ToolError(
                    f"{op}: {file_path}: not valid UTF-8 text (binary files are only supported "
                    "for image/PDF extensions)"
                ) from None
            raise
        return str(r["content"]), int(r["size"])

    async def _binary_block(self, file_path: str, media_type: str) -> Any:
        r = await self._call("read", "read_file", path=file_path, encoding="base64")
        data, size = str(r["content"]), int(r["size"])
        pdf = media_type == "application/pdf"
        limit = MAX_PDF_BYTES if pdf else MAX_IMAGE_BASE64_BYTES // 4 * 3  # raw bytes
        if size > limit:
            raise ToolError(
                f"read: {file_path} is {size} bytes, exceeds {limit}-byte limit for image/PDF "
                "files."
            )
        source = {"type": "base64", "media_type": media_type, "data": data}
        return {"type": "document" if pdf else "image", "source": source}

    async def write(self, file_path: str, content: str) -> str:
        """Write a file in the session's sandbox, creating parent directories as needed."""
        r = await self._call("write", "write_file", path=file_path, content=content)
        return f"wrote {r['size']} bytes to {file_path}"

    async def edit(
        self, file_path: str, old_string: str, new_string: str, replace_all: bool | None = None
    ) -> str:
        """Replace text in a file of the session's sandbox by exact string match."""
        if not old_string:
            raise ToolError("edit: old_string must not be empty")
        text, size = await self._text(file_path, "edit")
        if size > self.max_file_bytes:
            raise ToolError(
                f"edit: {file_path} is {size} bytes, exceeds {self.max_file_bytes}-byte limit. "
                "The edit tool loads the whole file and cannot modify a file this large."
            )
        count = text.count(old_string)
        if count == 0:
            raise ToolError(f"edit: old_string not found in {file_path}")
        if not replace_all and count > 1:
            raise ToolError(
                f"edit: old_string appears {count} times in {file_path} (must be unique)"
            )
        updated = text.replace(old_string, new_string, -1 if replace_all else 1)
        await self._call("edit", "write_file", path=file_path, content=updated)
        return f"edited {file_path} ({count if replace_all else 1} replacement(s))"

    # -- search ---------------------------------------------------------------------------------
    async def glob(self, pattern: str, path: str | None = None) -> str:
        """List files of the session's sandbox matching a glob pattern, newest first."""
        if pattern.startswith("/"):
            raise ToolError(
                "glob: absolute pattern not permitted; pass a relative pattern "
                "(and optionally path)"
            )
        if ".." in PurePosixPath(pattern).parts:
            raise ToolError("glob: '..' is not permitted in the pattern")
        return await self._search("glob", pattern, path)

    async def grep(self, pattern: str, path: str | None = None) -> str:
        """Search the contents of the session's sandbox's files for a regular expression."""
        return await self._search("grep", pattern, path)

    async def _search(self, kind: str, pattern: str, path: str | None) -> str:
        root = posixpath.normpath(posixpath.join(WORKSPACE, path or "."))
        env = {
            "SANDHOLD_SEARCH": kind,
            "SANDHOLD_PATTERN": pattern,
            "SANDHOLD_ROOT": root,
            "SANDHOLD_VIEW": ":".join(READ_ROOTS),
        }
        # -I: neither the working directory nor PYTHON* variables steer what it imports
        result = await self._call(
            kind,
            "run_command",
            SEARCH_TIMEOUT_S,
            timeout_s=SEARCH_TIMEOUT_S,
            env=env,
            command=f"exec python3 -I -c {shlex.quote(SEARCH_PROGRAM)}",
        )
        code = result.get("exit_code")
        # What runs is the sandbox's python3, which code in the sandbox can replace: its
        # output is bounded here, not only by the program.
        if code == 0:
            return _bounded(str(result["stdout"]).rstrip("\n"))
        if code == 1:
            return "no matches"
        if code is None:
            raise ToolError(f"{kind}: timed out after {SEARCH_TIMEOUT_S:g}s")
        why = _bounded(str(result.get("stderr") or result.get("stdout") or "").strip(), 4096)
        raise ToolError(f"{kind}: {why or f'failed with exit status {code}'}")

    def toolset(self) -> list[BetaAnyRunnableTool]:
        """The six tools, named and typed as ``agent_toolset_20260401``'s."""
        schemas: dict[str, type[BaseModel]] = {
            "bash": BetaManagedAgentsAgentToolset20260401BashInput,
            "read": BetaManagedAgentsAgentToolset20260401ReadInput,
            "write": BetaManagedAgentsAgentToolset20260401WriteInput,
            "edit": BetaManagedAgentsAgentToolset20260401EditInput,
            "glob": BetaManagedAgentsAgentToolset20260401GlobInput,
            "grep": BetaManagedAgentsAgentToolset20260401GrepInput,
        }
        return [
            beta_async_tool(self._counted(getattr(self, name)), name=name, input_schema=schema)
            for name, schema in schemas.items()
        ]

    def _counted(self, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(fn)
        async def run(**kwargs: Any) -> Any:
            with self.in_flight.call():
                return await fn(**kwargs)

        return run


class InFlight:
    """A worker's tool calls in flight and their results not yet posted (the SDK posts one per
    call, whatever it ended with): a release waits until there are none."""

    def __init__(self) -> None:
        self.calls = 0
        self.unposted = 0
        self._changed = asyncio.Event()

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        self.calls += 1
        try:
            yield
        finally:
            self.calls -= 1
            self.unposted += 1
            self._changed.set()

    def posted(self) -> None:
        if self.unposted:
            self.unposted -= 1
            self._changed.set()

    async def settled(self, within: float) -> bool:
        """Wait until no call runs and every result is posted, at most ``within`` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                while self.calls or self.unposted:
                    self._changed.clear()
                    await self._changed.wait()
        return not (self.calls or self.unposted)


def _bounded(text: str, limit: int = sandbox_search.GREP_LIMIT) -> str:
    """``text`` cut to ``limit`` bytes (UTF-8), saying so."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[:limit].decode(errors="ignore") + f"\n[output truncated at {limit} bytes]"


def unhandled_custom_tools(names: Sequence[str]) -> list[BetaAnyRunnableTool]:
    """A tool for each of the agent's custom tools that answers every call with an error
    result: this worker has no handler for them (``worker_custom_tools = "error"``)."""

    def make(name: str) -> BetaAnyRunnableTool:
        async def unhandled(**_input: Any) -> str:
            raise ToolError(
                f"custom tool {name!r} has no handler: the Sandhold worker serving this session "
                "runs only the built-in tools (agent_toolset_20260401)"
            )

        return beta_async_tool(
            unhandled,
            name=name,
            description=f"custom tool {name} (no handler)",
            input_schema={"type": "object", "additionalProperties": True},
        )

    return [make(n) for n in names]
