"""The template's services: started by the agent at boot as tagged background processes (like
a template's start command, ``AgentConfig.services``), each the way a ``Start`` request would
start it, and started again whenever it ends.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from . import aio, log
from .config import AgentConfig
from .process import spawn_spec
from .process_table import Process, ProcessManager
from .rpc import Message, RpcError
from .users import lookup_user

LINE_MAX = 2000  # bytes of one line of a service's output kept in the log


class ServiceSupervisor:
    def __init__(self, config: AgentConfig, manager: ProcessManager) -> None:
        self.config = config
        self.manager = manager
        self._tasks: set[aio.Task[None]] = set()

    async def start(self, services: list[dict[str, Any]]) -> None:
        """Start the configured services and keep them running; one failing does not stop the
        others, and one that ends is started again after a growing delay (0.5 s up to 30 s)."""
        for svc in services:
            self._tasks.add(aio.ensure_future(self._supervise(svc)))

    async def announce_env(self, env: dict[str, str]) -> bool:
        """Tell each service that takes one (``env_path``: an HTTP path on its ``port``) the
        sandbox's env, on top of its own: a warm start's services were started before the
        sandbox had one. False if one of them did not take it."""
        ok = True
        for svc in self.config.services:
            if not svc.get("env_path") or not svc.get("port"):
                continue
            body = json.dumps({"env": {**env, **(svc.get("env") or {})}}).encode()
            try:
                status = str(await _post(int(svc["port"]), str(svc["env_path"]), body))
            except (TimeoutError, OSError, ValueError) as e:  # ValueError: no status line
                status = f"{type(e).__name__}: {e}"
            if status != "204":
                log.error("service %s did not take the sandbox's env: %s", svc.get("name"), status)
                ok = False
        return ok

    async def _spawn(self, svc: dict[str, Any], name: str) -> Process:
        user = lookup_user(str(svc.get("user") or self.config.default_user))
        if user is None:
            raise RpcError("unauthenticated", f"invalid username: '{svc.get('user')}'")
        process: Message = {
            "cmd": svc["argv"][0],
            "args": svc["argv"][1:],
            "envs": svc.get("env") or {},
        }
        if svc.get("cwd"):
            process["cwd"] = svc["cwd"]
        spec, config = spawn_spec({"process": process, "stdin": False}, user, self.config)
        return await self.manager.spawn(spec, config, name)

    async def _supervise(self, svc: dict[str, Any]) -> None:
        name = str(svc.get("name") or svc["argv"][0])
        delay = 0.5
        while True:
            try:
                proc = await self._spawn(svc, name)
            except RpcError as e:
                log.error("service %s did not start: %s", name, e.message)
                return  # a configuration error: retrying would not help
            sub = proc.subscribe()
            proc.begin(None)
            log.info("service %s started, pid %d", name, proc.pid)
            started = time.monotonic()
            tail, partial = b"", b""
            try:
                while True:
                    item = await sub.queue.get()
                    if "end" in item:
                        text = tail.decode(errors="replace").strip()
                        log.warning("service %s ended (%s): %s", name, item["end"]["status"], text)
                        break
                    for data in item["data"].values():
                        chunk = base64.b64decode(data)
                        tail = (tail + chunk)[-2000:]
                        # what it prints, line by line, in the sandbox's log (E2B's logs show a
                        # start command's output)
                        *lines, partial = (partial + chunk).split(b"\n")
                        for line in lines:
                            log.info("%s: %s", name, line[:LINE_MAX].decode(errors="replace"))
                        partial = partial[-LINE_MAX:]
            finally:
                proc.unsubscribe(sub)
            delay = 0.5 if time.monotonic() - started > 60 else min(delay * 2, 30.0)
            await aio.sleep(delay)


async def _post(port: int, path: str, body: bytes, timeout: float = 10.0) -> int:
    """POST ``body`` (JSON) to a service on this sandbox's loopback; its status code."""
    reader, writer = await aio.wait_for(aio.open_connection("127.0.0.1", port), timeout)
    try:
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\nConnection: close"
            "\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        line = await aio.wait_for(reader.readline(), timeout)
        parts = line.split()
        return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0
    finally:
        writer.close()
