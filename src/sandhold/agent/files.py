"""``GET /files`` (download) and ``POST /files`` (upload), envd style.

Uploads stream to disk as they arrive (multipart parts or a raw octet-stream body, optionally
gzip-encoded), files and missing parent directories are created with the user's filesystem
identity, and ``X-Metadata-<key>`` headers are stored as envd's ``user.e2b.<key>`` xattrs (keys
lowercased; an upload replaces the file's whole set).
Errors are JSON ``{"code": <status>, "message": ...}``.
"""

from __future__ import annotations

import os
import posixpath
import stat
from typing import Any

from .config import AgentConfig
from .files_headers import (
    content_disposition,
    content_type,
    http_date,
    parse_header_value,
    upload_metadata,
    wants_gzip,
)
from .files_upload import BodyDecoder, FileWriter, body_decoder, error_text
from .http import HttpError, Request, Response
from .multipart import MultipartParser
from .users import User, UserError, fs_identity, lookup_user, resolve_path
from .view import Access, ViewGuard

CHUNK = 256 << 10


class FilesHandler:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.view = ViewGuard.from_config(config.file_view)

    def _user(self, req: Request) -> User:
        name = req.query.get("username") or self.config.default_user
        user = lookup_user(name)
        if user is None:
            raise HttpError(401, f"error looking up user '{name}': user: unknown user {name}")
        return user

    def _resolve(self, raw: str, user: User, access: Access) -> str:
        try:
            path = resolve_path(raw, user, self.config.default_workdir)
        except ValueError as e:
            raise HttpError(400, f"error resolving path: {e}") from None
        denial = self.view.denial(path, access)
        if denial:
            raise HttpError(403, denial)
        return path

    # -- download -------------------------------------------------------------------------------
    async def download(self, req: Request, resp: Response) -> None:
        user = self._user(req)
        raw = req.query.get("path", "")
        path = self._resolve(raw, user, "read")
        try:
            with fs_identity(user):
                st = os.stat(path)
                if stat.S_ISDIR(st.st_mode):
                    raise HttpError(400, f"path '{path}' is a directory")
                if not stat.S_ISREG(st.st_mode):
                    # A FIFO or device could block the agent or never end.
                    raise HttpError(400, f"path '{path}' is not a regular file")
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
                st = os.fstat(fd)  # what was opened, not what the path showed a moment ago
            if stat.S_ISREG(st.st_mode):
                denial = self.view.opened_denial(fd, path, "read")
            else:  # swapped for something else since the stat above
                denial = f"path '{path}' is not a regular file"
            if denial:
                os.close(fd)
                raise HttpError(403, denial)
        except FileNotFoundError:
            raise HttpError(404, f"path '{path}' does not exist") from None
        except PermissionError as e:
            raise HttpError(403, f"error opening file '{path}': {error_text(e)}") from None
        except OSError as e:
            raise HttpError(500, f"error opening file '{path}': {error_text(e)}") from None
        except UserError as e:
            raise HttpError(403, str(e)) from None
        try:
            gzip = wants_gzip(req)
            headers = [
                ("Content-Type", content_type(path)),
                ("Content-Disposition", content_disposition(posixpath.basename(path))),
                ("Vary", "Accept-Encoding"),
                ("Last-Modified", http_date(st.st_mtime)),
            ]
            if gzip:
                import zlib

                comp = zlib.compressobj(6, zlib.DEFLATED, 31)
                await resp.start(200, [*headers, ("Content-Encoding", "gzip")])
                while data := os.read(fd, CHUNK):
                    await resp.write(comp.compress(data))
                await resp.write(comp.flush())
            elif st.st_size == 0:
                # Size 0 may not mean empty (/proc, /sys): read to EOF, chunked.
                await resp.start(200, headers)
                while data := os.read(fd, CHUNK):
                    await resp.write(data)
            else:
                await resp.start(200, [*headers, ("Content-Length", str(st.st_size))])
                left = st.st_size
                while left > 0 and (data := os.read(fd, min(CHUNK, left))):
                    await resp.write(data)
                    left -= len(data)
            await resp.end()
        finally:
            os.close(fd)

    # -- upload ---------------------------------------------------------------------------------
    async def upload(self, req: Request, resp: Response) -> None:
        user = self._user(req)
        metadata = upload_metadata(req)
        decoder = body_decoder(req)
        media, params = parse_header_value(req.header_utf8("content-type"))
        media = media.lower()
        results: list[dict[str, Any]] = []
        if media == "application/octet-stream":
            raw = req.query.get("path")
            if raw is None:
                raise HttpError(400, "path query parameter is required for raw body upload")
            path = self._resolve(raw, user, "write")
            writer = FileWriter.open(path, user, metadata, self.view)
            try:
                while chunk := await req.read_chunk():
                    writer.write(decoder.feed(chunk))
                writer.write(decoder.finish())
            finally:
                writer.close()
            results.append(writer.result())
        elif media.startswith("multipart/"):
            boundary = params.get("boundary")
            if not boundary:
                raise HttpError(400, "error parsing multipart form: no multipart boundary param")
            await self._multipart(req, user, metadata, decoder, boundary.encode(), results)
        else:
            raise HttpError(
                400,
                f"unsupported content type: {req.header('content-type')}, expected "
                "multipart/form-data or application/octet-stream",
            )
        await resp.send_json(200, results)

    async def _multipart(
        self,
        req: Request,
        user: User,
        metadata: dict[str, str],
        decoder: BodyDecoder,
        boundary: bytes,
        results: list[dict[str, Any]],
    ) -> None:
        parser = MultipartParser(boundary)
        writer: FileWriter | None = None
        seen: set[str] = set()
        query_path = req.query.get("path")
        try:
            while True:
                chunk = await req.read_chunk()
                data = decoder.feed(chunk) if chunk else decoder.finish()
                for kind, value in parser.feed(data, final=not chunk):
                    if kind == "part":
                        assert isinstance(value, dict)
                        writer = self._open_part(value, query_path, user, metadata, seen)
                    elif kind == "data" and writer is not None:
                        assert isinstance(value, bytes)
                        writer.write(value)
                    elif kind == "end" and writer is not None:
                        writer.close()
                        results.append(writer.result())
                        writer = None
                if not chunk:
                    break
        finally:
            if writer is not None:
                writer.close()

    def _open_part(
        self,
        headers: dict[str, str],
        query_path: str | None,
        user: User,
        metadata: dict[str, str],
        seen: set[str],
    ) -> FileWriter | None:
        _, disp = parse_header_value(headers.get("content-disposition", ""))
        if disp.get("name") != "file":
            return None  # envd ignores other form fields
        raw = query_path if query_path is not None else disp.get("filename")
        if raw is None:
            raise HttpError(400, "error getting multipart custom part file name: no filename")
        path = self._resolve(raw, user, "write")
        if path in seen:
            raise HttpError(
                400,
                f"you cannot upload multiple files to the same path '{path}' in one upload "
                "request, only the first specified file was uploaded",
            )
        seen.add(path)
        return FileWriter.open(path, user, metadata, self.view)
