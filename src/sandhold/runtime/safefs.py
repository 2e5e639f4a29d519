"""File operations in trees that came from a user (an image's root, a build step's layer, a
sandbox's root or upload), done as host root without ever following the tree's links out of it.

Two ways to name a path in such a tree:

* **in the root** (``Root``): what the sandbox itself would see. Every lookup is
  ``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`` from the tree's top, so an absolute or
  ``..``-laden symlink (an image's ``etc -> /etc``) resolves inside the tree, as in a chroot,
  never to the host's file of that name.
* **no links at all** (``make_dirs``): a mount point the runtime makes for bwrap. Each
  component is opened ``O_NOFOLLOW`` from the one before and a symlink anywhere is refused, so
  bwrap, which resolves its destinations itself, finds real directories all the way.

Walks and removals (``walk``, ``remove_tree``) go one directory at a time through descriptors
(``O_NOFOLLOW``, back up by ``..`` checked against the parent's identity): no recursion, so a
tree nested thousands deep costs a loop, not Python's stack, and one descriptor, not one per
level.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path

from sandhold.errors import InvalidRequest

SYS_OPENAT2 = 437  # the same number on every architecture (a syscall added after 5.1)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
IN_ROOT = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_READ = 1 << 20  # a file the runtime reads from a user's tree (an image's /etc/passwd)
CAPABILITY_XATTR = "security.capability"

log = logging.getLogger(__name__)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)


def openat2(dir_fd: int, path: str, flags: int, mode: int = 0, resolve: int = IN_ROOT) -> int:
    """The descriptor of ``path`` looked up from ``dir_fd`` under ``resolve``'s rules."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, resolve)
    while True:
        fd = _libc.syscall(
            SYS_OPENAT2, dir_fd, path.encode(), ctypes.byref(how), ctypes.sizeof(how)
        )
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err not in (errno.EAGAIN, errno.EINTR):  # EAGAIN: a rename raced the lookup
            raise OSError(err, os.strerror(err), path)


