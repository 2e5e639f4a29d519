"""``process.Process``: the RPCs that start commands, attach to them, feed their input, signal
and resize them (the running commands themselves are ``process_table``'s).

``Start`` streams the new command's events; ``Connect-Timeout-Ms`` on it kills the command when
it expires. A client that goes away only stops receiving: the command keeps running.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncGenerator, AsyncIterator

from . import aio
from .config import AgentConfig, identity_env
from .connect import Call
from .process_table import Process, ProcessManager, Subscriber
from .rpc import Message, RpcError, get, get_bytes, get_enum, get_int, get_str
from .spawn import SpawnSpec, go_errno
from .users import User, UserError, check_can_act_as, fs_identity, resolve_path

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SIGNALS = {"SIGNAL_UNSPECIFIED": 0, "SIGNAL_SIGTERM": 15, "SIGNAL_SIGKILL": 9}
KILL_WAIT_S = 2.0  # the longest a SIGKILL's answer waits for the process to be reaped


def spawn_spec(msg: Message, user: User, agent_config: AgentConfig) -> tuple[SpawnSpec, Message]:
    """What a ``Start`` request asks for, checked: the command, its cwd (resolved and reachable
    as ``user``), its environment and terminal; and the process config ``List`` reports."""
    proc_cfg = get(msg, "process") or {}
    if not isinstance(proc_cfg, dict):
        raise RpcError("invalid_argument", "process must be an object")
    cmd = get_str(proc_cfg, "cmd")
    if not cmd:
        raise RpcError("invalid_argument", "process.cmd is required")
    args = get(proc_cfg, "args") or []
    envs = get(proc_cfg, "envs") or {}
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise RpcError("invalid_argument", "process.args must be a list of strings")
    if not isinstance(envs, dict):
        raise RpcError("invalid_argument", "process.envs must be a map")
    envs = {str(k): str(v) for k, v in envs.items()}
    cwd_req = get(proc_cfg, "cwd")

    try:
        cwd = resolve_path(cwd_req or "", user, agent_config.default_workdir)
    except ValueError as e:
        raise RpcError("invalid_argument", str(e)) from None
    try:
        check_can_act_as(user)
    except UserError as e:
        raise RpcError("permission_denied", str(e)) from None
    try:
        with fs_identity(user):
            os.stat(cwd)
    except FileNotFoundError:
        raise RpcError("invalid_argument", f"cwd '{cwd}' does not exist") from None
    except OSError:
        pass  # the child's chdir reports anything else

    env = {
        "PATH": os.environ.get("PATH") or DEFAULT_PATH,
        "HOME": user.home,
        "USER": user.name,
        "LOGNAME": user.name,
        "SHELL": user.shell or "/bin/sh",
    }
    env.update(identity_env())
    env.update(agent_config.env)
    env.update(envs)

    pty = get(msg, "pty")
    pty_size: tuple[int, int] | None = None
    if pty is not None:
        size = get(pty, "size") or {}
        cols, rows = get_int(size, "cols"), get_int(size, "rows")
        pty_size = (cols or 80, rows or 24)
        env.setdefault("TERM", "xterm-256color")
    stdin = get(msg, "stdin")
    spec = SpawnSpec([cmd, *args], env, cwd, user, pty_size, True if stdin is None else bool(stdin))
    spec.root_caps = agent_config.root_caps
    config: Message = {"cmd": cmd, "args": args, "envs": envs}
    if cwd_req is not None:
        config["cwd"] = cwd_req
    return spec, config


def _drop_subscription(task: aio.Future[tuple[Process, Subscriber]]) -> None:
    if not task.cancelled() and task.exception() is None:
        proc, sub = task.result()
        proc.unsubscribe(sub)


class ProcessService:
    def __init__(self, config: AgentConfig, manager: ProcessManager) -> None:
        self.config = config
        self.manager = manager

    # -- streams --------------------------------------------------------------------------------
    async def start(self, msg: Message, call: Call) -> AsyncGenerator[Message, None]:
        spec, config = spawn_spec(msg, call.user, self.config)
        tag = get(msg, "tag")

        async def launch() -> tuple[Process, Subscriber]:
            proc = await self.manager.spawn(spec, config, str(tag) if tag is not None else None)
            sub = proc.subscribe()  # before any output moves, so none is missed
            proc.begin(call.timeout)
            return proc, sub

        # Once forked, the command must end up managed even if this client goes away now.
        task = aio.ensure_future(launch())
        try:
            proc, sub = await aio.shield(task)
        except aio.CancelledError:
            task.add_done_callback(_drop_subscription)
            raise
        try:
            yield {"event": {"start": {"pid": proc.pid}}}
            async for event in proc.follow(sub, call.keepalive_interval):
                yield event
        finally:
            proc.unsubscribe(sub)

    async def connect(self, msg: Message, call: Call) -> AsyncGenerator[Message, None]:
        proc = self.manager.select(get(msg, "process"))
        sub = proc.subscribe()
        try:
            yield {"event": {"start": {"pid": proc.pid}}}
            async for event in proc.follow(sub, call.keepalive_interval):
                yield event
        finally:
            proc.unsubscribe(sub)

    # -- unary ----------------------------------------------------------------------------------
    async def list(self, msg: Message, call: Call) -> Message:
        return {"processes": [p.info() for p in self.manager.processes.values()]}

    async def _input(self, proc: Process, data: Message | None) -> None:
        if data and "stdin" in data:
            await proc.write_stdin(get_bytes(data, "stdin"))
        elif data and "pty" in data:
            await proc.write_pty(get_bytes(data, "pty"))
        else:
            raise RpcError("unimplemented", "invalid input type <nil>")

    async def send_input(self, msg: Message, call: Call) -> Message:
        proc = self.manager.select(get(msg, "process"))
        await self._input(proc, get(msg, "input"))
        return {}

    async def stream_input(self, messages: AsyncIterator[Message], call: Call) -> Message:
        proc: Process | None = None
        async for msg in messages:
            if "start" in msg:
                proc = self.manager.select(get(get(msg, "start"), "process"))
            elif "data" in msg:
                if proc is None:
                    raise RpcError("failed_precondition", "data sent before the start event")
                await self._input(proc, get(get(msg, "data"), "input"))
            elif "keepalive" in msg:
                continue
            else:
                raise RpcError("unimplemented", "invalid event type <nil>")
        return {}

    async def send_signal(self, msg: Message, call: Call) -> Message:
        proc = self.manager.select(get(msg, "process"))
        sig = get_enum(msg, "signal", SIGNALS)
        if sig not in (signal.SIGKILL, signal.SIGTERM):
            name = next((k for k, v in SIGNALS.items() if v == sig), str(sig))
            raise RpcError("unimplemented", f"invalid signal: {name}")
        proc.signal(sig)
        if sig == signal.SIGKILL:  # answered once it is gone: the SDKs' kill() says True on
            await proc.gone(KILL_WAIT_S)  # this answer, and a check right after finds nothing
        return {}

    async def close_stdin(self, msg: Message, call: Call) -> Message:
        await self.manager.select(get(msg, "process")).close_stdin()
        return {}

    async def update(self, msg: Message, call: Call) -> Message:
        proc = self.manager.select(get(msg, "process"))
        pty = get(msg, "pty")
        if pty is not None:
            size = get(pty, "size") or {}
            try:
                proc.resize(get_int(size, "cols"), get_int(size, "rows"))
            except OSError as e:
                raise RpcError("internal", f"error resizing tty: {go_errno(e)}") from None
        return {}
