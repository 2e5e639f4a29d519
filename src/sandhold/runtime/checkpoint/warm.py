"""Templates that start warm: a template may carry a checkpoint of one of its sandboxes taken
once its services were ready (the code interpreter's kernel started), and a create that this
checkpoint can serve restores it instead of booting, as a fork is restored (fork.py): a new id,
uid range, cgroups, network namespace and copy of the layer, then the agent is handed the
create's own configuration (env, user, workdir, file view) and the services that take an env
are told it (``env_path``) before the create returns.

The checkpoint (``data_dir/warm/<template>/<key>/``: ``disk.img``, ``checkpoint/``,
``warm.json``) is keyed by what it depends on: the template's record, the CRIU build and the
agent's code; a new key replaces the old one. It is made by ``WarmStarts.build``: a sandbox of
the template with the defaults (no network, no workspace), its ``ready_path`` services waited
for, ``checkpoint_in_place``, then that sandbox is killed. Its images (all but the user
namespace's, which each sandbox remaps in its own copy) are shared read-only, hard-linked into
every sandbox restored from it: they hold a fresh template's state, no one's data.

A create is served warm only when nothing it asks differs from what the checkpoint holds beyond
what the handoff sets: no egress, no workspace or mounts, the template's disk budget, enough
memory. Anything else boots cold, as does a failed warm start (logged; nothing of it is left).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sandhold.errors import InvalidRequest, SandboxStartFailed, SandholdError
from sandhold.runtime import safefs
from sandhold.runtime.boot import agent_config
from sandhold.runtime.checkpoint import fork as forking
from sandhold.runtime.checkpoint import process_tree
from sandhold.runtime.checkpoint.suspend import criu_path
from sandhold.runtime.client import AgentClient, read_status, run_sync
from sandhold.runtime.host import Host, Sandboxes
from sandhold.runtime.records import SandboxInfo
from sandhold.runtime.spec import SandboxSpec
from sandhold.runtime.templates.store import Template, flocked

WARM = "warm"  # under data_dir
META = "warm.json"
READY_TIMEOUT_S = 120.0
MEMORY_HEADROOM = 1.5  # a create's memory limit must leave this much room over the checkpoint's

log = logging.getLogger(__name__)


class WarmStarts:
    def __init__(self, host: Host, sandboxes: Sandboxes) -> None:
        self.host = host
        self.sandboxes = sandboxes  # to boot the sandbox a checkpoint is taken of
        self.root = host.settings.data_dir / WARM
        self._keys: dict[tuple[str, float], str] = {}  # CRIU and the agent: fixed while we run
        # Fetches a checkpoint made by another host into a directory (a fleet host's,
        # service/fleet_templates.py): whether it could.
        self.fetch: Callable[[Template, Path], bool] | None = None

    def key(self, template: Template) -> str:
        """What a checkpoint of ``template`` depends on."""
        cached = self._keys.get((template.name, template.created_at))
        if cached is not None:
            return cached
        criu = self.host.settings.criu_path
        patches = criu.with_name(criu.name + ".patches")
        lib = self.host.agent_lib.path()
        # its code by content: each data dir writes its own copy (and, in a fleet, another
        # host's copy of the same code must give the same key)
        agent = sorted(
            (str(p.relative_to(lib)), hashlib.sha256(p.read_bytes()).hexdigest())
            for p in lib.rglob("*.py")
        )
        parts = [_identity(template), str(criu), _read(patches), agent, self.host.settings.uid_base]
        key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
        self._keys[(template.name, template.created_at)] = key
        return key

    def _dir(self, template: Template) -> Path:
        return self.root / template.name / self.key(template)

    def available(self, template: Template) -> Path | None:
        d = self._dir(template)
        return d if (d / META).exists() else None

    def refusal(self, spec: SandboxSpec, template: Template, d: Path) -> str | None:
        """Why a create of ``spec`` cannot start from the checkpoint in ``d`` (None: it can)."""
        meta = json.loads((d / META).read_text())
        if spec.network.mode != "none":
            return "it has egress"
        if spec.workspace_id or spec.workspace_dir or spec.mounts:
            return "it binds host directories"
        if spec.limits.disk_mb != meta["disk_mb"]:
            return f"its disk budget is not the template's {meta['disk_mb']} MiB"
        need = int(meta["memory_bytes"] * MEMORY_HEADROOM) >> 20
        if spec.limits.memory_mb < need:
            return f"its memory limit is below the {need} MiB a warm start needs"
        return None

    def start(
        self, spec: SandboxSpec, template: Template, extra: dict[str, object], sandbox_id: str
    ) -> SandboxInfo | None:
        """A sandbox of ``spec`` restored from ``template``'s checkpoint, or None when there is
        none, it cannot serve this create, or restoring failed (then nothing of it is left)."""
        on = self.host.settings.warm_templates and self.host.disk.enforced
        if not template.warm or not on:
            return None  # a checkpoint's layer is a disk image
        d = self.available(template)
        if d is None:
            return None
        why = self.refusal(spec, template, d)
        if why is not None:
            log.debug("a %s sandbox boots cold: %s", template.name, why)
            return None
        env = {**template.env, **spec.env}
        config = agent_config(spec, template, env, [])
        try:
            return forking.start(
                self.host, spec, template.name, d, extra, "warm", config, sandbox_id
            )
        except SandholdError as e:
            log.warning("warm start of a %s sandbox failed, booting it cold: %s", template.name, e)
            return None

    def build(self, name: str) -> Path:
        """Make (or find) the checkpoint of template ``name``; returns its directory."""
        template = self.host.templates.get(name)
        if not template.warm:
            raise InvalidRequest(f"template {name} does not start warm")
        if not self.host.disk.enforced:
            raise InvalidRequest(
                "warm starts need disk budgets (disk_enforced=true): the "
                "checkpoint's writable layer is a disk image"
            )
        criu_path(self.host)
        made = self._made(template, make=True)
        assert made is not None
        return made

    def take(self, template: Template) -> Path | None:
        """The checkpoint of ``template`` another host made, fetched (``fetch``), or this
        host's own; None if there is neither (nothing is built)."""
        if not template.warm or self.fetch is None:
            return None
        return self._made(template, make=False)

    def _made(self, template: Template, make: bool) -> Path | None:
        target = self._dir(template)
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with flocked(target.parent / ".lock"):  # one build at a time, in any process
            if not (target / META).exists():
                for stale in target.parent.glob(".new-*"):  # a build a crash cut short
                    safefs.remove_quietly(stale)
                if not (self.fetch and self.fetch(template, target)):
                    if not make:
                        return None
                    self._build(template, target)
        for old in target.parent.iterdir():  # checkpoints of an older template, CRIU or agent
            if old != target and not old.name.startswith("."):
                safefs.remove_quietly(old)
        return target

    def _build(self, template: Template, target: Path) -> None:
        name = template.name
        info = self.sandboxes.create({"template": name})
        staged = Path(tempfile.mkdtemp(dir=target.parent, prefix=".new-"))
        try:
            wait_ready(info, template)
            memory = self.host.cgroup(info.id).usage()["memory_rss_bytes"]
            with self.host.records.locked(info.id):
                forking.checkpoint_in_place(self.host, info, staged)
            for image in (staged / process_tree.IMAGES).iterdir():  # shared by the sandboxes
                if not image.name.startswith("userns-"):  # restored from it (hard links); each
                    image.chmod(0o444)  # remaps its own copy of the user namespace's
            meta = {
                "template": name,
                "key": target.name,
                "made_at": time.time(),
                "disk_mb": info.spec.limits.disk_mb,
                "memory_bytes": memory,
            }
            (staged / META).write_text(json.dumps(meta))
            staged.rename(target)
        except BaseException:
            safefs.remove_quietly(staged)
            raise
        finally:
            self.sandboxes.kill(info.id)
        log.info("template %s starts warm from %s", name, target)

    def remove(self, name: str) -> None:
        safefs.remove_quietly(self.root / name)


