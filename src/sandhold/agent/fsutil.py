"""Filesystem helpers shared by the RPC service and ``/files``: EntryInfo, metadata xattrs,
creating parents as a user, recursive removal and errno → Connect code mapping.

Everything here is synchronous and meant to run inside ``users.fs_identity``.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
import time

from .rpc import Message, RpcError
from .users import group_name, user_name

FILE_TYPE_UNSPECIFIED = "FILE_TYPE_UNSPECIFIED"
FILE_TYPE_FILE = "FILE_TYPE_FILE"
FILE_TYPE_DIRECTORY = "FILE_TYPE_DIRECTORY"
FILE_TYPE_SYMLINK = "FILE_TYPE_SYMLINK"

METADATA_PREFIX = "user.e2b."  # envd's: set in the sandbox the E2B way, it shows too

_RWX = "rwxrwxrwx"


def go_mode_string(mode: int) -> str:
    """Go's ``os.FileMode.String()`` (what envd puts in ``permissions``), e.g. ``-rw-r--r--``,
    ``drwxr-xr-x``, ``Lrwxrwxrwx``, ``Dcrw-rw-rw-``."""
    kind = ""
    if stat.S_ISDIR(mode):
        kind += "d"
    if stat.S_ISLNK(mode):
        kind += "L"
    if stat.S_ISBLK(mode) or stat.S_ISCHR(mode):
        kind += "D"
    if stat.S_ISFIFO(mode):
        kind += "p"
    if stat.S_ISSOCK(mode):
        kind += "S"
    if mode & stat.S_ISUID:
        kind += "u"
    if mode & stat.S_ISGID:
        kind += "g"
    if stat.S_ISCHR(mode):
        kind += "c"
    if mode & stat.S_ISVTX:
        kind += "t"
    perms = "".join(c if mode & (1 << (8 - i)) else "-" for i, c in enumerate(_RWX))
    return (kind or "-") + perms


def rfc3339(ns: int) -> str:
    """A protobuf JSON Timestamp: UTC, 0/3/6/9 fractional digits like Go's protojson."""
    sec, frac = divmod(ns, 1_000_000_000)
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
    if frac == 0:
        return base + "Z"
    if frac % 1_000_000 == 0:
        return f"{base}.{frac // 1_000_000:03d}Z"
    if frac % 1000 == 0:
        return f"{base}.{frac // 1000:06d}Z"
    return f"{base}.{frac:09d}Z"


def _file_type(mode: int) -> str:
    if stat.S_ISREG(mode):
        return FILE_TYPE_FILE
    if stat.S_ISDIR(mode):
        return FILE_TYPE_DIRECTORY
    if stat.S_ISLNK(mode):
        return FILE_TYPE_SYMLINK
    return FILE_TYPE_UNSPECIFIED


def read_metadata(path: str, follow: bool = True) -> dict[str, str]:
    try:
        names = os.listxattr(path, follow_symlinks=follow)
    except OSError:
        return {}
    out: dict[str, str] = {}
    for name in names:
        if name.startswith(METADATA_PREFIX):
            try:
                value = os.getxattr(path, name, follow_symlinks=follow)
            except OSError:
                continue
            out[name[len(METADATA_PREFIX) :]] = value.decode("utf-8", "replace")
    return out


def write_metadata(target: str | int, metadata: dict[str, str]) -> bool:
    """Make ``metadata`` the file's whole set (an overwrite without any drops the old one), as
    envd does; False when the filesystem or file refuses xattrs."""
    try:
        for name in os.listxattr(target):
            if name.startswith(METADATA_PREFIX) and name[len(METADATA_PREFIX) :] not in metadata:
                os.removexattr(target, name)
        for key, value in metadata.items():
            os.setxattr(target, METADATA_PREFIX + key, value.encode())
    except OSError:
        return False
    return True


def entry_info(path: str, display: str | None = None, st: os.stat_result | None = None) -> Message:
    """EntryInfo for ``path`` (not following a final symlink), reported under ``display``.

    A symlink reports its target's type and permission bits and ``symlinkTarget`` (fully
    resolved), as E2B's envd does; a dangling one keeps type SYMLINK so listings still show it.
    Never ``isSymlink`` (field 12, which E2B's envd does not send): the Python SDK would call
    every link SYMLINK, where against E2B it reports the target's type.
    """
    if st is None:
        st = os.lstat(path)
    shown = display or path
    ftype = _file_type(st.st_mode)
    mode = stat.S_IMODE(st.st_mode) & 0o777
    entry: Message = {"name": posixpath.basename(shown) or shown}
    is_link = stat.S_ISLNK(st.st_mode)
    if is_link:
        try:
            target = os.path.realpath(path, strict=True)
            tst = os.stat(target)
        except OSError:
            target, mode = path, 0  # dangling or looping: Go's EvalSymlinks gives up too
        else:
            ftype = _file_type(tst.st_mode)
            mode = stat.S_IMODE(tst.st_mode) & 0o777
    entry.update(
        type=ftype,
        path=shown,
        size=str(st.st_size),
        mode=mode,
        permissions=go_mode_string(st.st_mode),
        owner=user_name(st.st_uid),
        group=group_name(st.st_gid),
        modifiedTime=rfc3339(st.st_mtime_ns),
    )
    if is_link:
        entry["symlinkTarget"] = target
    else:
        metadata = read_metadata(path)  # user xattrs cannot be set on symlinks
        if metadata:
            entry["metadata"] = metadata
    return entry


