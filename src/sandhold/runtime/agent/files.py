"""``GET /files`` (download) and ``POST /files`` (upload), envd style.

Uploads stream to disk as they arrive (multipart parts or a raw octet-stream body, optionally
gzip-encoded), files and missing parent directories are created with the user's filesystem
identity, and ``X-Metadata-<key>`` headers are stored as ``user.sandhold.<key>`` xattrs.
Errors are JSON ``{"code": <status>, "message": ...}``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import re
import stat
import time
from typing import Any

from .config import AgentConfig
from .fsutil import ensure_dirs, write_metadata
from .http import HttpError, Request, Response, percent_decode, percent_encode
from .users import User, UserError, fs_identity, lookup_user, resolve_path
from .view import Access, ViewGuard

CHUNK = 256 << 10
MAX_PART_HEADERS = 16 << 10
METADATA_HEADER = "x-metadata-"
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_PRINTABLE = re.compile(r"^[\x20-\x7e]*$")

_CONTENT_TYPES = {
    ".txt": "text/plain; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".htm": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".csv": "text/csv; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".json": "application/json",
    ".xml": "text/xml; charset=utf-8",
    ".md": "text/markdown; charset=utf-8",
    ".py": "text/x-python; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".pdf": "application/pdf",
    ".zip": "application/zip",
    ".gz": "application/gzip",
    ".tar": "application/x-tar",
    ".wasm": "application/wasm",
}


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
            raise HttpError(403, f"error opening file '{path}': {_text(e)}") from None
        except OSError as e:
            raise HttpError(500, f"error opening file '{path}': {_text(e)}") from None
        except UserError as e:
            raise HttpError(403, str(e)) from None
        try:
            gzip = _wants_gzip(req)
            headers = [
                ("Content-Type", _content_type(path)),
                ("Content-Disposition", _disposition(posixpath.basename(path))),
                ("Vary", "Accept-Encoding"),
                ("Last-Modified", _http_date(st.st_mtime)),
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
        metadata = _metadata(req)
        decoder = _body_decoder(req)
        media, params = _parse_header_value(req.header_utf8("content-type"))
        media = media.lower()
        results: list[dict[str, Any]] = []
        if media == "application/octet-stream":
            raw = req.query.get("path")
            if raw is None:
                raise HttpError(400, "path query parameter is required for raw body upload")
            path = self._resolve(raw, user, "write")
            writer = _FileWriter.open(path, user, metadata, self.view)
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
        decoder: _Decoder,
        boundary: bytes,
        results: list[dict[str, Any]],
    ) -> None:
        parser = MultipartParser(boundary)
        writer: _FileWriter | None = None
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
    ) -> _FileWriter | None:
        _, disp = _parse_header_value(headers.get("content-disposition", ""))
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
        return _FileWriter.open(path, user, metadata, self.view)


class _FileWriter:
    def __init__(self, path: str, fd: int, metadata: dict[str, str]) -> None:
        self.path = path
        self.fd = fd
        self.metadata = metadata

    @classmethod
    def open(cls, path: str, user: User, metadata: dict[str, str], view: ViewGuard) -> _FileWriter:
        try:
            with fs_identity(user):
                ensure_dirs(posixpath.dirname(path))
                try:
                    if stat.S_ISDIR(os.stat(path).st_mode):
                        raise HttpError(400, f"path is a directory: {path}")
                except FileNotFoundError:
                    pass
                # O_NONBLOCK: a FIFO without a reader fails instead of stalling the agent.
                # Truncated only once the open file is known to be inside the view.
                flags = os.O_WRONLY | os.O_CLOEXEC | os.O_NONBLOCK
                try:
                    fd, created = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666), True
                except FileExistsError:  # a file, or a symlink (maybe dangling) to follow
                    fd, created = os.open(path, flags | os.O_CREAT, 0o666), False
                denial = view.opened_denial(fd, path, "write")
                if denial:
                    if created:  # an empty file the race made outside: take it back
                        with contextlib.suppress(OSError):
                            os.unlink(os.readlink(f"/proc/self/fd/{fd}"))
                    os.close(fd)
                    raise HttpError(403, denial)
                os.ftruncate(fd, 0)
                if metadata:
                    write_metadata(fd, metadata)  # best effort: also returned in the response
        except UserError as e:
            raise HttpError(403, str(e)) from None
        except OSError as e:
            raise _write_error(e, f"error opening file '{path}'") from None
        return cls(path, fd, metadata)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.fd, view)
            except OSError as e:
                raise _write_error(e, f"error writing file '{self.path}'") from None
            view = view[n:]

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            try:
                os.close(fd)
            except OSError as e:
                raise _write_error(e, f"error writing file '{self.path}'") from None

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.path,
            "name": posixpath.basename(self.path),
            "type": "file",
        }
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        return out


def _write_error(e: OSError, action: str) -> HttpError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return HttpError(507, f"{action}: not enough disk space available: {_text(e)}")
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return HttpError(403, f"{action}: {_text(e)}")
    if e.errno in (errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG, errno.EINVAL):
        return HttpError(400, f"{action}: {_text(e)}")
    return HttpError(500, f"{action}: {_text(e)}")


def _text(e: OSError) -> str:
    t = e.strerror or str(e)
    return t[:1].lower() + t[1:]


# -- request details --------------------------------------------------------------------------


def _metadata(req: Request) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in req.headers:
        if name.startswith(METADATA_HEADER):
            key = name[len(METADATA_HEADER) :]
            value = req.header(name)
            if not key or not _TOKEN.match(key):
                raise HttpError(400, f"invalid metadata key {key!r}")
            if not _PRINTABLE.match(value):
                raise HttpError(400, f"invalid metadata value for key {key!r}")
            out[key] = value
    return out


class _Decoder:
    """Undoes ``Content-Encoding: gzip`` incrementally (or passes bytes through)."""

    def __init__(self, gzip: bool) -> None:
        self._z: Any = None
        self._mid_member = False
        if gzip:
            import zlib

            self._zlib = zlib
            self._z = zlib.decompressobj(31)

    def feed(self, data: bytes) -> bytes:
        if self._z is None:
            return data
        out = bytearray()
        try:
            while data:
                self._mid_member = True
                out += self._z.decompress(data)
                if not self._z.eof:
                    break
                self._mid_member = False
                data = self._z.unused_data  # concatenated gzip members
                self._z = self._zlib.decompressobj(31)
        except self._zlib.error as e:
            raise HttpError(400, f"error decompressing request body: {e}") from None
        return bytes(out)

    def finish(self) -> bytes:
        if self._z is None:
            return b""
        if self._mid_member:
            raise HttpError(400, "error decompressing request body: unexpected EOF")
        return b""


def _body_decoder(req: Request) -> _Decoder:
    enc = req.header("content-encoding").split(";")[0].strip().lower()
    if enc in ("", "identity"):
        return _Decoder(False)
    if enc == "gzip":
        return _Decoder(True)
    raise HttpError(
        400,
        f"error decompressing request body: unsupported Content-Encoding: {enc}, supported: [gzip]",
    )


def _wants_gzip(req: Request) -> bool:
    """envd's Accept-Encoding negotiation: gzip if acceptable and preferred over identity;
    Range and conditional requests always get identity."""
    header = req.header("accept-encoding")
    if not header or any(
        req.header(h) for h in ("range", "if-modified-since", "if-none-match", "if-range")
    ):
        return False
    prefs: list[tuple[float, str]] = []
    for item in header.split(","):
        name, params = _parse_header_value(item)
        try:
            q = float(params.get("q", "1"))
        except ValueError:
            q = 1.0
        prefs.append((q, name.lower()))
    prefs.sort(key=lambda p: -p[0])
    identity_rejected = any(n == "identity" and q == 0 for q, n in prefs)
    for q, name in prefs:
        if q == 0:
            continue
        if name == "identity":
            return False
        if name == "*":
            return identity_rejected
        if name == "gzip":
            return True
    if identity_rejected:
        raise HttpError(406, "no acceptable encoding found, supported: [gzip]")
    return False


def _content_type(path: str) -> str:
    return _CONTENT_TYPES.get(posixpath.splitext(path)[1].lower(), "application/octet-stream")


def _disposition(name: str) -> str:
    ascii_name = name.encode("ascii", "replace").decode().replace("\\", "\\\\").replace('"', '\\"')
    value = f'inline; filename="{ascii_name}"'
    if not name.isascii():
        value += f"; filename*=UTF-8''{percent_encode(name)}"
    return value


def _http_date(ts: float) -> str:
    return time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(ts))


def _parse_header_value(value: str) -> tuple[str, dict[str, str]]:
    """``type/sub; a=b; c="d \\"e\\""`` → ("type/sub", {"a": "b", "c": 'd "e"'}).

    Quoted strings keep backslash escapes like Go's mime package; ``name*=UTF-8''…`` values
    (RFC 5987) are percent-decoded into ``name``."""
    main, _, rest = value.partition(";")
    params: dict[str, str] = {}
    i, n = 0, len(rest)
    while i < n:
        while i < n and rest[i] in " \t;":
            i += 1
        start = i
        while i < n and rest[i] not in "=;":
            i += 1
        key = rest[start:i].strip().lower()
        if i >= n or rest[i] == ";":
            continue
        i += 1  # '='
        while i < n and rest[i] in " \t":
            i += 1
        if i < n and rest[i] == '"':
            i += 1
            buf = []
            while i < n and rest[i] != '"':
                if rest[i] == "\\" and i + 1 < n:
                    i += 1
                buf.append(rest[i])
                i += 1
            i += 1
            val = "".join(buf)
        else:
            start = i
            while i < n and rest[i] != ";":
                i += 1
            val = rest[start:i].strip()
        if key.endswith("*"):
            charset, _, encoded = val.partition("'")
            _, _, encoded = encoded.partition("'")
            try:
                params[key[:-1]] = percent_decode(encoded, encoding=charset or "utf-8")
            except LookupError:
                pass
        elif key and key not in params:
            params[key] = val
    return main.strip(), params


class MultipartParser:
    """Incremental multipart/form-data parser.

    ``feed`` returns events: ``("part", headers)`` when a part starts, ``("data", bytes)`` for
    its content, ``("end", None)`` when it ends. Memory stays bounded by the chunk size.
    """

    def __init__(self, boundary: bytes) -> None:
        self._dash = b"--" + boundary
        self._delim = b"\r\n--" + boundary
        self._buf = bytearray()
        self._state = "preamble"

    def feed(self, data: bytes, final: bool = False) -> list[tuple[str, Any]]:
        self._buf += data
        events: list[tuple[str, Any]] = []
        while True:
            if self._state == "preamble":
                idx = self._buf.find(self._dash)
                if idx < 0:
                    keep = len(self._dash) - 1
                    if len(self._buf) > keep:
                        del self._buf[: len(self._buf) - keep]
                    break
                del self._buf[: idx + len(self._dash)]
                self._state = "delimiter"
            elif self._state == "delimiter":
                stripped = self._buf.lstrip(b" \t")
                if len(stripped) < 2:
                    break
                if stripped[:2] == b"--":
                    self._state = "done"
                    self._buf.clear()
                    break
                if stripped[:2] != b"\r\n":
                    raise HttpError(400, "error reading form: malformed multipart boundary")
                del self._buf[: len(self._buf) - len(stripped) + 2]
                self._state = "headers"
            elif self._state == "headers":
                if self._buf.startswith(b"\r\n"):
                    head, end = b"", 2
                else:
                    idx = self._buf.find(b"\r\n\r\n")
                    if idx < 0:
                        if len(self._buf) > MAX_PART_HEADERS:
                            raise HttpError(400, "error reading form: part headers too large")
                        break
                    head, end = bytes(self._buf[:idx]), idx + 4
                del self._buf[:end]
                headers: dict[str, str] = {}
                for line in head.split(b"\r\n"):
                    name, sep, value = line.partition(b":")
                    if sep:
                        headers[name.strip().decode("latin-1").lower()] = value.strip().decode(
                            "utf-8", "surrogateescape"
                        )
                events.append(("part", headers))
                self._state = "body"
            elif self._state == "body":
                idx = self._buf.find(self._delim)
                if idx < 0:
                    keep = len(self._delim) - 1
                    if len(self._buf) > keep:
                        events.append(("data", bytes(self._buf[: len(self._buf) - keep])))
                        del self._buf[: len(self._buf) - keep]
                    break
                if idx:
                    events.append(("data", bytes(self._buf[:idx])))
                events.append(("end", None))
                del self._buf[: idx + len(self._delim)]
                self._state = "delimiter"
            else:  # done: ignore the epilogue
                self._buf.clear()
                break
        if final and self._state != "done":
            raise HttpError(400, "error reading form: unexpected EOF")
        return events
