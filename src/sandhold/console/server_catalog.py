"""What a team keeps on ``sandhold serve``, as its console shows it: its templates (those E2B's
``GET /templates`` lists for it: the built-in and operator ones, the images it pulled, its own)
with their tags, sizes and latest builds; one build's steps and log, a page at a time; its
snapshots (where each is kept: "local", this host's disk, and/or "store", the shared snapshot
store; never a host path); its volumes (never their token). Another team's template, build,
snapshot or volume is not there, and a build of it is "not found" as a missing one is.

Sizes are disk bytes, measured in the background (``Sizes``): a template's root may hold a
million files, so an answer carries what is known and never waits for a walk."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandhold.console.server_sandboxes import required, whole
from sandhold.console.web import Handler, Principal
from sandhold.e2b.volumes import VolumeStore
from sandhold.errors import NotFound
from sandhold.runtime import safefs
from sandhold.runtime.checkpoint.snapshots import META, Snapshot
from sandhold.runtime.templates.build import log_path
from sandhold.service import SandboxService, template_listing
from sandhold.service import snapshots as service_snapshots
from sandhold.service.builds import Builds, Job
from sandhold.service.offload import Offload

if TYPE_CHECKING:
    from sandhold.runtime.templates.store import Template

BUILDS_SHOWN = 5  # a template's latest builds in the listing
LOG_PAGE = 200  # a build's log entries per answer
MOST_STEPS = 500
MESSAGE_MOST = 4000
TEMPLATE_SIZE_AGE_S = 3600.0  # layers never change; a built-in's root is rebuilt rarely
VOLUME_SIZE_AGE_S = 60.0
STEP = re.compile(r"^(CACHED )?\[(\d+)/(\d+)\] (.*)$")  # the builder's step lines (build.py)


class Sizes:
    """Disk bytes of directories, measured one at a time off the event loop, in the background.
    ``get`` answers the last measure (None before the first) and asks for a new one when it is
    older than ``max_age_s``. At most ``most`` measures are kept."""

    def __init__(self, offload: Offload, most: int = 4096) -> None:
        self._offload = offload
        self._most = most
        self._known: dict[Path, tuple[int, float]] = {}
        self._wanted: dict[Path, None] = {}
        self._task: asyncio.Task[None] | None = None

    def get(self, path: Path, max_age_s: float) -> int | None:
        known = self._known.get(path)
        if known is None or time.time() - known[1] > max_age_s:
            self._wanted[path] = None
            if self._task is None or self._task.done():
                self._task = asyncio.get_running_loop().create_task(self._measure())
        return known[0] if known is not None else None

    async def _measure(self) -> None:
        while self._wanted:
            path = next(iter(self._wanted))
            try:
                size = await self._offload.run(safefs.tree_size, path)
            except RuntimeError:  # the pool is shut down: the server is stopping
                return
            finally:
                self._wanted.pop(path, None)
            self._known[path] = (size, time.time())
            if len(self._known) > self._most:  # the oldest measure goes
                self._known.pop(min(self._known, key=lambda k: self._known[k][1]))


def handlers(service: SandboxService, volumes: VolumeStore) -> dict[str, Handler]:
    builds, offload = service.builds, service.offload
    sizes = Sizes(offload)
    records = service.runtime.templates.get_record

    async def templates(p: Principal, body: dict[str, Any]) -> dict[str, Any]:
        team = p.tenant or ""
        listed, every = await offload.run(_read_templates, builds, team)
        jobs = [j for j in builds.jobs.values() if j.team == team]
        out = [_template(e, every, jobs, team, builds, sizes) for e in listed]
        shown = {t["template_id"] for t in out}
        pending: dict[str, list[Job]] = {}
        for j in jobs:  # templates none of whose builds is stored: building, or failed
            if j.template_id not in shown:
                pending.setdefault(j.template_id, []).append(j)
        out += [_pending(js) for js in pending.values()]
        return {"templates": sorted(out, key=lambda t: (t["kind"] != "own", t["aliases"]))}

    async def build(p: Principal, body: dict[str, Any]) -> dict[str, Any]:
        tid, bid = required(body, "template_id"), required(body, "build_id")
        offset = whole(body, "offset", 0, 1 << 40)
        team = p.tenant or ""
        job = builds.jobs.get(bid)
        if job is not None and job.team == team and job.template_id == tid:
            head = _job_build(job)
            entries: Iterable[dict[str, Any]] = list(job.logs)  # a copy: the build may run on
        else:
            stored = await offload.run(_stored_build, builds, team, tid, bid)
            if stored is None:
                raise NotFound(f"build {bid} of template {tid} not found")
            head = _record_build(stored, None)
            entries = _log_lines(log_path(builds.rt.host, stored.name))  # read in _page_of
        steps, page, more = await offload.run(_page_of, entries, offset)
        return {
            "template_id": tid,
            **head,
            "steps": steps,
            "logs": page,
            "offset": offset,
            "next": offset + len(page) if more else None,
        }

    async def snapshots(p: Principal, body: dict[str, Any]) -> dict[str, Any]:
        snaps = await service_snapshots.listed(service, p.tenant or "")
        rows = await offload.run(lambda: [_snapshot(s, records(s.template)) for s in snaps])
        return {"snapshots": sorted(rows, key=lambda r: -r["created_at"])}

    async def volume_list(p: Principal, body: dict[str, Any]) -> dict[str, Any]:
        mine = await offload.run(volumes.list, p.tenant or "")
        return {
            "volumes": [
                {
                    "volume_id": v.volumeID,
                    "name": v.name,
                    "created_at": v.createdAt,
                    "size_bytes": sizes.get(volumes.path(v), VOLUME_SIZE_AGE_S),
                }
                for v in mine
            ]
        }

    return {
        "templates": templates,
        "build": build,
        "snapshots": snapshots,
        "volumes": volume_list,
    }


def _read_templates(builds: Builds, team: str) -> tuple[list[dict[str, Any]], list[Template]]:
    return template_listing.listed(builds, team), builds.rt.templates.list()


def _key(t: Template) -> str:
    return t.template_id or t.name


def _template(
    entry: dict[str, Any],
    every: list[Template],
    jobs: list[Job],
    team: str,
    builds: Builds,
    sizes: Sizes,
) -> dict[str, Any]:
    """One entry of E2B's listing, with what the console adds: whose it is, its tags, size,
    times and latest builds (a team's own only: a built-in one has no builds to show)."""
    tid = entry["templateID"]
    recs = [
        t for t in every if _key(t) == tid and (t.owner is None or (t.owner == team and t.tags))
    ]
    own = any(t.owner == team for t in recs)
    current = next(
        (t for t in recs if (t.build_id or template_listing.NO_BUILD_ID) == entry["buildID"]),
        recs[-1] if recs else None,
    )
    size, counted = _size(builds, current, sizes)
    shown: list[tuple[float, dict[str, Any]]] = []
    if own:
        by_id = {j.build_id: j for j in jobs if j.template_id == tid}
        for t in recs:
            shown.append((t.created_at, _record_build(t, by_id.pop(t.build_id or "", None))))
        shown += [(j.created, _job_build(j)) for j in by_id.values() if j.status != "ready"]
    shown.sort(key=lambda b: b[0], reverse=True)
    kind = "own" if own else ("image" if current is not None and current.teams else "base")
    return {
        "template_id": tid,
        "aliases": entry["aliases"],
        "kind": kind,  # own; base: built in or the operator's; image: one this team pulled
        "public": entry["public"],
        "tags": sorted({tag for t in recs for tag in t.tags}),
        "status": "ready",
        "cpu": entry["cpuCount"],
        "memory_mib": entry["memoryMB"],
        "disk_mib": entry["diskSizeMB"],
        "size_bytes": size,
        "size_of": counted,
        "created_at": min((t.created_at for t in recs), default=None),
        "updated_at": max((t.updated_at or t.created_at for t in recs), default=None),
        "build_count": len(shown) if own else 0,
        "builds": [b for _, b in shown[:BUILDS_SHOWN]],
    }


def _pending(jobs: list[Job]) -> dict[str, Any]:
    """A template of the team's with no stored build yet: its builds waiting, running, failed."""
    jobs = sorted(jobs, key=lambda j: j.created, reverse=True)
    newest = jobs[0]
    return {
        "template_id": newest.template_id,
        "aliases": [newest.name],
        "kind": "own",
        "public": False,
        "tags": newest.tags,
        "status": newest.status,
        "cpu": newest.cpu,
        "memory_mib": newest.memory_mb,
        "disk_mib": None,
        "size_bytes": None,
        "size_of": [],
        "created_at": jobs[-1].created,
        "updated_at": newest.finished or newest.created,
        "build_count": len(jobs),
        "builds": [_job_build(j) for j in jobs[:BUILDS_SHOWN]],
    }


def _size(builds: Builds, t: Template | None, sizes: Sizes) -> tuple[int | None, list[str]]:
    """Disk bytes of a template's files here: its root when the root is its own (a built-in
    or image template; ``base``'s bind of the host's /usr is not counted) and every layer it
    stacks (a layer shared with other templates is counted in each); with what was counted.
    None while any part is not measured yet."""
    if t is None or t.stub:
        return None, []
    parts: list[tuple[str, Path]] = []
    if t.rootfs.is_relative_to(builds.rt.templates.root / t.name):
        parts.append(("root", t.rootfs))
    parts += [("layers", Path(layer)) for layer in t.layers]
    got = [sizes.get(path, TEMPLATE_SIZE_AGE_S) for _, path in parts]
    counted = sorted({what for what, _ in parts})
    if any(n is None for n in got):
        return None, counted
    return sum(n or 0 for n in got), counted


def _record_build(t: Template, job: Job | None) -> dict[str, Any]:
    """A stored build; its start is known while its job is (an hour after it ended)."""
    return {
        "build_id": t.build_id or template_listing.NO_BUILD_ID,
        "status": "ready",
        "tags": list(t.tags),
        "started_at": job.created if job is not None else None,
        "finished_at": job.finished if job is not None and job.finished else t.created_at,
    }


def _job_build(j: Job) -> dict[str, Any]:
    out: dict[str, Any] = {
        "build_id": j.build_id,
        "status": j.status,
        "tags": list(j.tags),
        "started_at": j.created,
        "finished_at": j.finished,
    }
    if j.reason is not None:
        out["reason"] = str(j.reason.get("message", ""))[:MESSAGE_MOST]
    return out


def _stored_build(builds: Builds, team: str, tid: str, bid: str) -> Template | None:
    """A build of the team's own template (never another team's, public or not: only a
    template's owner reads its builds' logs, as with E2B)."""
    return next(
        (
            t
            for t in builds.rt.templates.list()
            if t.owner == team and t.template_id == tid and t.build_id == bid
        ),
        None,
    )


def _log_lines(path: Path) -> Iterable[dict[str, Any]]:
    """A stored build's log file (build.py's BuildLog: JSON lines), read as it is walked."""
    try:
        f = path.open(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return
    with f:
        for line in f:
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict):
                    yield entry


def _page_of(
    entries: Iterable[dict[str, Any]], offset: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
    """The build's steps (from the builder's step lines, over the whole log), the page of
    entries from ``offset``, and whether more follow."""
    steps: list[dict[str, Any]] = []
    page: list[dict[str, Any]] = []
    more = False
    for i, e in enumerate(entries):
        message = str(e.get("message", ""))[:MESSAGE_MOST]
        at = _epoch(e.get("timestamp"))
        if (m := STEP.match(message)) is not None and len(steps) < MOST_STEPS:
            steps.append(
                {
                    "step": int(m[2]),
                    "of": int(m[3]),
                    "text": m[4],
                    "cached": bool(m[1]),
                    "at": at,
                }
            )
        if i >= offset + LOG_PAGE:
            more = True
        elif i >= offset:
            page.append({"at": at, "level": str(e.get("level", "info")), "message": message})
    return steps, page, more


def _epoch(stamp: object) -> float | None:
    try:
        return datetime.fromisoformat(str(stamp)).timestamp()
    except ValueError:
        return None


def _snapshot(s: Snapshot, template: Template | None) -> dict[str, Any]:
    kept = ["local"] if (s.dir / META).exists() else []  # a copy on this host's disk
    if s.remote is not None:
        kept.append("store")  # the shared snapshot store (its address is the operator's)
    return {
        "snapshot_id": s.id,
        "names": list(s.names),
        "source_sandbox": s.source,
        "template": {
            "name": s.template,
            "template_id": _key(template) if template else None,
            "alias": (template.alias or template.name) if template else None,
        },
        "mode": s.mode,
        "size_bytes": s.size_bytes,
        "created_at": s.created_at,
        "stored": kept,
    }
