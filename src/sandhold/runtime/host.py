"""The parts of this host that sandbox operations share, handed to each helper as one frozen
``Host`` (each part its own object, none of them the ``Runtime``), and the runtime's public API
as the features built on it see it (``Sandboxes``)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sandhold.config import Settings
from sandhold.egress.control import EgressControl
from sandhold.runtime import cgroups
from sandhold.runtime.agentlib import AgentLib
from sandhold.runtime.cgroup_files import Group
from sandhold.runtime.disk import DiskBudget
from sandhold.runtime.record_store import RecordStore
from sandhold.runtime.records import SandboxInfo
from sandhold.runtime.spec import SandboxSpec
from sandhold.runtime.templates.layers import LayerStore
from sandhold.runtime.templates.store import Template, TemplateStore
from sandhold.runtime.uids import UidPool
from sandhold.runtime.wsdisk import WorkspaceDisk


class Children:
    """The bwrap processes this process started, by sandbox id: ours to wait for (a sandbox
    created by another process is not a child)."""

    def __init__(self) -> None:
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def add(self, sandbox_id: str, proc: subprocess.Popen[bytes]) -> None:
        self._procs[sandbox_id] = proc

    def pop(self, sandbox_id: str) -> subprocess.Popen[bytes] | None:
        return self._procs.pop(sandbox_id, None)

    def poll(self, sandbox_id: str) -> None:
        """Reap the sandbox's bwrap if it exited, so it does not linger as a zombie."""
        proc = self._procs.get(sandbox_id)
        if proc is not None:
            proc.poll()


@dataclass(frozen=True)
class Host:
    settings: Settings
    records: RecordStore
    templates: TemplateStore
    layers: LayerStore
    uids: UidPool
    disk: DiskBudget
    wsdisk: WorkspaceDisk
    egress: EgressControl
    agent_lib: AgentLib
    children: Children = field(default_factory=Children)
    cgroup_group: str = ""  # cgroup_parent.name(): read once, by the Runtime

    @property
    def sandboxes_dir(self) -> Path:
        return self.records.sandboxes_dir

    @property
    def workspaces_dir(self) -> Path:
        return self.settings.data_dir / "workspaces"

    def cgroup(self, sandbox_id: str) -> Group:
        return cgroups.group(sandbox_id, self.cgroup_group)


class Sandboxes(Protocol):
    """The runtime's public API, as pools, warm starts, builds and snapshots use it."""

    @property
    def host(self) -> Host: ...

    def create(
        self,
        spec: SandboxSpec | dict[str, object],
        extra: dict[str, object] | None = None,
        layer_image: Path | None = None,
        template: Template | None = None,
        sandbox_id: str | None = None,
    ) -> SandboxInfo: ...

    def kill(self, sandbox_id: str) -> None: ...

    def pause(self, sandbox_id: str) -> SandboxInfo: ...

    def list(self) -> list[SandboxInfo]: ...
