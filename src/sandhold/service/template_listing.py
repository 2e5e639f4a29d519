"""E2B's read-only views of templates, as a team sees them:

* ``GET /templates``: one entry per template, the built-in and operator ones, the images the
  team pulled itself and the team's own;
* ``GET /default-templates``: the built-in and operator ones alone;
* ``GET /templates/{id}``: one template (the entry ``GET /templates`` has of it) with its
  builds, newest first, a page at a time (the stored builds, and those waiting, building or
  failed in the last hour).

Never another team's, public or not (as E2B's listings): another team's template id is a 404."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sandhold.envd import ENVD_VERSION
from sandhold.errors import InvalidRequest, NotFound
from sandhold.runtime.templates.from_image import restricted
from sandhold.service.builds import DEFAULT_TAG, Builds, Job

if TYPE_CHECKING:
    from sandhold.runtime.templates.store import Template

MAX_BUILDS_PAGE = 100  # E2B's paginationLimit
NO_BUILD_ID = str(uuid.UUID(int=0))  # a built-in template's one build


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


def _key(t: Template) -> str:
    return t.template_id or t.name


def _visible(builds: Builds, team: str) -> list[Template]:
    """The stored builds the team sees, oldest first: built-in and operator templates, the
    templates of images the team itself pulled (never another team's, public or not), and the
    team's own that still carry a tag (an untagged build is on its way out)."""
    return sorted(
        (
            t
            for t in builds.rt.templates.list()
            if (t.owner is None and (not restricted(t) or team in (t.teams or [])))
            or (t.owner == team and t.tags)
        ),
        key=lambda t: t.created_at,
    )


def _resources(builds: Builds, t: Template) -> dict[str, Any]:
    s = builds.settings
    return {
        "cpuCount": int(t.cpu or s.default_cpu),
        "memoryMB": t.memory_mb or s.default_memory_mb,
        "diskSizeMB": t.disk_mb or s.default_disk_mb,
    }


def listed(builds: Builds, team: str, *, defaults_only: bool = False) -> list[dict[str, Any]]:
    visible = _visible(builds, team)
    if defaults_only:
        visible = [t for t in visible if t.owner is None]
    return list(_entries(builds, visible).values())


def _entries(builds: Builds, visible: list[Template]) -> dict[str, dict[str, Any]]:
    """One ``Template`` entry per template id: its build with the default tag, else its newest."""
    out: dict[str, dict[str, Any]] = {}
    count: dict[str, int] = {}
    tags: dict[str, list[str]] = {}
    for t in visible:
        key = _key(t)
        count[key] = count.get(key, 0) + 1
        if key in out and DEFAULT_TAG not in t.tags and DEFAULT_TAG in tags[key]:
            continue
        made, name = _when(t.created_at), t.alias or t.name
        tags[key] = t.tags
        out[key] = {
            "templateID": key,
            "buildID": t.build_id or NO_BUILD_ID,
            **_resources(builds, t),
            "public": t.owner is None or t.public,
            "aliases": [name],
            "names": [name],
            "createdAt": made,
            "updatedAt": made,
            "createdBy": None,
            "lastSpawnedAt": None,
            "spawnCount": 0,
            "buildCount": 0,
            "envdVersion": ENVD_VERSION,
            "buildStatus": "ready",
        }
    for key, entry in out.items():
        entry["buildCount"] = count[key]
    return out


def with_builds(
    builds: Builds, team: str, tid: str, limit: int | None, next_token: str | None
) -> tuple[dict[str, Any], str | None]:
    """``GET /templates/{id}``: the template and a page of its builds; the token of the next."""
    limit = MAX_BUILDS_PAGE if limit is None else limit
    if not 1 <= limit <= MAX_BUILDS_PAGE:
        raise InvalidRequest(f"limit must be between 1 and {MAX_BUILDS_PAGE}")
    stored = [t for t in _visible(builds, team) if _key(t) == tid]  # the store read once
    # a build that succeeded is one of the stored; the others are jobs of the last hour
    pending = [
        j
        for j in builds.jobs.values()
        if j.team == team and j.template_id == tid and j.status != "ready"
    ]
    if not stored and not pending:
        raise NotFound(f"template {tid!r} not found")
    dated = [(t.created_at, _stored_build(builds, t)) for t in stored]
    dated += [(j.created, _job_build(builds, j)) for j in pending]
    dated.sort(key=lambda d: (d[0], d[1]["buildID"]), reverse=True)
    entries = [b for _, b in dated]
    if next_token is not None:
        at = next((i for i, b in enumerate(entries) if b["buildID"] == next_token), None)
        if at is None:
            raise InvalidRequest(f"invalid nextToken {next_token!r}")
        entries = entries[at + 1 :]
    page = entries[:limit]
    entry = _entries(builds, stored).get(tid) or _pending_entry(builds, pending)
    return {**entry, "builds": page}, (page[-1]["buildID"] if len(entries) > limit else None)


def _pending_entry(builds: Builds, pending: list[Job]) -> dict[str, Any]:
    """The ``Template`` entry of a template none of whose builds is stored yet: its newest."""
    j = max(pending, key=lambda j: j.created)
    made = _when(j.created)
    build = _job_build(builds, j)
    same = {k: build[k] for k in ("buildID", "cpuCount", "memoryMB", "diskSizeMB", "envdVersion")}
    return {
        **same,
        "templateID": j.template_id,
        "public": False,
        "aliases": [j.name],
        "names": [j.name],
        "createdAt": made,
        "updatedAt": made,
        "createdBy": None,
        "lastSpawnedAt": None,
        "spawnCount": 0,
        "buildCount": len(pending),
        "buildStatus": j.status,
    }


def _stored_build(builds: Builds, t: Template) -> dict[str, Any]:
    made = _when(t.created_at)
    return {
        "buildID": t.build_id or NO_BUILD_ID,
        "status": "ready",
        "createdAt": made,
        "updatedAt": made,
        "finishedAt": made,
        **_resources(builds, t),
        "envdVersion": ENVD_VERSION,
    }


def _job_build(builds: Builds, j: Job) -> dict[str, Any]:
    s = builds.settings
    out = {
        "buildID": j.build_id,
        "status": j.status,
        "createdAt": _when(j.created),
        "updatedAt": _when(j.finished or j.created),
        "cpuCount": int(j.cpu or s.default_cpu),
        "memoryMB": j.memory_mb or s.default_memory_mb,
        "diskSizeMB": s.default_disk_mb,
        "envdVersion": ENVD_VERSION,
    }
    if j.finished is not None:
        out["finishedAt"] = _when(j.finished)
    return out
