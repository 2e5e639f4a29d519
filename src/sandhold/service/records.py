"""The service's typed requests and records.

A sandbox's lifecycle (owner, access tokens, timeout, end time, what happens at the end) is kept
in the runtime's own record (``SandboxInfo.extra["lifecycle"]``), never only in memory: every
decision (expire, pause, auto-resume, connect) re-reads it, so a restarted server carries on
where the old one stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from sandhold.runtime.records import SandboxInfo
from sandhold.runtime.spec import NetworkPolicy
from sandhold.service.fleet import Assignment

RECORD_KEY = "lifecycle"
LEGACY_RECORD_KEY = "e2b"  # what servers before the service wrote; read, never written


@dataclass(frozen=True)
class Mount:
    source: Path  # host directory
    target: str  # path inside the sandbox
    read_only: bool = False


@dataclass
class CreateSandbox:
    """Everything a new sandbox is made of. Limits left as None take the server's defaults."""

    owner: str  # the team (E2B) or the gateway: only the owner sees the sandbox
    template: str
    timeout_s: int
    on_timeout: Literal["kill", "pause"] = "kill"
    auto_resume: bool = False  # traffic to a paused sandbox resumes it (needs on_timeout=pause)
    auto_pause_memory: bool | None = None  # False: a filesystem-only pause (not built yet)
    memory_mb: int | None = None
    cpu: float | None = None
    pids: int | None = None
    disk_mb: int | None = None  # the template's budget, else the runtime's default_disk_mb
    env: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    workspace_dir: Path | None = None  # bound at /workspace
    workspace_disk_mb: int | None = None  # its budget: its files in an image (runtime/wsdisk.py)
    mounts: list[Mount] = field(default_factory=list)
    file_view: dict[str, list[str]] = field(default_factory=dict)  # runtime FileView
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    public_traffic: bool = False  # ports other than envd's reachable without the traffic token
    idempotency: tuple[str, str] | None = None  # key, digest of the request
    surface: dict[str, Any] = field(default_factory=dict)  # a surface's own echo, kept as is
    assigned: Assignment | None = None  # a fleet edge's id and generation (service/fleet.py)


class Lifecycle(BaseModel):
    """What the service stores with a sandbox."""

    model_config = ConfigDict(extra="ignore")

    owner: str = Field(validation_alias=AliasChoices("owner", "team"))
    access_token: str = Field(validation_alias=AliasChoices("access_token", "envd_token"))
    traffic_token: str | None = None
    timeout: int  # the create timeout: auto-resume starts over with it
    end_at: float
    auto_pause: bool = False  # on_timeout=pause
    auto_pause_memory: bool | None = None
    auto_resume: bool = False
    idempotency_key: str | None = None
    idempotency_hash: str | None = None
    surface: dict[str, Any] = {}


@dataclass
class Sandbox:
    info: SandboxInfo
    life: Lifecycle

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def owner(self) -> str:
        return self.life.owner

    @property
    def running(self) -> bool:
        return self.info.state == "running"

    @property
    def failed(self) -> bool:
        """Its agent died: it is kept (files and all) until killed, and never runs again."""
        return self.info.state == "failed"

    @property
    def state(self) -> Literal["running", "paused"]:
        """running or paused, as every surface knows them: a failed sandbox is one that is
        paused for good (listed, killable, and gone for every other call)."""
        return "running" if self.running else "paused"

    @property
    def expires(self) -> bool:
        """Whether its end time still means something to do: a running one is paused or killed
        then; a failed one made to be killed is removed then (one made to pause stays, as a
        paused one would)."""
        return self.running or (self.failed and not self.life.auto_pause)

    @property
    def end_at(self) -> float:
        """When a running sandbox times out; for a paused one, when it was paused (as E2B); for a
        failed one, when it failed."""
        if self.info.state == "paused" and self.info.paused_at:
            return self.info.paused_at
        if self.failed and self.info.failed_at:
            return self.info.failed_at
        return self.life.end_at

    @property
    def metadata(self) -> dict[str, str]:
        return self.info.metadata


def view(info: SandboxInfo) -> Sandbox | None:
    """The service's view of a runtime sandbox; None for sandboxes it did not create."""
    raw = info.extra.get(RECORD_KEY, info.extra.get(LEGACY_RECORD_KEY))
    if not isinstance(raw, dict):
        return None
    if RECORD_KEY not in info.extra:  # a legacy record: its surface fields lay at the top
        keys = ("allow_internet_access", "network", "volume_mounts")
        raw = {**raw, "surface": {k: raw[k] for k in keys if k in raw}}
    try:
        return Sandbox(info, Lifecycle.model_validate(raw))
    except ValidationError:
        return None


class RecordCache:
    """The service's records (``view``), each version validated once: a listing views every sandbox
    (bench/listing_bench.py). A version is told by the record's own object, which the runtime
    keeps (and hands out) until the file changes. Each call gets its own copy: callers set
    fields of ``life`` before saving it."""

    def __init__(self) -> None:
        self._parsed: dict[str, tuple[dict[str, Any], Lifecycle]] = {}

    def __call__(self, info: SandboxInfo) -> Sandbox | None:
        raw = info.extra.get(RECORD_KEY)
        hit = self._parsed.get(info.id)
        if hit is not None and hit[0] is raw:
            return Sandbox(info, hit[1].model_copy())
        sbx = view(info)
        if sbx is not None and isinstance(raw, dict):
            self._parsed[info.id] = (raw, sbx.life.model_copy())
        return sbx

    def keep_only(self, ids: set[str]) -> None:
        for gone in self._parsed.keys() - ids:
            self._parsed.pop(gone, None)
