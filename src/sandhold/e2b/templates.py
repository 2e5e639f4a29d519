"""E2B's template-build endpoints over the service's builds (service/builds.py), in what the
pinned SDK's ``Template.build`` sends and parses:

- ``POST /v3/templates`` ``{name, tags?, cpuCount?, memoryMB?}`` → 202 ``{templateID, buildID,
  public, names, tags, aliases}``
- ``GET /templates/{id}/files/{hash}`` → 201 ``{present, url?}`` (404: no build of the team's
  waits for files there): the url is this server's
  ``PUT /templates/{id}/files/{hash}?build=&token=`` (the SDK uploads without its API key: the
  token, one per build, authorizes it)
- ``POST /v2/templates/{id}/builds/{buildID}`` ``{fromTemplate | fromImage, steps, startCmd?,
  readyCmd?, force}`` → 202; ``GET /templates/{id}/builds/{buildID}/status?logsOffset=`` → 200
- ``GET /templates/aliases/{name}`` → 200 ``{templateID, public}``, 403 (another team's), 404
- ``POST /templates/tags`` ``{target, tags}`` → 201; ``DELETE /templates/tags`` ``{name, tags}``
  → 204; ``GET /templates/{id}/tags`` → 200; ``DELETE /templates/{id}`` → 204 (or a snapshot's)
- ``GET /templates`` → 200: the built-in and operator templates and the team's own;
  ``GET /default-templates`` → 200: the built-in and operator ones;
  ``GET /templates/{id}?limit=&nextToken=`` → 200 the template and a page of its builds, newest
  first (``X-Next-Token``); 404 for another team's (service/template_listing.py)
- ``PATCH /templates/{id}`` and ``PATCH /v2/templates/{id}`` ``{public}`` → 200 (v2: ``{names}``):
  a team's template usable by every team (by its id), or again its own only; 404 for another's
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandhold import http_edge
from sandhold.e2b import models
from sandhold.errors import Forbidden, InvalidRequest, NotFound
from sandhold.service import template_listing
from sandhold.service.builds import Builds

Handler = Callable[[Request, str], Awaitable[Response]]


class BuildRequestBody(models.Body):
    name: str | None = None
    alias: str | None = None
    tags: list[str] | None = None
    cpuCount: int | None = None
    memoryMB: int | None = None
    minFreeDiskMb: int | None = None
    teamID: str | None = None


class UpdateBody(models.Body):
    public: bool | None = None


class TagsBody(models.Body):
    target: str | None = None
    name: str | None = None
    tags: list[str]


class TemplateRoutes:
    """E2B's template endpoints (builds, uploads, tags, listings) for a team, over the
    service's builds."""

    def __init__(self, builds: Builds, max_upload: int, max_body: int) -> None:
        self.builds = builds
        self.max_upload = max_upload
        self.max_body = max_body

    async def body_of(self, request: Request) -> bytes:
        return await http_edge.read_body(request, self.max_body)

    async def request_build(self, request: Request, team: str) -> Response:
        body = models.parse(BuildRequestBody, await self.body_of(request))
        ref = body.name or body.alias
        if not ref:
            raise InvalidRequest("name is required")
        job = self.builds.request(team, ref, body.tags or [], body.cpuCount, body.memoryMB)
        return JSONResponse(
            {
                "templateID": job.template_id,
                "buildID": job.build_id,
                "public": self.builds.is_public(team, job.template_id),
                "names": [job.name],
                "tags": job.tags,
                "aliases": [job.name],
            },
            status_code=202,
        )

    async def file_link(self, request: Request, team: str) -> Response:
        tid, files_hash = request.path_params["id"], request.path_params["hash"]
        jobs = [
            j
            for j in self.builds.jobs.values()
            if j.team == team and j.template_id == tid and not j.started
        ]
        if not jobs:  # another team's template: not found either
            raise NotFound(f"template {tid} has no build of this team waiting for its files")
        job = jobs[-1]
        if self.builds.uploads.path(team, files_hash).exists():
            return JSONResponse({"present": True}, status_code=201)
        url = (
            f"{str(request.base_url).rstrip('/')}/templates/{quote(tid)}/files/{files_hash}"
            f"?build={job.build_id}&token={job.upload_token}"
        )
        return JSONResponse({"present": False, "url": url}, status_code=201)

    async def upload(self, request: Request) -> Response:
        tid, files_hash = request.path_params["id"], request.path_params["hash"]
        job = self.builds.jobs.get(request.query_params.get("build", ""))
        token = request.query_params.get("token", "")
        if (
            job is None
            or job.template_id != tid
            or not hmac.compare_digest(job.upload_token.encode(), token.encode())
        ):
            raise Forbidden("invalid upload link")
        await self.builds.uploads.save(job.team, files_hash, request.stream(), self.max_upload)
        return Response(status_code=200)

    async def start_build(self, request: Request, team: str) -> Response:
        job = self.builds.job(team, request.path_params["id"], request.path_params["build"])
        try:
            body = json.loads(await self.body_of(request) or b"{}")
        except ValueError:
            raise InvalidRequest("the body must be JSON") from None
        if not isinstance(body, dict):
            raise InvalidRequest("the body must be a JSON object")
        await self.builds.start(job, body)
        return Response(status_code=202)

    async def build_status(self, request: Request, team: str) -> Response:
        job = self.builds.job(team, request.path_params["id"], request.path_params["build"])
        try:
            offset = int(request.query_params.get("logsOffset") or 0)
        except ValueError:
            raise InvalidRequest("logsOffset must be an integer") from None
        return JSONResponse(self.builds.status(job, max(offset, 0)))

    async def alias(self, request: Request, team: str) -> Response:
        return JSONResponse(self.builds.alias(team, request.path_params["alias"]))

    async def assign_tags(self, request: Request, team: str) -> Response:
        body = models.parse(TagsBody, await self.body_of(request))
        if not body.target:
            raise InvalidRequest("target is required")
        return JSONResponse(self.builds.assign(team, body.target, body.tags), status_code=201)

    async def remove_tags(self, request: Request, team: str) -> Response:
        body = models.parse(TagsBody, await self.body_of(request))
        if not body.name:
            raise InvalidRequest("name is required")
        self.builds.remove_tags(team, body.name, body.tags)
        return Response(status_code=204)

    async def list_tags(self, request: Request, team: str) -> Response:
        return JSONResponse(self.builds.tags(team, request.path_params["id"]))

    async def listed(self, request: Request, team: str) -> Response:
        return JSONResponse(template_listing.listed(self.builds, team))

    async def defaults(self, request: Request, team: str) -> Response:
        return JSONResponse(template_listing.listed(self.builds, team, defaults_only=True))

    async def with_builds(self, request: Request, team: str) -> Response:
        body, next_token = template_listing.with_builds(
            self.builds,
            team,
            request.path_params["id"],
            models.int_param(request, "limit"),
            request.query_params.get("nextToken") or None,
        )
        headers = {"X-Next-Token": next_token} if next_token else None
        return JSONResponse(body, headers=headers)

    async def update(self, request: Request, team: str) -> Response:
        body = models.parse(UpdateBody, await self.body_of(request))
        names = self.builds.set_public(team, request.path_params["id"], body.public)
        if request.url.path.startswith("/v2/"):
            return JSONResponse(names)
        return Response(status_code=200)  # v1 answers with no body

    def routes(self, authed: Callable[[Any], Any]) -> list[Route]:
        a = authed
        return [
            Route("/templates", a(self.listed), methods=["GET"]),
            Route("/default-templates", a(self.defaults), methods=["GET"]),
            Route("/v3/templates", a(self.request_build), methods=["POST"]),
            Route("/templates/aliases/{alias}", a(self.alias), methods=["GET"]),
            Route("/templates/tags", a(self.assign_tags), methods=["POST"]),
            Route("/templates/tags", a(self.remove_tags), methods=["DELETE"]),
            Route("/templates/{id}/files/{hash}", a(self.file_link), methods=["GET"]),
            Route("/templates/{id}/files/{hash}", self.upload, methods=["PUT"]),
            Route("/v2/templates/{id}/builds/{build}", a(self.start_build), methods=["POST"]),
            Route("/templates/{id}/builds/{build}/status", a(self.build_status), methods=["GET"]),
            Route("/templates/{id}/tags", a(self.list_tags), methods=["GET"]),
            Route("/templates/{id}", a(self.with_builds), methods=["GET"]),
            Route("/templates/{id}", a(self.update), methods=["PATCH"]),
            Route("/v2/templates/{id}", a(self.update), methods=["PATCH"]),
        ]


def routes(
    builds: Builds, authed: Callable[[Handler], Any], max_upload: int, max_body: int
) -> list[Route]:
    return TemplateRoutes(builds, max_upload, max_body).routes(authed)
