"""The tools an agent loop calls, shared by the MCP and REST surfaces.

Arguments are validated (unknown keys refused) before anything happens: a bad call opens no
session and creates no sandbox. No argument reaches policy: template, limits, network, mounts
and the sandbox's existence come from the tenant's configuration only.

Every path a file tool touches (and ``run_command``'s ``cwd``) is authorized against the
session's file view (``views.py``) before the session is touched; writes and deliverables are
checked again on the path as the sandbox resolves it (symlinks followed, inside the sandbox).
Allowed and denied paths are recorded in the timeline (``reason`` of the ``tool_call`` event).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import mimetypes
import posixpath
import shlex
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from pydantic import ValidationError

from sandhold.envd import ENVD_PORT, INTERPRETER_PORT
from sandhold.envd.client import CommandOutput, EnvdClient
from sandhold.errors import (
    EnvdError,
    InvalidRequest,
    PayloadTooLarge,
    PortClosed,
    SandboxGone,
    SandholdError,
)
from sandhold.gateway import scenario
from sandhold.gateway.deliverables import DeliverableStore
from sandhold.gateway.errors import server_fault, tool_error
from sandhold.gateway.policy import SESSION_ID_RE, TenantPolicy, check_id
from sandhold.gateway.sessions import Lease, SandboxSessionManager
from sandhold.gateway.texts import texts
from sandhold.gateway.timeline import Timeline
from sandhold.gateway.tool_args import (
    MODELS,
    WORKSPACE,
    Args,
    Download,
    ListFiles,
    PublishDeliverable,
    ReadFile,
    RunCode,
    RunCommand,
    Upload,
    WriteFile,
    describe,
)
from sandhold.gateway.views import RULES, Access, ViewDenied, allowed, authorize, normalize
from sandhold.runtime.spec import ENV_KEY_RE, clipped
from sandhold.service.limits import nbytes, over

SANDBOX_USER = "user"
INTERPRETER_LANGUAGES = {"python": "python", "javascript": "js", "bash": "bash"}
FALLBACK = {"python": ("py", "python3"), "javascript": ("js", "node"), "bash": ("sh", "bash")}


def sandbox_path(raw: str) -> str:
    return normalize(raw)


# What each file tool does to its path (run_command: its cwd).
ACCESS: dict[str, Access] = {
    "read_file": "read",
    "download": "read",
    "list_files": "read",
    "publish_deliverable": "read",
    "run_command": "read",
    "write_file": "write",
    "upload": "write",
}


def view_path(tool: str, args: Args) -> tuple[str, Access] | None:
    """The path a tool call touches and how, or None (run_code: no path)."""
    access = ACCESS.get(tool)
    if access is None:
        return None
    if isinstance(args, RunCommand):
        return args.cwd or WORKSPACE, access
    return str(getattr(args, "path")), access  # noqa: B009 - every other file tool has a path


def _b64(value: str, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise InvalidRequest(f"{what} is not valid base64") from None


@dataclasses.dataclass
class _Call:
    """One tool call as the timeline records it, filled in as it runs."""

    tenant_id: str
    sid: str
    tool: str
    args: Args
    reason: str | None  # the file view's decision
    sandbox_id: str | None = None
    result: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: SandholdError | None = None
    recorded: bool = False
    t0: float = dataclasses.field(default_factory=time.monotonic)

    def fields(self, text_bytes: int) -> dict[str, Any]:
        error = self.error
        return {
            "sandbox_id": self.sandbox_id,
            "tool": self.tool,
            "duration_ms": round((time.monotonic() - self.t0) * 1000, 2),
            "exit_code": self.result.get("exit_code"),
            "bytes_in": _bytes_in(self.args),
            "bytes_out": self.result.pop("_bytes_out", None),
            "error": f"{error.code}: {error.message}" if error else None,
            "reason": self.reason,
            "texts": texts(self.args, self.result, text_bytes),
        }


class Tools:
    def __init__(
        self, manager: SandboxSessionManager, deliverables: DeliverableStore, timeline: Timeline
    ) -> None:
        self.manager = manager
        self.deliverables = deliverables
        self.timeline = timeline
        self.max_payload = manager.settings.gateway_max_payload_bytes
        self.text_bytes = manager.settings.gateway_timeline_text_bytes
        self._handlers: dict[str, Callable[[Lease, Any], Awaitable[dict[str, Any]]]] = {
            "run_code": self._run_code,
            "run_command": self._run_command,
            "read_file": self._read_file,
            "write_file": self._write_file,
            "list_files": self._list_files,
            "upload": self._upload,
            "download": self._download,
            "publish_deliverable": self._publish,
        }

    def parse(self, tool: str, arguments: dict[str, Any]) -> Args:
        model = MODELS.get(tool)
        if model is None:
            raise InvalidRequest(f"unknown tool {tool!r}; tools: {', '.join(MODELS)}")
        try:
            args = model.model_validate(arguments)
        except ValidationError as e:
            raise InvalidRequest(describe(e)) from None
        for field in ("code", "command", "content", "content_base64"):
            value = getattr(args, field, None)
            if isinstance(value, str) and len(value) > self.max_payload * 4 // 3 + 4:
                raise PayloadTooLarge(f"{field} is larger than {self.max_payload} bytes")
        self._bounded(args)
        return args

    def _bounded(self, args: Args) -> None:
        """The limits of a tool call's arguments (docs/gateway.md), before any session."""
        s = self.manager.settings
        for field in ("path", "cwd"):
            if isinstance(value := getattr(args, field, None), str):
                over(s, "gateway_max_path_bytes", field, nbytes(value))
        if isinstance(args, RunCommand):
            over(s, "gateway_command_env_max_vars", "env", len(args.env), "variables")
            for name, value in args.env.items():
                if not ENV_KEY_RE.match(name) or "\0" in value:
                    raise InvalidRequest(
                        f"env: {clipped(name)} is not a valid variable name, "
                        "or its value has a NUL byte"
                    )
            size = sum(nbytes(k) + nbytes(v) + 2 for k, v in args.env.items())  # as execve counts
            over(s, "gateway_command_env_max_bytes", "env (its NAME=value strings)", size)

    async def call(
        self,
        tenant_id: str,
        tool: str,
        arguments: dict[str, Any],
        session_id: str | None = None,
        policy: TenantPolicy | None = None,
    ) -> dict[str, Any]:
        """Validate, run and record one tool call. ``session_id`` is the connection's session;
        an explicit ``session_id`` argument takes precedence. ``policy``: the tenant's, when the
        caller read it already (with the tenant's key)."""
        args = self.parse(tool, arguments)
        sid = args.session_id or session_id
        if sid is None:
            raise InvalidRequest("no session: pass session_id or connect with a session")
        check_id(sid, "session id", SESSION_ID_RE)
        if tool == "session_status":
            return await self.manager.status(tenant_id, sid)
        if tool == "close_session":
            return await self.manager.close(tenant_id, sid)
        _precheck(args)
        call = _Call(tenant_id, sid, tool, args, await self._view(tenant_id, sid, tool, args))
        policy = policy or await self.manager.policy(tenant_id)
        budget = float(getattr(args, "timeout_s", 60))
        if budget > policy.max_command_timeout_s:
            raise InvalidRequest(
                f"timeout_s {budget:g} exceeds the tenant's max_command_timeout_s "
                f"({policy.max_command_timeout_s})"
            )
        try:
            return await self._run(call, budget, policy)
        except Exception as e:
            call.error = tool_error(tool, e)
            if isinstance(e, ViewDenied):
                call.reason = f"view: {ACCESS[tool]} {e.path} denied"
            if call.error is e:
                raise
            # the provider's own failure keeps its cause; the sandbox's refusal is the message
            raise call.error from (None if isinstance(e, EnvdError) else e)
        finally:
            if not call.recorded:
                await self._record(call)
            await scenario.label(self.manager, tenant_id, sid)

    async def _view(self, tenant_id: str, sid: str, tool: str, args: Args) -> str | None:
        """The file view's decision on the path the call touches, as the timeline's reason;
        a denial is recorded and raised."""
        touched = view_path(tool, args)
        if touched is None:
            return None
        raw, access = touched
        try:
            path = authorize(tool, raw, access)
        except ViewDenied as e:
            await self.timeline.record(
                tenant_id,
                sid,
                "tool_call",
                tool=tool,
                bytes_in=_bytes_in(args),
                texts=texts(args, {}, self.text_bytes),
                error=f"{e.code}: {e.message}",
                reason=f"view: {access} {e.path} denied",
            )
            raise
        return f"view: {access} {path} allowed"

    async def _run(self, call: _Call, budget: float, policy: TenantPolicy) -> dict[str, Any]:
        """Run the call in the session's sandbox; once more if the sandbox died after the
        session looked (refused at connect, never delivered): then it gets a new one."""
        for attempt in (1, 2):
            try:
                return await self._run_once(call, budget, policy)
            except SandboxGone:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _run_once(self, call: _Call, budget: float, policy: TenantPolicy) -> dict[str, Any]:
        use = self.manager.use(call.tenant_id, call.sid, call.tool, budget, policy)
        async with use as lease:
            call.sandbox_id = lease.sandbox_id
            call.result = await self._handlers[call.tool](lease, call.args)
            # Written with the lease's unlock: one store round trip less.
            fields = call.fields(self.text_bytes)
            row = self.timeline.row(call.tenant_id, call.sid, "tool_call", **fields)
            lease.events.append(row)
            call.recorded = True
        return call.result

    async def _record(self, call: _Call) -> None:
        fields = call.fields(self.text_bytes)
        await self.timeline.record(call.tenant_id, call.sid, "tool_call", **fields)
        if call.error is not None and server_fault(call.error):  # ours or the provider's fault
            await self.timeline.record(
                call.tenant_id,
                call.sid,
                "failure",
                sandbox_id=call.sandbox_id,
                tool=call.tool,
                error=fields["error"],
                reason=f"{call.tool} failed",
            )

    # -- handlers -------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _envd(self, lease: Lease, port: int = ENVD_PORT) -> AsyncIterator[EnvdClient]:
        async with self.manager.provider.channel(lease.sandbox_id, lease.handle, port) as ch:
            yield EnvdClient(ch)

    async def _run_command(self, lease: Lease, a: RunCommand) -> dict[str, Any]:
        async with self._envd(lease) as sbx:
            out = await sbx.sh(
                a.command,
                user=SANDBOX_USER,
                cwd=sandbox_path(a.cwd or WORKSPACE),
                env=a.env,
                timeout_s=a.timeout_s,
                background=a.background,
                max_output=self.max_payload,
            )
        return _command_result(out)

    async def _run_code(self, lease: Lease, a: RunCode) -> dict[str, Any]:
        try:
            async with self._envd(lease, INTERPRETER_PORT) as interpreter:
                ex = await interpreter.execute(
                    a.code,
                    language=INTERPRETER_LANGUAGES[a.language],
                    timeout_s=a.timeout_s,
                    max_output=self.max_payload,
                )
        except (PortClosed, httpx.ConnectError):  # no interpreter in this template
            return await self._run_code_plain(lease, a)
        return {
            "interpreter": True,
            "results": ex.results,
            "stdout": ex.stdout,
            "stderr": ex.stderr,
            "error": ex.error,
            "truncated": ex.truncated,
            "_bytes_out": len(ex.stdout) + len(ex.stderr) + sum(len(str(r)) for r in ex.results),
        }

    async def _run_code_plain(self, lease: Lease, a: RunCode) -> dict[str, Any]:
        """No code interpreter in this template: run the code as a script."""
        ext, program = FALLBACK[a.language]
        path = f"/tmp/sandhold-code-{uuid.uuid4().hex}.{ext}"
        async with self._envd(lease) as sbx:
            await sbx.write_file(path, a.code.encode(), user=SANDBOX_USER)
            out = await sbx.sh(
                f"{program} {path}; rc=$?; rm -f {shlex.quote(path)}; exit $rc",
                user=SANDBOX_USER,
                cwd=WORKSPACE,
                timeout_s=a.timeout_s,
                max_output=self.max_payload,
            )
        return {"interpreter": False, "results": [], **_command_result(out)}

    async def _read_file(self, lease: Lease, a: ReadFile) -> dict[str, Any]:
        data = await self._fetch(lease, a.path)
        if a.encoding == "utf-8":
            try:
                content = data.decode()
            except UnicodeDecodeError:
                raise InvalidRequest(f"{a.path} is not UTF-8 text; use encoding=base64") from None
        else:
            content = base64.b64encode(data).decode()
        return {
            "path": sandbox_path(a.path),
            "size": len(data),
            "encoding": a.encoding,
            "content": content,
            "_bytes_out": len(data),
        }

    async def _download(self, lease: Lease, a: Download) -> dict[str, Any]:
        data = await self._fetch(lease, a.path)
        encoded = base64.b64encode(data).decode()
        return {
            "path": sandbox_path(a.path),
            "size": len(data),
            "content_base64": encoded,
            "_bytes_out": len(data),
        }

    async def _fetch(self, lease: Lease, path: str) -> bytes:
        async with self._envd(lease) as sbx:
            return await sbx.read_file(
                sandbox_path(path), user=SANDBOX_USER, max_bytes=self.max_payload
            )

    async def _store(self, lease: Lease, tool: str, path: str, data: bytes) -> dict[str, Any]:
        if len(data) > self.max_payload:
            raise PayloadTooLarge(f"the file is larger than {self.max_payload} bytes")
        target = sandbox_path(path)
        async with self._envd(lease) as sbx:
            await self._resolved(sbx, tool, target, "write", must_exist=False)
            await sbx.write_file(target, data, user=SANDBOX_USER)
        return {"path": target, "size": len(data)}

    async def _resolved(
        self, sbx: EnvdClient, tool: str, path: str, access: Access, *, must_exist: bool
    ) -> str:
        """``path`` as the sandbox resolves it (symlinks followed, inside the sandbox), which
        must be in the view too: a symlink in the workspace cannot turn a write into one to
        /skills or /etc, nor a deliverable into a file outside the view. (The read-only binds
        enforce it regardless: this makes the refusal clear and recorded.)"""
        out = await sbx.sh(
            f"realpath {'-e' if must_exist else '-m'} -- {shlex.quote(path)}",
            user=SANDBOX_USER,
            cwd="/",
            timeout_s=30,
            max_output=64 * 1024,
        )
        real = out.stdout.decode(errors="replace").rstrip("\n")
        if out.exit_code != 0 or not real.startswith("/") or "\n" in real:
            why = out.stderr.decode(errors="replace").strip() or "cannot resolve the path"
            raise InvalidRequest(f"{tool}: {path}: {why}")
        if not allowed(real, access):
            raise ViewDenied(
                f"{tool}: {access} of {path} resolves (through a symlink) to {real}, outside "
                f"the session's file view: {RULES[access]}",
                real,
            )
        return real

    async def _write_file(self, lease: Lease, a: WriteFile) -> dict[str, Any]:
        data = a.content.encode() if a.encoding == "utf-8" else _b64(a.content, "content")
        return await self._store(lease, "write_file", a.path, data)

    async def _upload(self, lease: Lease, a: Upload) -> dict[str, Any]:
        data = _b64(a.content_base64, "content_base64")
        return await self._store(lease, "upload", a.path, data)

    async def _list_files(self, lease: Lease, a: ListFiles) -> dict[str, Any]:
        async with self._envd(lease) as sbx:
            entries = await sbx.list_dir(sandbox_path(a.path), user=SANDBOX_USER, depth=a.depth)
        return {"path": sandbox_path(a.path), "entries": entries}

    async def _publish(self, lease: Lease, a: PublishDeliverable) -> dict[str, Any]:
        # Read through the sandbox (inside its boundary), never from the host's view of the
        # workspace: a symlink there would point at host files. The file read is the one the
        # sandbox resolved, and it must be in the view.
        async with self._envd(lease) as sbx:
            real = await self._resolved(
                sbx, "publish_deliverable", sandbox_path(a.path), "read", must_exist=True
            )
            data = await sbx.read_file(real, user=SANDBOX_USER, max_bytes=self.max_payload)
        name = a.name or posixpath.basename(sandbox_path(a.path))
        check_id(name, "deliverable name")
        deliverable_id = uuid.uuid4().hex
        key = f"{lease.tenant_id}/{lease.session_id}/{deliverable_id}-{name}"
        ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
        url = await self.deliverables.put(key, data, ctype)
        digest = hashlib.sha256(data).hexdigest()
        await self.manager.db(
            lambda: self.manager.store.add_deliverable(
                id=deliverable_id,
                tenant_id=lease.tenant_id,
                session_id=lease.session_id,
                name=name,
                source_path=sandbox_path(a.path),
                size=len(data),
                sha256=digest,
                storage=self.deliverables.kind,
                key=key,
                url=url,
                created_at=time.time(),
            )
        )
        return {
            "id": deliverable_id,
            "name": name,
            "url": url,
            "size": len(data),
            "sha256": digest,
            "storage": self.deliverables.kind,
        }


def _precheck(args: Args) -> None:
    """Everything about the arguments that can be refused before the session is touched."""
    for path in (getattr(args, "path", None), getattr(args, "cwd", None)):
        if path is not None:
            sandbox_path(path)
    if isinstance(args, Upload):
        _b64(args.content_base64, "content_base64")
    if isinstance(args, WriteFile) and args.encoding == "base64":
        _b64(args.content, "content")
    if isinstance(args, PublishDeliverable) and args.name is not None:
        check_id(args.name, "deliverable name")


def _command_result(out: CommandOutput) -> dict[str, Any]:
    return {
        "exit_code": out.exit_code,
        "stdout": out.stdout.decode(errors="replace"),
        "stderr": out.stderr.decode(errors="replace"),
        "pid": out.pid,
        "error": out.error,
        "truncated": out.truncated,
        "_bytes_out": len(out.stdout) + len(out.stderr),
    }


def _bytes_in(args: Args) -> int:
    total = 0
    for field in ("code", "command", "content", "content_base64"):
        value = getattr(args, field, None)
        if isinstance(value, str):
            total += len(value.encode())
    return total
