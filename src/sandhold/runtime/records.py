"""What the runtime records about a sandbox (``data_dir/sandboxes/<id>/state.json``) and what it
measures of one; plain data, no behaviour."""

from __future__ import annotations

import os
import secrets
import string
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sandhold.runtime import safefs
from sandhold.runtime.spec import SandboxSpec

# failed: its processes are gone though nobody killed it (its agent died: a bug, the host
# rebooted). Kept, files and all, until it is killed; never resumed.
State = Literal["running", "paused", "failed"]
ID_ALPHABET = string.ascii_lowercase + string.digits


def new_sandbox_id() -> str:
    """E2B-shaped ids: 20 characters of [a-z0-9] (hosts like ``49983-<id>.domain`` split on '-')."""
    return "".join(secrets.choice(ID_ALPHABET) for _ in range(20))


@dataclass
class SandboxInfo:
    id: str
    template: str
    state: State
    spec: SandboxSpec
    created_at: float
    pid: int  # host pid of bwrap (the tree's root, in the sandbox's cgroups)
    init_pid: int  # host pid of the sandbox's pid 1
    dir: Path
    workspace: Path | None
    paused_at: float | None = None
    extra: dict[str, object] = field(default_factory=dict)
    failed_at: float | None = None
    failure: str | None = None  # why it is marked failed
    host_uid: int | None = None  # the first host id of its uid range (older records: unknown)
    suspended: str | None = None  # "disk": paused with no process, its memory image kept
    # "warm": its template's checkpoint, "pool": booted ahead, "fork", "snapshot"
    started_from: str | None = None
    # The PID namespace its pids are numbers of (older records: unknown, taken as the reader's)
    pid_ns: str | None = None

    @property
    def agent_socket(self) -> Path:
        return self.dir / "run" / "agent.sock"

    @property
    def metadata(self) -> dict[str, str]:
        return self.spec.metadata

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "template": self.template,
            "state": self.state,
            "spec": self.spec.model_dump(mode="json"),
            "created_at": self.created_at,
            "pid": self.pid,
            "init_pid": self.init_pid,
            "workspace": str(self.workspace) if self.workspace else None,
            "paused_at": self.paused_at,
            "extra": self.extra,
            "failed_at": self.failed_at,
            "failure": self.failure,
            "host_uid": self.host_uid,
            "suspended": self.suspended,
            "started_from": self.started_from,
            "pid_ns": self.pid_ns,
        }

    @classmethod
    def from_json(cls, d: dict[str, object], directory: Path) -> SandboxInfo:
        ws = d.get("workspace")
        return cls(
            id=str(d["id"]),
            template=str(d["template"]),
            state=d["state"],  # type: ignore[arg-type]
            spec=SandboxSpec.model_validate(d["spec"], context={"stored": True}),
            created_at=float(d["created_at"]),  # type: ignore[arg-type]
            pid=int(d["pid"]),  # type: ignore[call-overload]
            init_pid=int(d["init_pid"]),  # type: ignore[call-overload]
            dir=directory,
            workspace=Path(str(ws)) if ws else None,
            paused_at=d.get("paused_at"),  # type: ignore[arg-type]
            extra=dict(d.get("extra") or {}),  # type: ignore[call-overload]
            failed_at=d.get("failed_at"),  # type: ignore[arg-type]
            failure=d.get("failure"),  # type: ignore[arg-type]
            host_uid=d.get("host_uid"),  # type: ignore[arg-type]
            suspended=d.get("suspended"),  # type: ignore[arg-type]
            started_from=d.get("started_from"),  # type: ignore[arg-type]
            pid_ns=d.get("pid_ns"),  # type: ignore[arg-type]
        )


@dataclass
class Usage:
    cpu_seconds: float
    memory_bytes: int
    memory_cache_bytes: int
    memory_limit_bytes: int
    oom_kills: int
    pids: int
    disk_bytes: int
    cpu_count: float
    disk_limit_bytes: int = 0  # the budget; 0 when disk use is not capped


def dir_size(path: Path) -> int:
    return safefs.tree_size(path)


def atomic_write(path: Path, text: str) -> None:
    # A temporary name of its own per writer: two writers (threads, processes) must never
    # share one and tear each other's record.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def session_of(metadata: dict[str, str]) -> str | None:
    """The session a sandbox serves, for the egress audit log (the gateway's tag)."""
    for key, value in metadata.items():
        if key == "session_id" or key.endswith(".session_id"):
            return value
    return None
