"""Building templates from steps: what E2B's ``Template`` builder sends (``RUN``, ``COPY``,
``ENV``, ``WORKDIR``, ``USER``; its ``pip_install``, ``apt_install``, ``git_clone``, ``make_dir``
... are ``RUN``s) and what a Dockerfile says.

Each step that changes files runs in a **build sandbox**: an ordinary sandbox (the same
boundary: its own uid range, no host root, cgroups, seccomp) of the layers built so far, with
egress only to the operator's build allow-list (``template_build_allow_out``) and no secrets.
Once the step is done its processes are frozen and its writable layer (overlayfs' upper
directory, whiteouts and opaque directories included) becomes a **layer** of the layer store
(layers.py), its owners moved back to the canonical range. A template is its base's root plus
its layers, stacked as overlay lower directories.

**The cache**: a layer's id hashes its parent's id, the step and its inputs (a ``COPY``'s files
hash and, for an uploaded archive, its content digest as the server computed it: layers are
shared between teams only for identical bytes, never on a client's claim; the env, user and
workdir it runs with); an existing layer is reused unless the step (or one before it) is
forced. So an identical rebuild runs nothing, and changing step k rebuilds from k. A failing
step reports its exit code and output; nothing of the build is kept but the layers of the steps
that succeeded (cache for the next attempt).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import posixpath
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandhold.errors import InvalidRequest, NotFound, SandholdError, TemplateBuildFailed
from sandhold.runtime import disk
from sandhold.runtime.client import AgentClient, run_sync
from sandhold.runtime.host import Host, Sandboxes
from sandhold.runtime.records import SandboxInfo
from sandhold.runtime.templates import registries
from sandhold.runtime.templates.store import BUILD_CAPS, Template

STEP_TYPES = ("RUN", "COPY", "ENV", "WORKDIR", "USER")
BUILD_KEY = "template_build"  # in a build sandbox's record: what leftovers() finds
COPY_TAR = "/tmp/.sandhold-copy.tar"  # inside the build sandbox, gone before its layer is kept
STEP_TIMEOUT_S = 3600.0
MAX_OUTPUT = 1 << 20  # of a failing step, kept for the error (its log has all of it)

log = logging.getLogger(__name__)
Log = Callable[[str, str], None]  # level, message


@dataclass
class Step:
    type: str
    args: list[str]
    files_hash: str | None = None
    force: bool = False
    # A COPY's archive's sha256 as the server computed it (service/builds.py) when the files
    # hash is the client's claim; None when the hash is our own (a Dockerfile's, dockerfile.py).
    digest: str | None = None

    def check(self, index: int) -> None:
        where = f"step {index + 1} ({self.type})"
        if self.type not in STEP_TYPES:
            raise InvalidRequest(
                f"step {index + 1}: unsupported instruction {self.type!r} "
                f"(supported: {', '.join(STEP_TYPES)})"
            )
        n = len(self.args)
        if self.type in ("RUN", "WORKDIR", "USER") and not (1 <= n <= 2 and self.args[0]):
            raise InvalidRequest(f"{where}: needs its argument")
        if self.type == "ENV" and (n == 0 or n % 2):
            raise InvalidRequest(f"{where}: needs name, value pairs")
        if self.type == "COPY" and (n < 2 or not self.files_hash):
            raise InvalidRequest(f"{where}: needs a source, a destination and its files' hash")
        if self.type == "COPY" and _outside(self.args[0]):
            raise InvalidRequest(
                f"{where}: the source {self.args[0]!r} is outside the build "
                "context (a relative path within it)"
            )


@dataclass
class BuildRequest:
    name: str  # the template's name in the store
    base: str  # the template it starts from (in the store)
    steps: list[Step]
    start_cmd: str | None = None
    ready_cmd: str | None = None
    force: bool = False  # rebuild every layer
    cpu: float | None = None
    memory_mb: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # Template fields: owner, tags, ...


@dataclass
class _State:
    env: dict[str, str]
    user: str
    workdir: str


class Builder:
    def __init__(self, sandboxes: Sandboxes, upload: Callable[[str], Path]) -> None:
        self.sandboxes = sandboxes  # the build sandboxes' runtime
        self.host = sandboxes.host
        self.upload = upload  # a COPY's files hash -> its archive (tar, gzipped or not)
        self.layers = self.host.layers
        self._cancelled = False
        self._active: str | None = None  # the build sandbox of the step running

    def cancel(self) -> None:
        """End the build from another thread: its running step's build sandbox is killed (so
        the step ends now), no later step starts, and the build fails "cancelled" leaving no
        template (the layers of the steps done stay, as cache)."""
        self._cancelled = True
        active = self._active
        if active is not None:
            with contextlib.suppress(SandholdError):
                self.sandboxes.kill(active)

    def _check_cancelled(self) -> None:
        if self._cancelled:
            raise TemplateBuildFailed("build cancelled")

    def build(self, req: BuildRequest, emit: Log) -> Template:
        for i, step in enumerate(req.steps):
            step.check(i)
        with self.layers.building():
            tpl = self._build(req, emit)
        self.layers.collect(self.host.templates)  # what a replaced template used alone
        return tpl

    def _build(self, req: BuildRequest, emit: Log) -> Template:
        base = self.host.templates.get(req.base)
        if ("/usr", "/usr") in base.ro_binds and not base.rw_dirs:  # built on `base`: its own
            base = Template(**{**base.__dict__, "rw_dirs": ["/usr/local"]})  # /usr/local
        state = _State(dict(base.env), base.user, base.workdir)
        key = _hash(["base", base.name, base.created_at, base.layers])
        built: list[str] = []  # the new layers, bottom first
        forced = req.force
        for i, step in enumerate(req.steps):
            self._check_cancelled()
            label = f"[{i + 1}/{len(req.steps)}] {step.type} {' '.join(step.args)}"[:300]
            parts = [
                key,
                step.type,
                step.args,
                step.files_hash,
                state.user,
                state.workdir,
                sorted(state.env.items()),
            ]
            if step.digest is not None:  # what the layer holds: the bytes, not the claim
                parts.append(["content", step.digest])
            key = _hash(parts)
            forced = forced or step.force
            if step.type == "ENV":
                state.env.update(zip(step.args[::2], step.args[1::2], strict=True))
                emit("info", label)
                continue
            if step.type == "USER":
                state.user = step.args[0]
                emit("info", label)
                continue
            if step.type == "WORKDIR" and _volatile(_abs(step.args[0], state.workdir)):
                raise InvalidRequest(
                    f"step {i + 1}: WORKDIR {step.args[0]}: it is under a "
                    "file system every sandbox gets afresh (/tmp, /dev, /proc, "
                    "/run): nothing there is kept"
                )
            if not forced and self.layers.exists(key):
                emit("info", f"CACHED {label}")
            else:
                emit("info", label)
                t0 = time.monotonic()
                self._run(base, built, state, step, key, emit)
                emit("info", f"done in {time.monotonic() - t0:.1f} s")
            built.append(key)
            if step.type == "WORKDIR":
                state.workdir = _abs(step.args[0], state.workdir)
        tpl = Template(
            name=req.name,
            kind=base.kind,
            rootfs=base.rootfs,
            user=state.user,
            workdir=state.workdir,
            env=state.env,
            ro_binds=list(base.ro_binds),
            services=list(base.services),
            disk_mb=base.disk_mb,
            layers=[self.layers.path(k) for k in reversed(built)] + list(base.layers),
            cpu=req.cpu or base.cpu,
            memory_mb=req.memory_mb or base.memory_mb,
            agent_kit=base.agent_kit,
            rw_dirs=list(base.rw_dirs),
            root_caps=list(base.root_caps),
        )
        if req.start_cmd:
            tpl.services.append(
                {
                    "name": "start",
                    "argv": ["/bin/bash", "-l", "-c", req.start_cmd],
                    "user": state.user,
                    "cwd": state.workdir,
                    "ready_cmd": req.ready_cmd or "true",
                }
            )
            tpl.warm = True  # E2B hands out its sandboxes with the start command serving
        for k, v in req.meta.items():
            setattr(tpl, k, v)
        return self.host.templates.add(tpl)

    # -- one step in a build sandbox --------------------------------------------------------
    def _run(
        self, base: Template, built: list[str], state: _State, step: Step, key: str, emit: Log
    ) -> None:
        layers = [self.layers.path(k) for k in reversed(built)] + list(base.layers)
        stack = Template(
            **{
                **base.__dict__,
                "services": [],
                "warm": False,
                "layers": layers,
                "root_caps": list(BUILD_CAPS),
            }
        )
        info = self.sandboxes.create(build_spec(self.host, base), {BUILD_KEY: key}, template=stack)
        self._active = info.id
        try:
            self._check_cancelled()  # cancelled while it was made: cancel() did not see it
            if step.type == "RUN":
                user = step.args[1] if len(step.args) > 1 and step.args[1] else state.user
                self._exec(info, ["/bin/bash", "-c", step.args[0]], user, state, emit)
            elif step.type == "WORKDIR":
                path = _abs(step.args[0], state.workdir)
                self._exec(info, ["mkdir", "-p", "--", path], "root", state, emit)
            else:
                self._copy(info, step, state, emit)
            # Frozen, nothing of it writes any more; its layer stays mounted while it is kept
            # (a filesystem-only pause may let the layer's own filesystem go).
            self.sandboxes.pause(info.id)
            self._check_cancelled()
            layer = info.dir / disk.MOUNT if info.spec.limits.disk_mb is not None else info.dir
            self.layers.commit(key, layer / "upper")
        except Exception:
            self._check_cancelled()  # what the kill made the step fail with is not its error
            raise
        finally:
            self._active = None
            with contextlib.suppress(NotFound):  # cancel() may have killed it
                self.sandboxes.kill(info.id)

    def _exec(
        self, info: SandboxInfo, argv: list[str], user: str, state: _State, emit: Log
    ) -> None:
        def output(_stream: str, chunk: bytes) -> None:
            for line in chunk.decode(errors="replace").splitlines():
                emit("info", line)

        async def go() -> Any:
            async with AgentClient(info.agent_socket, timeout=None) as agent:
                return await agent.run(
                    argv,
                    user=user,
                    cwd=state.workdir,
                    env=state.env,
                    timeout_s=STEP_TIMEOUT_S,
                    max_output=MAX_OUTPUT,
                    on_output=output,
                )

        r = run_sync(go())
        if r.exit_code != 0:
            tail = (r.stdout + r.stderr).decode(errors="replace").strip()[-2000:]
            code = "timed out" if r.exit_code is None else f"exit code {r.exit_code}"
            raise TemplateBuildFailed(f"{shlex.join(argv)[:200]} failed ({code}): {tail}")

    def _copy(self, info: SandboxInfo, step: Step, state: _State, emit: Log) -> None:
        assert step.files_hash is not None
        archive = self.upload(step.files_hash)
        data = archive.read_bytes()
        if step.digest is not None and hashlib.sha256(data).hexdigest() != step.digest:
            # uploaded again since the build started: the layer's key names the bytes checked
            raise TemplateBuildFailed(
                f"COPY {step.args[0]}: its files were uploaded again "
                "while the build ran; start the build again"
            )

        async def put() -> None:
            async with AgentClient(info.agent_socket, timeout=None) as agent:
                await agent.write_file(COPY_TAR, data, user="root")

        run_sync(put())
        src, dest = step.args[0], _abs(step.args[1], state.workdir, keep_slash=True)
        env = {
            **state.env,
            "SRC": src,
            "DEST": dest,
            # the user given, else the current one (E2B's copy() without a user)
            "OWNER": (step.args[2] if len(step.args) > 2 else "") or state.user,
            "MODE": step.args[3] if len(step.args) > 3 else "",
            "TAR": COPY_TAR,
        }
        self._exec(
            info, ["/bin/bash", "-c", COPY_SCRIPT], "root", _State(env, "root", state.workdir), emit
        )


# Docker's COPY semantics over the uploaded archive (entries relative to the build context): a
# single file to a path not ending in "/" (and not a directory) is that file; otherwise every
# match goes into DEST, a directory's contents rather than the directory.
COPY_SCRIPT = r"""
set -euo pipefail
shopt -s nullglob dotglob
t=$(mktemp -d /tmp/.sandhold-copy.XXXXXX)
tar -xf "$TAR" -C "$t" --no-same-owner
rm -f "$TAR"
cd "$t"
matches=( $SRC )
[ ${#matches[@]} -gt 0 ] || { echo "COPY: nothing matches $SRC" >&2; exit 1; }
done_=()
made() {  # mkdir -p, and the topmost directory it made is the owner's too (Docker's --chown)
  local d=$1 top=""
  while [ ! -e "$d" ]; do top=$d; d=$(dirname "$d"); done
  mkdir -p -- "$1"
  if [ -n "$top" ]; then done_+=("$top"); fi
}
one=${matches[0]}
if [ ${#matches[@]} -eq 1 ] && [ ! -d "$one" ] && [[ "$DEST" != */ ]] && [ ! -d "$DEST" ]; then
  made "$(dirname "$DEST")"; cp -a -- "$one" "$DEST"; done_+=("$DEST")
else
  made "$DEST"
  for m in "${matches[@]}"; do
    if [ -d "$m" ]; then
      for e in "$m"/*; do cp -a -- "$e" "$DEST/"; done_+=("$DEST/$(basename "$e")"); done
    else
      cp -a -- "$m" "$DEST/"; done_+=("$DEST/$(basename "$m")")
    fi
  done
fi
case "$OWNER" in ''|*:*) ;; *) OWNER="$OWNER:" ;; esac  # user: its own group
if [ -n "$OWNER" ]; then chown -R -- "$OWNER" "${done_[@]}"; fi
if [ -n "$MODE" ]; then find "${done_[@]}" -type f -exec chmod "$MODE" {} +; fi
cd /; rm -rf "$t"
"""


class BuildLog:
    """A build's log: JSON lines ``{timestamp, level, message}`` in
    ``data_dir/template-builds/<name>.log`` (the last build of each template: what
    ``sandhold template logs`` reads), each entry also passed to ``then``."""

    def __init__(self, host: Host, name: str, then: Log | None = None) -> None:
        self.path = log_path(host, name)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._f = self.path.open("w", encoding="utf-8")
        self.then = then

    def __call__(self, level: str, message: str) -> None:
        entry = {"timestamp": datetime.now(UTC).isoformat(), "level": level, "message": message}
        self._f.write(json.dumps(entry) + "\n")
        self._f.flush()
        if self.then is not None:
            self.then(level, message)

    def close(self) -> None:
        self._f.close()


def log_path(host: Host, name: str) -> Path:
    return host.settings.data_dir / "template-builds" / f"{name}.log"


def kill_leftovers(sandboxes: Sandboxes) -> int:
    """Kill the build sandboxes a build cut short left (its process died: a server restart);
    returns how many. Their layers were never kept."""
    killed = 0
    for info in sandboxes.list():
        if BUILD_KEY in info.extra:
            sandboxes.kill(info.id)
            killed += 1
    if killed:
        log.warning("killed %d build sandboxes of builds cut short", killed)
    return killed


def build_spec(host: Host, base: Template) -> dict[str, Any]:
    """A build sandbox's spec: egress only to the build allow-list (none without one), the
    build's memory and disk, no workspace, no secrets (no tenant: nothing is injected)."""
    s = host.settings
    # `pip install --user` (the SDK's pip_install) on a Debian Python: PEP 668 would refuse it.
    env: dict[str, str] = {"PIP_BREAK_SYSTEM_PACKAGES": "1"}
    if "/usr/local" in base.rw_dirs and ("/usr", "/usr") in base.ro_binds:
        # Built on `base`: the host's npm installs globally into its read-only /usr (Debian's
        # prefix); the template's own /usr/local is where its global installs go.
        env["NPM_CONFIG_PREFIX"] = "/usr/local"
    if s.template_build_allow_out is None:
        machine = registries.machine()
        allow = machine.hosts()
        env.update(machine.env())
    else:
        allow = list(s.template_build_allow_out)
    network: dict[str, Any] = {"mode": "allowlist", "allow": allow} if allow else {"mode": "none"}
    limits: dict[str, Any] = {"memory_mb": s.template_build_memory_mb}
    if host.disk.enforced:
        limits["disk_mb"] = max(s.template_build_disk_mb, base.disk_mb or 0)
    return {"template": base.name, "network": network, "limits": limits, "env": env}


def _outside(src: str) -> bool:
    norm = posixpath.normpath(src)
    return src.startswith("/") or norm == ".." or norm.startswith("../")


def _volatile(path: str) -> bool:
    return any(path == d or path.startswith(d + "/") for d in ("/tmp", "/dev", "/proc", "/run"))


def _abs(path: str, workdir: str, keep_slash: bool = False) -> str:
    out = path if path.startswith("/") else f"{workdir.rstrip('/')}/{path}"
    return out if keep_slash or out == "/" else out.rstrip("/")


def _hash(parts: list[Any]) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]
