"""A create on the E2B surface (``NewSandbox``) as a service request (``CreateSandbox``).

What the wire smuggles in metadata is parsed out here and never reaches the sandbox's labels:
CubeSandbox's ``host-mount`` (host binds, only under ``host_mount_roots``), Sandhold's
``sandhold.workspace-disk-mb`` (the budget of host-mount's ``/workspace``),
``sandhold.file-view`` and ``sandhold.secrets-scope`` (see ``sandhold.service.metadata``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from sandhold.config import Settings
from sandhold.e2b.models import NewSandbox
from sandhold.e2b.network import egress_policy, secrets_tenant
from sandhold.e2b.volumes import VolumeStore
from sandhold.errors import InvalidRequest, Unsupported
from sandhold.mcp_gateway.config import check as check_mcp
from sandhold.runtime.spec import clipped
from sandhold.service import fleet
from sandhold.service.limits import check_mounts, check_path
from sandhold.service.metadata import (
    FILE_VIEW_KEY,
    HOST_MOUNT_KEY,
    SECRETS_SCOPE_KEY,
    WORKSPACE_DISK_KEY,
)
from sandhold.service.records import CreateSandbox, Mount

DEFAULT_TIMEOUT_S = 300
V1_DEFAULT_TIMEOUT_S = 15
SDK_TRUE_BY_DEFAULT_UNTIL = (2, 51)  # the first SDK release (Python, JS) that omits it


def create_request(
    settings: Settings,
    volumes: VolumeStore,
    team: str,
    body: NewSandbox,
    *,
    v1: bool,
    idempotency_key: str | None,
    sdk_version: str | None = None,
) -> CreateSandbox:
    timeout = body.timeout
    if timeout is None:
        timeout = V1_DEFAULT_TIMEOUT_S if v1 else DEFAULT_TIMEOUT_S
    metadata = dict(body.metadata or {})
    workspace_dir, mounts = host_mounts(settings, metadata.pop(HOST_MOUNT_KEY, None))
    workspace_disk_mb = parse_workspace_disk(metadata.pop(WORKSPACE_DISK_KEY, None))
    file_view = parse_file_view(metadata.pop(FILE_VIEW_KEY, None))
    requested = body.network.model_dump(exclude_none=True) if body.network else {}
    tenant = secrets_tenant(team, metadata.pop(SECRETS_SCOPE_KEY, None))
    internet = body.allow_internet_access
    if internet and not settings.egress_e2b_enabled and _true_unasked(sdk_version):
        internet = None  # (where no sandbox has network, as every one here)
    policy = egress_policy(settings, tenant, internet, requested)
    if body.mcp is not None:  # the SDK then runs mcp-gateway in it: sandhold.mcp_gateway
        try:
            check_mcp(body.mcp)
        except ValueError as e:
            raise InvalidRequest(str(e)) from None
    if body.iam:
        raise Unsupported("iam (workload identity tokens) is not supported by this server")
    check_mounts(len(mounts) + len(body.volumeMounts or []), settings)  # before any lookup
    for m in body.volumeMounts or []:
        mounts.append(Mount(volumes.path(volumes.by_name(team, m.name)), m.path))
    public = requested.get("allowPublicTraffic")
    digest = hashlib.sha256(body.model_dump_json().encode()).hexdigest()
    return CreateSandbox(
        owner=team,
        template=body.templateID,
        timeout_s=timeout,
        on_timeout="pause" if body.autoPause else "kill",
        auto_resume=bool(body.autoResume and body.autoResume.enabled),
        auto_pause_memory=body.autoPauseMemory,
        env=body.envVars or {},
        metadata=metadata,
        workspace_dir=workspace_dir,
        workspace_disk_mb=workspace_disk_mb,
        mounts=mounts,
        file_view=file_view,
        network=policy,
        public_traffic=settings.public_traffic_default if public is None else public,
        idempotency=(idempotency_key, digest) if idempotency_key else None,
        assigned=fleet.assigned.get(),
        surface={
            "allow_internet_access": body.allow_internet_access,
            "network": requested or None,
            "volume_mounts": [m.model_dump() for m in body.volumeMounts or []],
        },
    )


def _true_unasked(sdk_version: str | None) -> bool:
    """Whether the SDK that sent a create (its ``package_version`` header) sends
    ``allow_internet_access=true`` on every create, asked for or not: the Python and JavaScript
    SDKs before 2.51 do (tests/compat: without this every create of theirs was refused)."""
    try:
        major, minor = (int(p) for p in (sdk_version or "").split(".")[:2])
    except ValueError:
        return False
    return (major, minor) < SDK_TRUE_BY_DEFAULT_UNTIL


def host_mounts(settings: Settings, raw: str | None) -> tuple[Path | None, list[Mount]]:
    """CubeSandbox's ``host-mount`` metadata: a JSON list of ``{hostPath, mountPath,
    readOnly}``. Only paths under ``host_mount_roots`` may be bound; ``/workspace`` becomes
    the sandbox's workspace, the rest plain mounts. Returns (workspace_dir, mounts)."""
    if raw is None:
        return None, []
    if not settings.host_mount_roots:
        raise InvalidRequest(f"metadata {HOST_MOUNT_KEY!r} is not enabled on this server")
    try:
        items = json.loads(raw)
        if not isinstance(items, list):
            raise ValueError
        parsed = [
            (str(i["hostPath"]), str(i["mountPath"]), bool(i.get("readOnly", False))) for i in items
        ]
    except (ValueError, TypeError, KeyError):
        raise InvalidRequest(
            f"metadata {HOST_MOUNT_KEY!r} must be a JSON list of {{hostPath, mountPath}}"
        ) from None
    # Bounded before the host is looked at (the sandbox service checks the mounts made again).
    check_mounts(sum(m.rstrip("/") != "/workspace" for _, m, _ in parsed), settings)
    for host_path, mount_path, _ in parsed:
        check_path(host_path, "host-mount hostPath", settings)
        check_path(mount_path, "host-mount mountPath", settings)
        if "\0" in host_path or "\0" in mount_path:
            raise InvalidRequest("host-mount paths must not contain NUL bytes")
    roots = [r.resolve() for r in settings.host_mount_roots]
    workspace_dir: Path | None = None
    mounts: list[Mount] = []
    for host_path, mount_path, read_only in parsed:
        real = Path(host_path).resolve()
        if not real.is_absolute() or not any(real.is_relative_to(r) for r in roots):
            raise InvalidRequest(
                f"host-mount path {clipped(host_path)} is outside the allowed roots"
            )
        if not real.is_dir():
            raise InvalidRequest(f"host-mount path {clipped(host_path)} is not a directory")
        if mount_path.rstrip("/") == "/workspace":
            if read_only or workspace_dir is not None:
                raise InvalidRequest("host-mount may bind one writable /workspace")
            workspace_dir = real
        else:
            mounts.append(Mount(real, mount_path, read_only))
    return workspace_dir, mounts


def parse_workspace_disk(raw: str | None) -> int | None:
    """The ``sandhold.workspace-disk-mb`` metadata: the disk budget (MiB, decimal) of the
    workspace bound by ``host-mount``; the runtime bounds it (``max_disk_mb``)."""
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 9:
        raise InvalidRequest(
            f"metadata {WORKSPACE_DISK_KEY!r} must be a number of MiB, not {clipped(raw)}"
        )
    return int(raw)


def parse_file_view(raw: str | None) -> dict[str, Any]:
    """The ``sandhold.file-view`` metadata: a JSON object ``{read, write}`` of sandbox paths."""
    if raw is None:
        return {}
    try:
        view = json.loads(raw)
    except ValueError:
        view = None
    if not isinstance(view, dict):
        raise InvalidRequest(
            f"metadata {FILE_VIEW_KEY!r} must be a JSON object {{read: [...], write: [...]}}"
        )
    return view
