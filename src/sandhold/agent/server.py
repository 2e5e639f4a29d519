"""Wires the services to routes, listens on the unix socket and runs: in a sandbox for as long as
the sandbox lives, elsewhere (tests on a host) until SIGTERM or SIGINT.

In a sandbox the agent is pid 1 of the sandbox's pid namespace. The kernel delivers a signal sent
to that init from inside the namespace only if init has a handler for it, so every handler here
is a way for code inside to reach the agent. It has exactly one: SIGCHLD, which only makes it
reap (harmless, whoever sends it). SIGTERM and SIGINT keep no handler (SIGINT's default Python
handler is removed), so ``kill -TERM 1`` or ``kill -9 -1`` as root inside are dropped. The host
never asks it to stop: it kills the sandbox's cgroup, and SIGKILL from outside always arrives.
"""

from __future__ import annotations

import json
import os
import signal
import socket

from . import aio, checkpoint, connect, egress, log, tunnel
from .config import AgentConfig
from .files import FilesHandler
from .filesystem import FilesystemService
from .http import HttpError, HttpServer, Request, Response, Router
from .process import ProcessService
from .process_table import ProcessManager
from .sudo import SudoServer
from .supervisor import ServiceSupervisor
from .system import SystemHandler
from .view import ViewGuard

CONFIGURE_PATH = "/sandhold/configure"  # host-only (the data plane never forwards /sandhold/)


class Agent:
    def __init__(self, config: AgentConfig, sock: socket.socket) -> None:
        self.config = config
        self.sock = sock
        self.manager = ProcessManager(config)
        self.processes = ProcessService(config, self.manager)
        self.services = ServiceSupervisor(config, self.manager)
        self.filesystem = FilesystemService(config)
        self.files = FilesHandler(config)
        self.system = SystemHandler(config)
        self.sudo = SudoServer(config, self.manager)
        self.router = self._routes()
        tunnel.SERVICE_PORTS.update(int(svc["port"]) for svc in config.services if "port" in svc)
        self.http = HttpServer(self.router)
        self._stop = aio.Event()
        self._background: set[aio.Task[None]] = set()
        self._configured = False

    def _routes(self) -> Router:
        r = Router()
        cfg = self.config
        p, fs = self.processes, self.filesystem
        unary = {
            "/process.Process/List": p.list,
            "/process.Process/SendInput": p.send_input,
            "/process.Process/SendSignal": p.send_signal,
            "/process.Process/CloseStdin": p.close_stdin,
            "/process.Process/Update": p.update,
            "/filesystem.Filesystem/Stat": fs.stat,
            "/filesystem.Filesystem/MakeDir": fs.make_dir,
            "/filesystem.Filesystem/Move": fs.move,
            "/filesystem.Filesystem/ListDir": fs.list_dir,
            "/filesystem.Filesystem/Remove": fs.remove,
            "/filesystem.Filesystem/CreateWatcher": fs.create_watcher,
            "/filesystem.Filesystem/GetWatcherEvents": fs.get_watcher_events,
            "/filesystem.Filesystem/RemoveWatcher": fs.remove_watcher,
        }
        for path, method in unary.items():
            r.add("POST", path, connect.unary(method, cfg))
        r.add("POST", "/process.Process/Start", connect.server_stream(p.start, cfg))
        r.add("POST", "/process.Process/Connect", connect.server_stream(p.connect, cfg))
        r.add("POST", "/filesystem.Filesystem/WatchDir", connect.server_stream(fs.watch_dir, cfg))
        r.add("POST", "/process.Process/StreamInput", connect.client_stream(p.stream_input, cfg))
        r.add("GET", "/health", self.system.health)
        r.add("GET", "/envs", self.system.envs)
        r.add("GET", "/metrics", self.system.metrics)
        r.add("GET", "/files", self.files.download)
        r.add("POST", "/files", self.files.upload)
        r.add("POST", checkpoint.QUIESCE_PATH, self._quiesce)
        r.add("POST", CONFIGURE_PATH, self._configure)
        r.tunnel = tunnel.serve_connect
        return r

    async def _quiesce(self, req: Request, resp: Response) -> None:
        """Make way for a checkpoint (see checkpoint.py); answers before it stops serving."""
        await resp.send(204)
        task = aio.get_running_loop().create_task(
            checkpoint.quiesce(self.http.close, self.http.listen_unix, self._rebind)
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _configure(self, req: Request, resp: Response) -> None:
        """A pooled sandbox handed out (runtime/pool.py): once, the create's configuration
        (``agent.json``'s shape) replaces the pool's, as after a warm start."""
        if self._configured:
            raise HttpError(409, "this sandbox was configured already")
        self._configured = True
        try:
            new = AgentConfig.parse(json.loads(await req.read_body(1 << 20)))
        except ValueError as e:
            raise HttpError(400, f"bad configuration: {e}") from None
        if not await self._become(new):
            raise HttpError(500, "a service did not take the sandbox's env")
        await resp.send(204)

    async def _rebind(self, config_fd: int) -> bool:
        """Become the sandbox a warm start made of a template's checkpoint. False if that
        failed."""
        try:
            new = AgentConfig.load(config_fd)
        except (OSError, ValueError) as e:
            log.error("the configuration handed over after a checkpoint is unreadable: %s", e)
            return False
        return await self._become(new)

    async def _become(self, new: AgentConfig) -> bool:
        """Take another create's env, default user and workdir and file view (the rest,
        socket, services, no egress, is the template's); the services that take an env are
        told it."""
        cfg = self.config
        cfg.env, cfg.file_view = new.env, new.file_view
        cfg.default_user, cfg.default_workdir = new.default_user, new.default_workdir
        self.files.view = ViewGuard.from_config(cfg.file_view)
        self.filesystem.view = self.files.view
        return await self.services.announce_env(cfg.env)

    async def run(self) -> None:
        loop = aio.get_running_loop()
        self.manager.install(loop)
        if not is_init():
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop.set)
        await self.http.listen_unix(self.sock)
        relays = await egress.start(self.config.egress)
        await self.sudo.start()
        await self.services.start(self.config.services)
        log.info("listening on %s", self.config.socket)
        await self._stop.wait()
        log.info("shutting down")
        await self.http.close()
        for relay in relays:
            relay.close()
        self.filesystem.close()
        self.manager.kill_all()
        if self.config.socket_owned:
            try:
                os.unlink(self.config.socket)
            except OSError:
                pass


def is_init() -> bool:
    return os.getpid() == 1


def main(config: AgentConfig, sock: socket.socket) -> int:
    os.umask(0o022)  # what commands and created files inherit, like envd
    if is_init():
        # Python's own SIGINT handler would make Ctrl-C from inside a KeyboardInterrupt here
        # (aio installs handlers only for the signals asked of it: SIGCHLD).
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    aio.run(Agent(config, sock).run())
    return 0
