"""Template builds for a team (what E2B's ``Template.build`` drives): a build is requested for a
name (``name`` or ``name:tag``), its files are uploaded by hash, it is started with its steps and
runs in the background (runtime/templates/build.py) while its status and log are polled.

Naming: a template (team, name) has a stable id; each build is a template of the store named
``<template id>.<build id>``, recorded with its owner, name and tags (``Template.owner`` ...).
A team sees and uses its own templates and public ones (the built-ins, and another team's that
it marked public: ``set_public``, by its template id); another team's private ones are "not
found", as E2B answers for what one does not own. Only the owner rebuilds, tags, untags,
deletes a template or reads its builds' status and logs, public or not. A build's COPY files are
uploaded per team (uploads.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import secrets
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sandhold.config import Settings
from sandhold.errors import (
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    SandholdError,
    TemplateNotFound,
)
from sandhold.runtime.runtime import Runtime
from sandhold.runtime.spec import NAME_RE
from sandhold.runtime.templates import oci, registry_access
from sandhold.runtime.templates.build import Builder, BuildLog, BuildRequest, Step
from sandhold.runtime.templates.from_image import from_image, may_use, qualified
from sandhold.runtime.templates.store import Template
from sandhold.service.offload import Offload
from sandhold.service.uploads import Uploads

log = logging.getLogger(__name__)

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,61}[a-z0-9]$|^[a-z0-9]$")
TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
TEMPLATE_ID = re.compile(r"^t[0-9a-f]{19}$")  # what template_id() makes: no name looks like one
DEFAULT_TAG = "default"
BASE_IMAGE = "e2bdev/base"  # what the SDK's from_base_image() names: our `base`
MAX_LOG_PAGE = 100  # entries per status answer, as E2B's


def split_name(ref: str) -> tuple[str, str | None]:
    """``name`` or ``name:tag`` → (name, tag or None); 400 naming what does not parse."""
    name, sep, tag = ref.partition(":")
    if not NAME.match(name):
        raise InvalidRequest(
            f"invalid template name {name!r}: lowercase letters, digits, '.', "
            "'_' and '-', at most 63"
        )
    if sep and not TAG.match(tag):
        raise InvalidRequest(f"invalid tag {tag!r} in {ref!r}")
    if TEMPLATE_ID.match(name):
        raise InvalidRequest(
            f"invalid template name {name!r}: it has the form of a template "
            "id (t and 19 hexadecimal digits)"
        )
    return name, (tag if sep else None)


def template_id(team: str, name: str) -> str:
    return "t" + hashlib.sha256(f"{team}\0{name}".encode()).hexdigest()[:19]


@dataclass(frozen=True)
class ImageBase:
    """A build's base that is an image: pulled (with these credentials) when the build runs."""

    ref: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    team: str | None = None  # whose build: the image is theirs only if their pull succeeds


@dataclass(frozen=True)
class Defaults:
    cpu: float | None = None
    memory_mb: int | None = None


@dataclass
class Job:
    team: str
    name: str
    template_id: str
    build_id: str
    tags: list[str]
    cpu: float | None
    memory_mb: int | None
    status: str = "waiting"  # building, ready, error
    logs: list[dict[str, Any]] = field(default_factory=list)
    reason: dict[str, Any] | None = None
    upload_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    started: bool = False
    finished: float | None = None  # when it ended, ready or not
    created: float = field(default_factory=time.time)

    def emit(self, level: str, message: str, step: str | None = None) -> None:
        entry = {"timestamp": datetime.now(UTC).isoformat(), "level": level, "message": message}
        if step is not None:
            entry["step"] = step
        self.logs.append(entry)


