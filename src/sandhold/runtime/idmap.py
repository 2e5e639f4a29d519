"""Idmapped mounts (Linux >= 5.12; overlayfs layers >= 5.19): a view of a directory in which
host uid ``from_base + n`` appears as ``to_base + n``, both ways: a file created through the view
by ``to_base + n`` is stored as ``from_base + n``.

This is how every sandbox runs in its own host uid range (``runtime/uids.py``) while templates
and workspaces stay owned by the one canonical range on disk: a template is the lower layer of a
sandbox's overlay through such a view, and a workspace is bound through one. No file is chowned.

The view's mapping is a user namespace's: one with ``uid_map`` ``from_base to_base 65536``, made
by a short-lived process whose namespace outlives it through an open descriptor (cached per
range, since making one costs a fork and two execs, ~3 ms).
"""

from __future__ import annotations

import collections
import ctypes
import errno
import os
import subprocess
import threading

from sandhold.runtime.mounts import check

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

# x86_64 and aarch64 share these numbers (the syscalls are newer than the split tables).
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 1
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_IDMAP = 0x00100000
ID_RANGE = 65536
# What mount_setattr answers for a filesystem that cannot be idmapped (NFS, FUSE, ...).
UNSUPPORTED = (errno.EINVAL, errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _make_userns(from_base: int, to_base: int) -> int:
    # `unshare --user` execs the shell in a new, unmapped user namespace; its first line tells
    # us it is there. We, host root, write the maps; the namespace lives on in our descriptor.
    proc = subprocess.Popen(
        ["unshare", "--user", "--", "/bin/sh", "-c", "echo; read _"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        if proc.stdout.readline() != b"\n":
            raise OSError(errno.ECHILD, "unshare --user did not start")
        mapping = f"{from_base} {to_base} {ID_RANGE}\n"
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{proc.pid}/{name}", "w") as f:
                f.write(mapping)
        return os.open(f"/proc/{proc.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        proc.stdin.close()
        proc.stdout.close()
        proc.wait()


class UsernsCache:
    """User namespace descriptors by mapping, the least recently used closed beyond ``size``."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._fds: collections.OrderedDict[tuple[int, int], int] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, from_base: int, to_base: int) -> int:
        key = (from_base, to_base)
        with self._lock:
            fd = self._fds.get(key)
            if fd is not None:
                self._fds.move_to_end(key)
                return fd
        fd = _make_userns(from_base, to_base)
        with self._lock:
            if key in self._fds:  # another thread made it meanwhile
                os.close(fd)
                return self._fds[key]
            self._fds[key] = fd
            while len(self._fds) > self.size:
                os.close(self._fds.popitem(last=False)[1])
        return fd

    def close(self) -> None:
        with self._lock:
            while self._fds:
                os.close(self._fds.popitem()[1])


def clone(path: str | os.PathLike[str], userns_fd: int) -> int:
    """A detached, idmapped copy of the mount tree at ``path``; returns its descriptor (the
    caller closes it). An OSError whose errno is in UNSUPPORTED: its filesystem cannot be
    idmapped."""
    fd = _libc.syscall(SYS_OPEN_TREE, AT_FDCWD, os.fsencode(path), OPEN_TREE_CLONE | os.O_CLOEXEC)
    check(0 if fd >= 0 else -1, f"open_tree {path}")
    attr = _MountAttr(MOUNT_ATTR_IDMAP, 0, 0, userns_fd)
    rc = _libc.syscall(
        SYS_MOUNT_SETATTR, int(fd), b"", AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)
    )
    if rc != 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise OSError(err, f"idmapped mount of {path}: {os.strerror(err)}")
    return int(fd)


def attach(mount_fd: int, target: str | os.PathLike[str]) -> None:
    """Attach a detached mount at ``target`` (an existing directory)."""
    rc = _libc.syscall(
        SYS_MOVE_MOUNT, mount_fd, b"", AT_FDCWD, os.fsencode(target), MOVE_MOUNT_F_EMPTY_PATH
    )
    check(int(rc), f"move_mount {target}")