class Root:
    """A tree's top, open; paths given to its methods resolve inside it (``IN_ROOT``). What
    cannot be resolved there (a link loop, a name too long) is the tree's fault: InvalidRequest
    naming the path."""

    def __init__(self, top: Path) -> None:
        self.top = top
        self.fd = os.open(top, DIR_FLAGS)

    def __enter__(self) -> Root:
        return self

    def __exit__(self, *_: object) -> None:
        os.close(self.fd)

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        try:
            return openat2(self.fd, path, flags, mode)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENAMETOOLONG):
                raise InvalidRequest(f"/{path} in the template: {e.strerror}") from None
            raise

    def kind(self, path: str) -> int | None:
        """``path``'s file type (``stat.S_IFMT``) as the tree resolves it; None if missing."""
        try:
            fd = openat2(self.fd, path, os.O_PATH)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.ENAMETOOLONG):
                return None
            raise
        try:
            return stat.S_IFMT(os.fstat(fd).st_mode)
        finally:
            os.close(fd)

    def read_text(self, path: str) -> str:
        """A regular file's text ('' if there is none), at most MAX_READ bytes of it."""
        try:
            fd = self._regular(path, os.O_RDONLY)
        except FileNotFoundError:
            return ""
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_READ + 1)
        if len(data) > MAX_READ:
            raise InvalidRequest(f"/{path} in the template is larger than {MAX_READ >> 20} MiB")
        return data.decode(errors="replace")

    def append(self, path: str, text: str) -> None:
        flags = os.O_WRONLY | os.O_APPEND
        try:
            fd = self._regular(path, flags)
        except FileNotFoundError:  # O_EXCL: a dangling link there is refused, not followed
            try:
                fd = self.open(path, flags | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                raise InvalidRequest(f"/{path} in the template is a dangling symlink") from None
        with os.fdopen(fd, "w") as f:
            f.write(text)

    def make_dirs(self, path: str, mode: int = 0o755, owner: int | None = None) -> None:
        """Make ``path``'s missing directories (each ``owner``'s when given); the ones that
        exist, links resolved in the tree, are left as they are."""
        fd = os.dup(self.fd)
        parts = _parts(path)
        try:
            for i, part in enumerate(parts):
                try:  # looked up from the top each time: a link resolves as the sandbox sees it
                    nxt = self.open("/".join(parts[: i + 1]), os.O_RDONLY | os.O_DIRECTORY)
                except FileNotFoundError:
                    try:
                        os.mkdir(part, mode, dir_fd=fd)
                    except FileExistsError:  # a link to nothing
                        raise InvalidRequest(
                            f"/{path} in the template goes through a dangling symlink ({part})"
                        ) from None
                    nxt = os.open(part, DIR_FLAGS, dir_fd=fd)
                    os.close(fd)
                    fd = nxt
                    if owner is not None:
                        os.fchown(fd, owner, owner)
                    continue
                except NotADirectoryError:
                    raise InvalidRequest(f"/{path} in the template is not a directory") from None
                os.close(fd)
                fd = nxt
        finally:
            os.close(fd)

    def chown(self, path: str, uid: int, gid: int) -> None:
        fd = self.open(path, os.O_PATH)
        try:
            os.chown(f"/proc/self/fd/{fd}", uid, gid)  # the very file: its link is magic
        finally:
            os.close(fd)

    def _regular(self, path: str, flags: int) -> int:
        """``path`` opened with ``flags`` if it is a regular file (looked at before it is
        opened: a device node or a FIFO is never opened)."""
        where = self.open(path, os.O_PATH)
        try:
            if not stat.S_ISREG(os.fstat(where).st_mode):
                raise InvalidRequest(f"/{path} in the template is not a regular file")
            return os.open(f"/proc/self/fd/{where}", flags | os.O_CLOEXEC)
        finally:
            os.close(where)


def make_dirs(top: Path, path: str, mode: int, owner: int) -> None:
    """Make ``path`` under ``top`` a chain of real directories, the missing ones ``owner``'s;
    a symlink or anything but a directory on the way is refused (never followed)."""
    os.close(_dir_chain(top, _parts(path), path, mode, owner))


def make_file(top: Path, path: str, owner: int) -> None:
    """Make ``path`` under ``top`` a regular file (an empty one, ``owner``'s, if missing) at
    the end of a chain of real directories: a file a bind will cover. A link there is replaced
    (what is bound over it hides it anyway); a link on the way is refused."""
    *dirs, name = _parts(path)
    fd = _dir_chain(top, dirs, path, 0o755, owner)
    try:
        with suppress(FileNotFoundError):
            st = os.lstat(name, dir_fd=fd)
            if stat.S_ISREG(st.st_mode):
                return
            if not stat.S_ISLNK(st.st_mode):
                raise InvalidRequest(f"mount point {path} in the sandbox's root is not a file")
            os.unlink(name, dir_fd=fd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        new = os.open(name, flags, 0o644, dir_fd=fd)
        try:
            os.fchown(new, owner, owner)
        finally:
            os.close(new)
    finally:
        os.close(fd)


def _dir_chain(top: Path, parts: list[str], path: str, mode: int, owner: int) -> int:
    """The descriptor of ``top/parts...``, each a real directory (made if missing)."""
    fd = os.open(top, DIR_FLAGS)
    try:
        for part in parts:
            try:
                nxt = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                os.mkdir(part, mode, dir_fd=fd)
                nxt = os.open(part, DIR_FLAGS, dir_fd=fd)
                try:
                    os.fchown(nxt, owner, owner)
                except BaseException:
                    os.close(nxt)
                    raise
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                link = stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode)
                kind = "a symlink" if link else "not a directory"
                raise InvalidRequest(
                    f"mount point {path}: {part} in the sandbox's root is {kind}"
                ) from None
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _parts(path: str) -> list[str]:
    parts = [p for p in path.split("/") if p and p != "."]
    if ".." in parts:
        raise InvalidRequest(f"path {path!r} has a '..' component")
    return parts


# -- walking and removing, one directory open at a time -----------------------------------------
Visit = Callable[[int, str, os.stat_result], None]  # its directory's fd, name, lstat


def walk(top: Path, visit: Visit) -> None:
    """Call ``visit`` for every entry under ``top`` (not ``top`` itself), a directory before
    what it holds; symlinks are entries, never followed. ``visit`` may change an entry's owner
    or mode, or remove a non-directory; it must not rename anything."""
    for _ in _dirs(top, visit):
        pass


def tree_size(path: Path) -> int:
    """Bytes of disk that the files under ``path`` take (0 if it is gone)."""
    total = 0

    def add(_fd: int, _name: str, st: os.stat_result) -> None:
        nonlocal total
        if not stat.S_ISDIR(st.st_mode):
            total += st.st_blocks * 512

    try:
        walk(path, add)
    except OSError:  # gone, or changed while it was walked: what was counted
        pass
    return total


def remove_tree(path: str | Path) -> None:
    """Remove ``path`` and all it holds, however deep, whatever its owners and modes (as root);
    a symlink is removed, never followed, and a mount point below it is never entered (EXDEV:
    what is mounted there, a workspace say, is not this tree's). Missing: nothing to do."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return

    def unlink(dir_fd: int, name: str, st: os.stat_result) -> None:
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=dir_fd)

    for dir_fd, name in _dirs(path, unlink, post=True, one_fs=True):
        os.rmdir(name, dir_fd=dir_fd)
    os.rmdir(path)


def remove_quietly(path: str | Path) -> bool:
    """``remove_tree`` for cleanups that must go on: False (and the error logged) on failure."""
    try:
        remove_tree(path)
        return True
    except OSError as e:
        log.warning("could not remove %s: %s", path, e)
        return False


def _dirs(
    top: str | Path, visit: Visit, post: bool = False, one_fs: bool = False
) -> Iterator[tuple[int, str]]:
    """Depth first through ``top``'s directories: ``visit`` for each entry; with ``post``,
    yields (parent's fd, name) of each subdirectory once everything in it was visited; with
    ``one_fs``, a directory on another filesystem than ``top`` is an error."""
    fd = os.open(top, DIR_FLAGS)
    stack: list[tuple[tuple[int, int], list[str], str]] = []  # its id, subdirs left, name
    try:
        here, todo = _ident(fd), _scan(fd, visit)
        while True:
            if todo:
                name = todo.pop()
                try:
                    child = os.open(name, DIR_FLAGS, dir_fd=fd)
                except OSError as e:  # gone, or no longer a directory, since it was listed
                    if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                        continue
                    raise
                if one_fs and os.fstat(child).st_dev != here[0]:
                    os.close(child)
                    raise OSError(errno.EXDEV, "a mount point is in the way", name)
                stack.append((here, todo, name))
                os.close(fd)
                fd, here = child, _ident(child)
                todo = _scan(fd, visit)
                continue
            if not stack:
                return
            parent = os.open("..", DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            here, todo, name = stack.pop()
            if _ident(fd) != here:
                raise OSError(errno.ESTALE, "the tree changed while it was walked", str(top))
            if post:
                yield fd, name
    finally:
        os.close(fd)


def _ident(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _scan(fd: int, visit: Visit) -> list[str]:
    subdirs = []
    with os.scandir(fd) as entries:
        names = [e.name for e in entries]
    for name in names:
        try:
            st = os.lstat(name, dir_fd=fd)
        except FileNotFoundError:
            continue
        visit(fd, name, st)
        if stat.S_ISDIR(st.st_mode):
            subdirs.append(name)
    return subdirs


def has_capabilities(fd: int, name: str) -> bool:
    """Whether entry ``name`` of the directory open at ``fd`` has file capabilities."""
    try:
        os.getxattr(f"/proc/self/fd/{fd}/{name}", CAPABILITY_XATTR, follow_symlinks=False)
        return True
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP):
            return False
        raise


def drop_capabilities(fd: int, name: str) -> bool:
    """Remove the file capabilities (``security.capability``) of entry ``name`` of the
    directory open at ``fd``; whether it had any. (xattr calls take no ``dir_fd``: the
    descriptor's /proc link names that directory exactly, as a ``dir_fd`` would.)"""
    try:
        os.removexattr(f"/proc/self/fd/{fd}/{name}", CAPABILITY_XATTR, follow_symlinks=False)
        return True
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP):
            return False
        raise
