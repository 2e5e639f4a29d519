"""Sandbox users: /etc/passwd and /etc/group lookups, path resolution and acting as a user.

The files are parsed directly (no NSS) and re-read when they change, so users added inside the
sandbox are seen at once.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

PASSWD = "/etc/passwd"
GROUP = "/etc/group"


class User(NamedTuple):
    name: str
    uid: int
    gid: int
    home: str
    shell: str


class UserError(Exception):
    """An unknown user, or one this agent cannot act as."""


class _Table:
    def __init__(self, path: str) -> None:
        self.path = path
        self._key: tuple[int, int, int] | None = None
        self.rows: list[list[str]] = []

    def load(self) -> list[list[str]]:
        try:
            st = os.stat(self.path)
        except OSError:
            self._key, self.rows = None, []
            return self.rows
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key != self._key:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                self.rows = [
                    line.rstrip("\n").split(":")
                    for line in f
                    if line.strip() and not line.startswith("#")
                ]
            self._key = key
        return self.rows


_passwd = _Table(PASSWD)
_group = _Table(GROUP)


def lookup_user(name: str) -> User | None:
    for row in _passwd.load():
        if len(row) >= 7 and row[0] == name:
            try:
                return User(row[0], int(row[2]), int(row[3]), row[5] or "/", row[6])
            except ValueError:
                return None
    return None


def user_name(uid: int) -> str:
    for row in _passwd.load():
        if len(row) >= 3 and row[2] == str(uid):
            return row[0]
    return str(uid)


def group_name(gid: int) -> str:
    for row in _group.load():
        if len(row) >= 3 and row[2] == str(gid):
            return row[0]
    return str(gid)


def group_ids(user: User) -> list[int]:
    """The primary group followed by every group listing the user as a member."""
    gids = [user.gid]
    for row in _group.load():
        if len(row) >= 4 and user.name in row[3].split(","):
            try:
                gid = int(row[2])
            except ValueError:
                continue
            if gid not in gids:
                gids.append(gid)
    return gids


# -- paths ------------------------------------------------------------------------------------


def resolve_path(path: str, user: User, default_workdir: str | None = None) -> str:
    """envd's path rules: empty → the default workdir (or home), ``~`` → home, relative →
    under home; the result is absolute and normalized (the sandbox's own filesystem)."""
    if not path:
        path = default_workdir or user.home
    if path == "~" or path.startswith("~/"):
        path = user.home + path[1:]
    elif path.startswith("~"):
        raise ValueError(f"cannot expand user-specific home dir in '{path}'")
    if not path.startswith("/"):
        path = posixpath.join(user.home, path)
    path = posixpath.normpath(path)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    return path


# -- acting as a user -------------------------------------------------------------------------

_IS_ROOT = os.geteuid() == 0


def can_switch() -> bool:
    return _IS_ROOT


def check_can_act_as(user: User) -> None:
    """A non-root agent (tests on a host) can only act as itself."""
    if not _IS_ROOT and user.uid != os.geteuid():
        raise UserError(f"the agent runs as uid {os.geteuid()} and cannot act as '{user.name}'")


@contextmanager
def effective_uid(uid: int) -> Iterator[None]:
    """Briefly take ``uid`` as effective uid, e.g. to signal that user's processes: the agent
    holds no CAP_KILL, and the kernel lets a sender signal processes whose real uid matches its
    effective one. The real uid stays 0, so switching back needs no capability."""
    if not _IS_ROOT or uid == 0:
        yield
        return
    os.setresuid(-1, uid, -1)
    try:
        yield
    finally:
        os.setresuid(-1, 0, -1)


@contextmanager
def fs_identity(user: User) -> Iterator[None]:
    """Make filesystem access checks and new files' ownership those of ``user``.

    setfsuid/setfsgid are per thread and the agent runs on one thread, so the code inside must
    not await. The agent holds no DAC-override capability, so this is what lets ``user`` reach
    its own 0700 home and keeps it out of /root.
    """
    check_can_act_as(user)
    if not _IS_ROOT or (user.uid == 0 and user.gid == 0):
        yield
        return
    setfsuid, setfsgid = _fsid_calls()
    prev_gid = setfsgid(user.gid)
    prev_uid = setfsuid(user.uid)
    try:  # an invalid id changes nothing and reports the current one
        if setfsuid(INVALID_ID) != user.uid or setfsgid(INVALID_ID) != user.gid:
            raise UserError(f"cannot switch the filesystem identity to '{user.name}'")
        yield
    finally:
        setfsuid(prev_uid)
        setfsgid(prev_gid)


INVALID_ID = 0xFFFFFFFF
FsidCalls = tuple[Callable[[int], int], Callable[[int], int]]
_fsid: FsidCalls | None = None


def _fsid_calls() -> FsidCalls:
    """setfsuid and setfsgid: the agent's extension's (native.c) where it was built, else
    through ctypes (``libc``, which costs its import and memory)."""
    global _fsid
    if _fsid is None:
        try:
            from ._native import setfsgid, setfsuid  # type: ignore[import-not-found]
        except ImportError:
            from .libc import setfsgid, setfsuid
        _fsid = (setfsuid, setfsgid)
    return _fsid