class Builds:
    def __init__(self, runtime: Runtime, settings: Settings, offload: Offload) -> None:
        self.rt = runtime
        self.settings = settings
        self.offload = offload
        self.uploads = Uploads(settings)
        self.jobs: dict[str, Job] = {}
        self._running = asyncio.Semaphore(settings.template_builds_at_once)
        self._tasks: set[asyncio.Task[None]] = set()

    # -- what the team may see --------------------------------------------------------------
    def find(self, team: str, ref: str) -> Template | None:
        """The build ``ref`` names for ``team`` (a name, ``name:tag``, a template id with or
        without a tag, a store name); None for anything else (a built-in, a snapshot, unknown).
        Another team's build is not found, whatever names it, unless its template is public:
        then its template id (with or without a tag) or store name finds it; its name is the
        team's own."""
        name, _, tag = ref.partition(":")
        tag = tag or DEFAULT_TAG
        public: Template | None = None
        for t in self.rt.templates.list():
            if t.owner is None:
                continue
            if t.owner != team:
                if not (t.public and t.tags):
                    if t.name == ref:
                        raise TemplateNotFound(f"template {ref!r} not found")
                elif t.name == ref or (name == t.template_id and tag in t.tags):
                    public = t
                continue
            if t.name == ref or (name in (t.alias, t.template_id) and tag in t.tags):
                return t
        return public

    def resolve(self, team: str, ref: str) -> tuple[str, Defaults]:
        """What a create names: the store name of a team's (or public) build, else ``ref``;
        with the defaults (cpu, memory) of the template it names."""
        found = self.find(team, ref)
        if found is not None:
            return found.name, Defaults(found.cpu, found.memory_mb)
        if NAME_RE.match(ref) and self.rt.templates.exists(ref):
            t = self.rt.templates.get(ref)
            if not may_use(t, team):  # an image another team pulled: as its private builds
                raise TemplateNotFound(f"template {ref!r} not found")
            return ref, Defaults(t.cpu, t.memory_mb)
        if ":" in ref:  # name:tag of no build of the team's
            raise TemplateNotFound(f"template {ref!r} not found")
        return ref, Defaults()

    def alias(self, team: str, name: str) -> dict[str, Any]:
        if (
            self.rt.templates.exists(name)
            and (t := self.rt.templates.get(name)).owner is None
            and may_use(t, team)
        ):
            return {"templateID": t.name, "public": True}
        tid = template_id(team, name)
        mine = [t for t in self._builds(team, tid) if t.tags]
        if mine:
            return {"templateID": tid, "public": any(t.public for t in mine)}
        listed = self.rt.templates.list()
        if any(t.template_id == name and t.public and t.tags for t in listed):
            return {"templateID": name, "public": True}  # another team's, public: its id
        if any(t.alias == name and t.owner != team and t.tags for t in listed):
            raise Forbidden(f"template {name!r} belongs to another team")
        raise NotFound(f"template {name!r} not found")

    # -- a build ----------------------------------------------------------------------------
    def request(
        self, team: str, ref: str, tags: list[str], cpu: float | None, memory_mb: int | None
    ) -> Job:
        name, tag = split_name(ref)
        for t in tags:
            if not TAG.match(t):
                raise InvalidRequest(f"invalid tag {t!r}")
        store = self.rt.templates  # another team's image: not even its name is told
        if store.exists(name) and store.get(name).owner is None and may_use(store.get(name), team):
            raise Conflict(f"template {name!r} is built in; choose another name")
        all_tags = sorted({tag or DEFAULT_TAG, *tags})
        job = Job(team, name, template_id(team, name), str(uuid.uuid4()), all_tags, cpu, memory_mb)
        now = time.time()  # a finished build's status is kept an hour: the SDK polls it
        for done in [j for j in self.jobs.values() if j.finished and now - j.finished > 3600]:
            del self.jobs[done.build_id]
        self.jobs[job.build_id] = job
        return job

    def job(self, team: str, tid: str, build_id: str) -> Job:
        job = self.jobs.get(build_id)
        if job is None or job.team != team or job.template_id != tid:
            raise NotFound(f"build {build_id} of template {tid} not found")
        return job

    async def start(self, job: Job, body: dict[str, Any]) -> None:
        if job.started:
            raise Conflict(f"build {job.build_id} was started already")
        raw = body.get("steps") or []
        if not isinstance(raw, list) or not all(isinstance(s, dict) for s in raw):
            raise InvalidRequest("steps must be a list of objects")
        steps = [
            Step(
                str(s.get("type")),
                [str(a) for a in s.get("args") or []],
                s.get("filesHash"),
                bool(s.get("force")),
            )
            for s in raw
        ]
        for i, step in enumerate(steps):
            step.check(i)
            hashed = step.files_hash
            if step.type == "COPY" and hashed and not self.uploads.path(job.team, hashed).exists():
                raise InvalidRequest(
                    f"step {i + 1} (COPY {step.args[0]}): its files ({hashed}) were not uploaded"
                )
        base = self._base(job.team, body)
        job.started = True  # a second start meanwhile is refused
        try:
            await self.offload.run(self.uploads.check, job.team, steps)
        except BaseException:
            job.started = False
            raise
        image = base if isinstance(base, ImageBase) else None
        req = BuildRequest(
            name=f"{job.template_id}.{job.build_id[:8]}",
            base="base" if image is not None else str(base),
            steps=steps,
            start_cmd=body.get("startCmd") or None,
            ready_cmd=body.get("readyCmd") or None,
            force=bool(body.get("force")),
            cpu=job.cpu,
            memory_mb=job.memory_mb,
            meta={
                "owner": job.team,
                "public": self.is_public(job.team, job.template_id),
                "template_id": job.template_id,
                "alias": job.name,
                "build_id": job.build_id,
                "tags": list(job.tags),
            },
        )
        task = asyncio.get_running_loop().create_task(self._run(job, req, image))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _base(self, team: str, body: dict[str, Any]) -> str | ImageBase:
        if tpl := body.get("fromTemplate"):
            found = self.find(team, str(tpl))
            if found is not None:
                return found.name
            store = self.rt.templates
            if store.exists(str(tpl)) and may_use(store.get(str(tpl)), team):
                return str(tpl)
            raise InvalidRequest(f"unknown base template {tpl!r}")
        image = body.get("fromImage")
        if image in (None, "", BASE_IMAGE) or str(image).startswith(BASE_IMAGE + ":"):
            return "base"
        if not isinstance(image, str):
            raise InvalidRequest("fromImage must be an image reference")
        ref = oci.parse_reference(qualified(self.rt.host, image))  # 400: one that does not parse
        registry_access.check_allowed(self.rt.settings, ref.domain)  # before any traffic
        registry = body.get("fromImageRegistry") or {}
        if not isinstance(registry, dict) or registry.get("type", "registry") != "registry":
            kind = registry.get("type") if isinstance(registry, dict) else registry
            raise InvalidRequest(
                f"fromImageRegistry {kind!r} is not supported: only a "
                "registry with a username and password"
            )
        return ImageBase(image, registry.get("username"), registry.get("password"), team)

    async def _run(self, job: Job, req: BuildRequest, image: ImageBase | None) -> None:
        async with self._running:
            job.status = "building"
            builder = Builder(self.rt, lambda h: self.uploads.path(job.team, h))
            t0 = time.monotonic()
            emit = BuildLog(self.rt.host, req.name, job.emit)
            try:
                if image is not None:
                    emit("info", f"FROM {image.ref}: pulling")
                    base = await self.offload.run(self._pull, image, req.force, emit)
                    req.base = base.name
                    emit("info", f"FROM {image.ref}: template {base.name}")
                await self._build(builder, req, emit)
            except SandholdError as e:
                emit("error", str(e))
                job.reason = {"message": str(e), "logEntries": job.logs[-20:]}
                job.status, job.finished = "error", time.time()
                return
            except Exception as e:  # a bug: said, never a build left "building"
                log.exception("template build %s failed", job.build_id)
                job.reason = {"message": f"internal error: {e}"}
                job.status, job.finished = "error", time.time()
                return
            finally:
                emit.close()
            self._tag(job.team, job.template_id, req.name, job.tags)
            await self.offload.run(self.prune)  # the build its tags moved off, if unused
            job.emit("info", f"Build finished in {time.monotonic() - t0:.1f} s")
            job.status, job.finished = "ready", time.time()

    async def _build(self, builder: Builder, req: BuildRequest, emit: BuildLog) -> None:
        """``builder.build`` on a worker thread; cancelled (the server stops), the build is
        cancelled too (its running step's sandbox killed) and awaited: nothing half-made."""
        running = asyncio.ensure_future(self.offload.run(builder.build, req, emit))
        try:
            await asyncio.shield(running)
        except asyncio.CancelledError:
            builder.cancel()
            with contextlib.suppress(Exception):
                await running
            raise

    def _pull(self, image: ImageBase, force: bool, emit: BuildLog) -> Template:
        return from_image(
            self.rt.host,
            image.ref,
            team=image.team,
            username=image.username,
            password=image.password,
            force=force,
            log_to=lambda line: emit("info", line),
        )

    def status(self, job: Job, offset: int) -> dict[str, Any]:
        entries = job.logs[offset : offset + MAX_LOG_PAGE]
        out: dict[str, Any] = {
            "templateID": job.template_id,
            "buildID": job.build_id,
            "status": job.status,
            "logs": [e["message"] for e in entries],
            "logEntries": entries,
        }
        if job.reason is not None:
            out["reason"] = job.reason
        return out

    # -- tags and deletion ------------------------------------------------------------------
    def _builds(self, team: str, tid: str) -> list[Template]:
        return [t for t in self.rt.templates.list() if t.template_id == tid and t.owner == team]

    def _tag(self, team: str, tid: str, store_name: str, tags: list[str]) -> None:
        """Point ``tags`` of template ``tid`` at build ``store_name`` (taken off others); a new
        build takes the template's public flag as it is now (it may have changed meanwhile)."""
        builds = self._builds(team, tid)
        others = [t for t in builds if t.name != store_name and t.tags]
        for t in builds:
            mine = set(tags) if t.name == store_name else set()
            want = sorted((set(t.tags) - set(tags)) | mine)
            public = any(o.public for o in others) if others and mine else t.public
            if want != t.tags or public != t.public:
                t.tags, t.public = want, public
                self.rt.templates.update(t)

    def is_public(self, team: str, tid: str) -> bool:
        return any(t.public for t in self._builds(team, tid) if t.tags)

    def set_public(self, team: str, ref: str, public: bool | None) -> dict[str, Any]:
        """E2B's ``PATCH /templates/{id}`` ``{public}``: a team's template (by id or name)
        usable by every team or its own only (None: as it is); its builds to come take the
        flag too. Another team's (or a built-in) is not found."""
        builds = [
            t
            for t in self._builds(team, ref) or self._builds(team, template_id(team, ref))
            if t.tags
        ]
        if not builds:
            raise NotFound(f"template {ref!r} not found")
        for t in self._builds(team, builds[0].template_id or ""):
            if public is not None and t.public != public:
                t.public = public
                self.rt.templates.update(t)
        return {"names": sorted({t.alias or t.name for t in builds})}

    def assign(self, team: str, target: str, tags: list[str]) -> dict[str, Any]:
        found = self.find(team, target)
        if found is None or found.owner != team:
            raise NotFound(f"template {target!r} not found")
        for t in tags:
            if not TAG.match(t):
                raise InvalidRequest(f"invalid tag {t!r}")
        assert found.template_id is not None
        self._tag(team, found.template_id, found.name, tags)
        return {"tags": tags, "buildID": found.build_id}

    def remove_tags(self, team: str, name: str, tags: list[str]) -> None:
        builds = self._builds(team, template_id(team, name))
        if not builds:
            raise NotFound(f"template {name!r} not found")
        for t in builds:
            if set(t.tags) & set(tags):
                t.tags = sorted(set(t.tags) - set(tags))
                self.rt.templates.update(t)

    def tags(self, team: str, ref: str) -> list[dict[str, Any]]:
        tid = ref if ref.startswith("t") and not NAME.match(ref) else template_id(team, ref)
        builds = self._builds(team, tid) or self._builds(team, ref)
        if not builds:
            raise NotFound(f"template {ref!r} not found")
        return [
            {
                "tag": tag,
                "buildID": t.build_id,
                "createdAt": datetime.fromtimestamp(t.created_at, UTC).isoformat(),
            }
            for t in builds
            for tag in t.tags
        ]

    def delete(self, team: str, ref: str) -> bool:
        """Delete a team's template (by id or name): its names go at once, its builds as soon
        as no sandbox runs on them (``prune``); False if it has none."""
        builds = [
            t
            for t in self._builds(team, ref) or self._builds(team, template_id(team, ref))
            if t.tags
        ]
        for t in builds:
            t.tags = []
            self.rt.templates.update(t)
        gone = {t.template_id for t in builds}  # and its failed builds' statuses with it
        for job in [j for j in self.jobs.values() if j.template_id in gone and j.finished]:
            del self.jobs[job.build_id]
        self.prune()
        return bool(builds)

    def prune(self) -> int:
        """Remove the builds no tag names (replaced or deleted) that no sandbox runs on, and
        the layers only they used; returns how many."""
        self.uploads.prune()
        in_use = {info.template for info in self.rt.list()}
        removed = 0
        for t in self.rt.templates.list():
            if t.owner is not None and not t.tags and t.name not in in_use:
                self.rt.warm.remove(t.name)
                self.rt.templates.remove(t.name)
                removed += 1
        if removed:
            self.rt.layers.collect(self.rt.templates)
        return removed

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