def ensure_dirs(path: str) -> None:
    """Create ``path`` and missing parents (0755, owned by the current fs identity)."""
    missing: list[str] = []
    cur = path
    while True:
        try:
            st = os.stat(cur)
        except FileNotFoundError:
            missing.append(cur)
            parent = posixpath.dirname(cur)
            if parent == cur:
                break
            cur = parent
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, f"path is a file: {cur}")
        break
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o755)
        except FileExistsError:
            if not os.path.isdir(d):
                raise


def make_parents(path: str, uid: int, gid: int) -> None:
    """``path``'s missing directories (itself included) as E2B's envd makes them: by the agent,
    owned by the user (``uid``, ``gid``) even where the user may not write (a new top-level
    directory: there, as in E2B, a user with sudo could anyway). Only below an existing
    directory reached without links that the user may search (not into /root, not through a
    link of the user's); anywhere else it leaves them to ``ensure_dirs`` as the user, which
    fails where the user may not write. Runs as the agent, outside ``fs_identity``."""
    missing: list[str] = []
    base = posixpath.normpath(path)
    while not os.path.lexists(base):
        missing.append(posixpath.basename(base))
        base = posixpath.dirname(base)
    if not missing or os.path.realpath(base) != base:
        return
    st = os.stat(base)
    search = 0o100 if st.st_uid == uid else 0o010 if st.st_gid == gid else 0o001
    if not stat.S_ISDIR(st.st_mode) or not st.st_mode & search:
        return
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fds = [os.open(base, flags)]
    made: list[tuple[int, str]] = []  # (the parent's fd, the name) of each directory made
    try:
        for name in reversed(missing):  # all made first: the agent writes only in its own
            try:
                os.mkdir(name, 0o755, dir_fd=fds[-1])
                made.append((fds[-1], name))
            except FileExistsError:  # (made meanwhile: taken as it is)
                pass
            fds.append(os.open(name, flags, dir_fd=fds[-1]))
        for parent, name in made:
            os.chown(name, uid, gid, dir_fd=parent, follow_symlinks=False)
    except PermissionError:  # an agent restored from before it had CAP_CHOWN: as the user
        for parent, name in reversed(made):
            os.rmdir(name, dir_fd=parent)
    finally:
        for fd in fds:
            os.close(fd)


def remove_all(path: str) -> None:
    """``os.RemoveAll``: recursive, without following symlinks, fine if already gone."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    # Iterative post-order so deep trees don't hit the recursion limit.
    stack: list[tuple[str, bool]] = [(path, False)]
    while stack:
        d, visited = stack.pop()
        if visited:
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            continue
        stack.append((d, True))
        try:
            with os.scandir(d) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        stack.append((e.path, False))
                    else:
                        try:
                            os.unlink(e.path)
                        except FileNotFoundError:
                            pass
        except FileNotFoundError:
            continue


def os_error(e: OSError, action: str) -> RpcError:
    """Map an errno to the Connect code a client can act on."""
    code = {
        errno.ENOENT: "not_found",
        errno.EACCES: "permission_denied",
        errno.EPERM: "permission_denied",
        errno.EROFS: "permission_denied",
        errno.EEXIST: "already_exists",
        errno.ENOTEMPTY: "already_exists",
        errno.ENOTDIR: "invalid_argument",
        errno.EISDIR: "invalid_argument",
        errno.EINVAL: "invalid_argument",
        errno.ENAMETOOLONG: "invalid_argument",
        errno.ELOOP: "failed_precondition",
        errno.EXDEV: "failed_precondition",
        errno.ENOSPC: "resource_exhausted",
        errno.EDQUOT: "resource_exhausted",
    }.get(e.errno or 0, "internal")
    detail = e.strerror or str(e)
    where = f" {e.filename}" if e.filename else ""
    return RpcError(code, f"{action}:{where}: {detail[:1].lower()}{detail[1:]}")
