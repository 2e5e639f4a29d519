"""Service records as E2B's JSON: what the pinned SDK parses from create, connect, get, list
and metrics answers."""

from __future__ import annotations

import math
from typing import Any

from sandhold.envd import ENVD_VERSION
from sandhold.isotime import iso
from sandhold.service.metrics import Sample
from sandhold.service.records import Sandbox

CLIENT_ID = "6532622b"  # legacy constant the API still returns


def short_id(sandbox_id: str) -> str:
    """Old SDKs address sandboxes as ``<id>-<clientID>``."""
    return sandbox_id.split("-", 1)[0]


def created(sbx: Sandbox, domain: str | None) -> dict[str, Any]:
    """``Sandbox``: the answer to create, connect and resume."""
    return {
        "templateID": sbx.info.template,
        "sandboxID": sbx.id,
        "alias": sbx.info.template,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": sbx.life.access_token,
        "trafficAccessToken": sbx.life.traffic_token,
        "domain": domain,
    }


def listed(sbx: Sandbox, disk_size_mb: int) -> dict[str, Any]:
    """``ListedSandbox``. ``diskSizeMB`` is the sandbox's budget, which the kernel enforces;
    ``disk_size_mb`` (the data dir's size) only for a sandbox without one."""
    limits = sbx.info.spec.limits
    out = {
        "templateID": sbx.info.template,
        "alias": sbx.info.template,
        "sandboxID": sbx.id,
        "clientID": CLIENT_ID,
        "startedAt": iso(sbx.info.created_at),
        "endAt": iso(sbx.end_at),
        "cpuCount": max(1, math.ceil(limits.cpu)),
        "memoryMB": limits.memory_mb,
        "diskSizeMB": limits.disk_mb or disk_size_mb,
        "metadata": sbx.metadata,
        "state": sbx.state,  # a failed sandbox is paused for good (docs/e2b.md)
        "envdVersion": ENVD_VERSION,
        "volumeMounts": sbx.life.surface.get("volume_mounts") or [],
    }
    if sbx.failed:  # Sandhold's own field (the SDK keeps unknown ones aside): why it failed
        out["sandholdFailure"] = sbx.info.failure or "its agent died"
    elif sbx.info.suspended:  # Sandhold's own too: paused, its processes checkpointed to disk
        out["sandholdSuspended"] = sbx.info.suspended
    return out


def detail(sbx: Sandbox, disk_size_mb: int, domain: str | None) -> dict[str, Any]:
    """``SandboxDetail`` (``GET /sandboxes/{id}``)."""
    out = listed(sbx, disk_size_mb)
    out.update(
        envdAccessToken=sbx.life.access_token,
        allowInternetAccess=sbx.life.surface.get("allow_internet_access"),
        domain=domain,
        network={
            **(sbx.life.surface.get("network") or {}),
            "allowPublicTraffic": sbx.life.traffic_token is None,
        },
        lifecycle={
            "autoResume": sbx.life.auto_resume,
            "onTimeout": "pause" if sbx.life.auto_pause else "kill",
        },
    )
    if not sbx.running:
        # Memory kept (in the freezer, or in its checkpoint once suspended to disk), or
        # dropped by a filesystem-only pause: resume boots it afresh.
        out["pauseMode"] = "filesystem" if sbx.info.suspended == "filesystem" else "full"
    return out


def metric(s: Sample) -> dict[str, Any]:
    """``SandboxMetric``."""
    return {
        "timestamp": iso(s.at),
        "timestampUnix": int(s.at),
        "cpuCount": s.cpu_count,
        "cpuUsedPct": s.cpu_used_pct,
        "memUsed": s.mem_used,
        "memTotal": s.mem_total,
        "memCache": s.mem_cache,
        "diskUsed": s.disk_used,
        "diskTotal": s.disk_total,
    }