def _identity(template: Template) -> dict[str, object]:
    """What a checkpoint depends on in a template's record: not its names, tags or place in the
    fleet, and its files by what they are rather than where this host keeps them (a layer by
    its id, a root by the template that owns it), so a host that fetched the template from the
    fleet's store finds its maker's checkpoint under the same key."""
    d = template.to_json()
    for name in ("tags", "public", "owner", "teams", "alias", "template_id", "build_id"):
        d.pop(name)
    d.pop("updated_at")
    d.pop("fleet")
    d["layers"] = [Path(p).name for p in template.layers]
    d["rootfs"] = template.rootfs.parent.name
    return d


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def wait_ready(info: SandboxInfo, template: Template) -> None:
    """Return once each of the template's services that says how is ready: its
    ``ready_path`` answers 200 on its ``port``, its ``ready_cmd`` (a start command's) exits 0."""
    for svc in template.services:
        if svc.get("ready_path") and isinstance(port := svc.get("port"), int):
            _wait_ready(info.agent_socket, port, str(svc["ready_path"]))
        if svc.get("ready_cmd"):
            _wait_ready_cmd(
                info,
                str(svc["ready_cmd"]),
                str(svc.get("user") or "root"),
                str(svc.get("cwd") or "/"),
            )


def _wait_ready_cmd(info: SandboxInfo, cmd: str, user: str, cwd: str) -> None:
    async def poll() -> str:
        deadline = time.monotonic() + READY_TIMEOUT_S
        last = ""
        async with AgentClient(info.agent_socket, timeout=None) as agent:
            while time.monotonic() < deadline:
                r = await agent.run(
                    ["/bin/bash", "-l", "-c", cmd],
                    user=user,
                    cwd=cwd,
                    timeout_s=max(deadline - time.monotonic(), 1.0),
                )
                if r.exit_code == 0:
                    return ""
                last = (r.stdout + r.stderr).decode(errors="replace").strip()[-300:]
                await asyncio.sleep(0.2)
        return last or "no output"

    if failure := run_sync(poll()):
        raise SandboxStartFailed(
            f"the start command was not ready in {READY_TIMEOUT_S:g} s "
            f"(ready command {cmd!r}: {failure})"
        )


def _wait_ready(agent_socket: Path, port: int, path: str) -> None:
    """GET ``path`` on the sandbox's ``port`` through the agent's tunnel until it answers 200."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(max(deadline - time.monotonic(), 1.0))
            with contextlib.suppress(OSError):
                s.connect(str(agent_socket))
                s.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: agent\r\n\r\n".encode())
                if read_status(s) == 200:
                    s.sendall(
                        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        "Connection: close\r\n\r\n".encode()
                    )
                    status = read_status(s)
                    if status == 200:
                        return
                    last = f"status {status}"
        time.sleep(0.1)
    raise SandboxStartFailed(
        f"the service on port {port} was not ready ({path}) in "
        f"{READY_TIMEOUT_S:g} s: {last or 'no answer'}"
    )
