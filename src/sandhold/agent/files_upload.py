"""The pieces of an upload: undoing the body's ``Content-Encoding: gzip`` as it streams, and
writing each file (created as the user, parents too, checked against the file view on the file
actually opened) with the error status envd gives each failure.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
from typing import Any

from .fsutil import ensure_dirs, make_parents, write_metadata
from .http import HttpError, Request
from .users import User, UserError, fs_identity
from .view import ViewGuard


class BodyDecoder:
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


def body_decoder(req: Request) -> BodyDecoder:
    enc = req.header("content-encoding").split(";")[0].strip().lower()
    if enc in ("", "identity"):
        return BodyDecoder(False)
    if enc == "gzip":
        return BodyDecoder(True)
    raise HttpError(
        400,
        f"error decompressing request body: unsupported Content-Encoding: {enc}, supported: [gzip]",
    )


class FileWriter:
    def __init__(self, path: str, fd: int, metadata: dict[str, str]) -> None:
        self.path = path
        self.fd = fd
        self.metadata = metadata

    @classmethod
    def open(cls, path: str, user: User, metadata: dict[str, str], view: ViewGuard) -> FileWriter:
        try:
            make_parents(posixpath.dirname(path), user.uid, user.gid)
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
                if created:  # as envd, which gives a new file to its user: watchers see
                    st = os.fstat(fd)  # CREATE, CHMOD, WRITE
                    os.fchown(fd, st.st_uid, st.st_gid)
                else:
                    os.ftruncate(fd, 0)
                if metadata or not created:  # best effort: also returned in the response
                    write_metadata(fd, metadata)
        except UserError as e:
            raise HttpError(403, str(e)) from None
        except OSError as e:
            raise write_error(e, f"error opening file '{path}'") from None
        return cls(path, fd, metadata)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.fd, view)
            except OSError as e:
                raise write_error(e, f"error writing file '{self.path}'") from None
            view = view[n:]

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            try:
                os.close(fd)
            except OSError as e:
                raise write_error(e, f"error writing file '{self.path}'") from None

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.path,
            "name": posixpath.basename(self.path),
            "type": "file",
        }
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        return out


def write_error(e: OSError, action: str) -> HttpError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return HttpError(507, f"{action}: not enough disk space available: {error_text(e)}")
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return HttpError(403, f"{action}: {error_text(e)}")
    if e.errno in (errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG, errno.EINVAL):
        return HttpError(400, f"{action}: {error_text(e)}")
    return HttpError(500, f"{action}: {error_text(e)}")


def error_text(e: OSError) -> str:
    t = e.strerror or str(e)
    return t[:1].lower() + t[1:]
