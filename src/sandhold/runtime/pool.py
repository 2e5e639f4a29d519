"""Pools of sandboxes booted ahead: a create a pool can serve takes a never-used sandbox of its
template, booted with the template's defaults, and binds the request to it late, instead of
booting one (the agent's Python start-up is most of a create's time and all of its first
command's wait).

Binding late, at hand-out: the record takes the create's spec, extra (owner, tokens, timeout)
and creation time; the cgroups take its memory, CPU and pids limits; the agent, told once over
its host-only route ``/sandhold/configure``, takes its env, user, workdir and file view (and
tells the services that take an env). A create that asks what cannot be bound late (egress, a
workspace or mounts, another disk budget, another template) boots as before; so does one that
finds the pool empty.

Nothing of a pooled sandbox comes from anyone: each was booted on its own (its own id, uid
range, layer, namespaces, boot id, random state), ran nothing but its agent and its template's
services, and is handed out once. Pooled sandboxes carry ``extra["pool"]``; the service layer
never lists them (they have no owner), keeps the pools filled (``pool_sizes``) and drains them
on shutdown; a server that starts kills those a previous one left.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections import deque

from sandhold.errors import SandholdError
from sandhold.runtime import liveness
from sandhold.runtime.boot import agent_config
from sandhold.runtime.client import read_status
from sandhold.runtime.host import Host, Sandboxes
from sandhold.runtime.records import SandboxInfo
from sandhold.runtime.spec import SandboxSpec
from sandhold.runtime.templates.store import Template

POOL_KEY = "pool"  # in a pooled sandbox's extra: its template
BUILT = "pool_template_built"  # and when that template was built
CONFIGURE = "/sandhold/configure"  # the agent's host-only route (agent/server.py)

log = logging.getLogger(__name__)


class Pools:
    def __init__(self, host: Host, sandboxes: Sandboxes) -> None:
        self.host = host
        self.sandboxes = sandboxes  # to boot the pooled and kill the unusable
        self._ready: dict[str, deque[str]] = {}
        self._disk_mb: dict[str, int | None] = {}  # each template's default budget
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0  # creates of a pooled template that found no sandbox to take

    def ready(self, template: str) -> int:
        with self._lock:
            return len(self._ready.get(template, ()))

    def fill(self, template: str) -> str:
        """Boot one sandbox into ``template``'s pool; returns its id."""
        made = self.host.templates.get(template).created_at  # a rebuild makes its pool stale
        extra: dict[str, object] = {POOL_KEY: template, BUILT: made}
        info = self.sandboxes.create({"template": template}, extra=extra)
        with self._lock:
            self._ready.setdefault(template, deque()).append(info.id)
            self._disk_mb[template] = info.spec.limits.disk_mb
        return info.id

    def take(
        self, spec: SandboxSpec, template: Template, extra: dict[str, object]
    ) -> SandboxInfo | None:
        """A pooled sandbox bound to ``spec`` and ``extra``, or None (the create boots)."""
        if POOL_KEY in extra or not self.host.settings.pool_sizes.get(template.name):
            return None
        if spec.network.mode != "none" or spec.workspace_id or spec.workspace_dir or spec.mounts:
            return None
        if spec.limits.disk_mb != self._disk_mb.get(template.name):
            return None  # a pooled sandbox's layer is the template's budget
        while True:
            with self._lock:
                queue = self._ready.get(template.name)
                sandbox_id = queue.popleft() if queue else None
                if sandbox_id is None:
                    self.misses += 1
                    return None
            info = self._bind(sandbox_id, spec, template, extra)
            if info is not None:
                with self._lock:
                    self.hits += 1
                return info

    def _bind(
        self, sandbox_id: str, spec: SandboxSpec, template: Template, extra: dict[str, object]
    ) -> SandboxInfo | None:
        """Hand the pooled sandbox over; None (and it is killed) if it cannot serve ``spec``."""
        try:
            with self.host.records.locked(sandbox_id) as d:
                info = self.host.records.load(d)
                if info.state != "running" or not liveness.alive(self.host, info):
                    raise SandholdError("it is not running any more")
                if info.extra.get(BUILT) != template.created_at:
                    raise SandholdError(f"template {template.name} was rebuilt since")
                limits = spec.limits
                self.host.cgroup(sandbox_id).create(limits.memory_mb, limits.cpu, limits.pids)
                config = agent_config(spec, template, {**template.env, **spec.env}, [])
                _configure(info.agent_socket, config)
                info.spec, info.extra, info.created_at = spec, dict(extra), time.time()
                info.started_from = "pool"
                self.host.records.save(info)
                return info
        except (OSError, SandholdError) as e:
            log.warning("pooled sandbox %s could not be handed out (%s); killing it", sandbox_id, e)
            self._discard(sandbox_id)
            return None

    def _discard(self, sandbox_id: str) -> None:
        try:
            self.sandboxes.kill(sandbox_id)
        except SandholdError as e:
            log.error("could not kill pooled sandbox %s: %s", sandbox_id, e)

    def drain(self) -> int:
        """Kill every pooled sandbox on disk (this server's and a previous one's)."""
        with self._lock:
            self._ready.clear()
        pooled = [i.id for i in self.sandboxes.list() if POOL_KEY in i.extra]
        for sandbox_id in pooled:
            self._discard(sandbox_id)
        return len(pooled)


def _configure(agent_socket: object, config: dict[str, object]) -> None:
    body = json.dumps(config).encode()
    head = (
        f"POST {CONFIGURE} HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(agent_socket))
        s.sendall(head + body)
        status = read_status(s)
    if status != 204:
        raise SandholdError(f"its agent answered {status or 'nothing'} to the configuration")
