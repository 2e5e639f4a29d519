"""The few libc calls the standard library lacks: fsuid switching, capabilities, inotify.

Loaded lazily (ctypes costs memory) the first time something needs it.
"""

from __future__ import annotations

import ctypes
import os

_libc = ctypes.CDLL(None, use_errno=True)

PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

_libc.prctl.argtypes = [
    ctypes.c_int,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
]
_libc.setfsuid.argtypes = [ctypes.c_uint]
_libc.setfsgid.argtypes = [ctypes.c_uint]
_libc.inotify_init1.argtypes = [ctypes.c_int]
_libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
_libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _check(ret: int) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def setfsuid(uid: int) -> int:
    """Sets the filesystem uid; returns the previous one (the call itself never fails)."""
    return int(_libc.setfsuid(uid))


def setfsgid(gid: int) -> int:
    return int(_libc.setfsgid(gid))


# Capabilities a build sandbox's root keeps (inside its user namespace): AgentConfig.root_caps.
CAPS = {
    "CAP_CHOWN": 0,
    "CAP_DAC_OVERRIDE": 1,
    "CAP_FOWNER": 3,
    "CAP_FSETID": 4,
    "CAP_KILL": 5,
    "CAP_SETGID": 6,
    "CAP_SETUID": 7,
    "CAP_SYS_CHROOT": 18,
    "CAP_SETFCAP": 31,
}


def drop_all_capabilities(keep: frozenset[int] = frozenset()) -> None:
    """In a child about to exec: nothing ambient, an empty bounding set (but ``keep``), no
    capabilities.

    Runs before the uid switch: dropping the bounding set needs CAP_SETPCAP, which setuid to a
    non-root uid takes away. The final capset also empties the inheritable set, without which
    a root child would get its capabilities back at exec (root's file capabilities are "all").
    """
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL on old kernels
    for cap in range(64):
        if cap in keep:
            continue
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 and ctypes.get_errno() == 22:
            break  # EINVAL: past the last capability this kernel knows


def clear_capability_sets(keep: frozenset[int] = frozenset()) -> None:
    """Permitted and effective = ``keep`` (root then execs with them: no_new_privs lets it
    keep what it has), nothing inheritable."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    for cap in keep:
        data[cap // 32].effective |= 1 << (cap % 32)
        data[cap // 32].permitted |= 1 << (cap % 32)
    _check(_libc.capset(ctypes.byref(header), data))


# -- inotify ----------------------------------------------------------------------------------


def inotify_init(flags: int) -> int:
    return _check(_libc.inotify_init1(flags))


def inotify_add_watch(fd: int, path: str, mask: int) -> int:
    return _check(_libc.inotify_add_watch(fd, os.fsencode(path), mask))


def inotify_rm_watch(fd: int, wd: int) -> None:
    _libc.inotify_rm_watch(fd, wd)
