"""Host-side mounts of a sandbox (its copy-on-write root), made with mount(2) directly: exec'ing
mount(8) costs ~6 ms, the syscall ~2 ms."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Sequence
from pathlib import Path

from sandhold.errors import InvalidRequest

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]

MNT_DETACH = 2


def check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount_overlay(lowers: Sequence[Path | int], upper: Path, work: Path, target: Path) -> None:
    """Mount the copy-on-write root at ``target``. ``lowers`` are the template's directories,
    the topmost first (its layers, then its root), or descriptors of (idmapped) mounts of them."""
    for d in (upper, work, target):
        d.mkdir(parents=True, exist_ok=True)
    # overlayfs shows its layers in mountinfo as the strings it was given, inside the sandbox
    # too: naming them by descriptor keeps the host's paths out of it.
    fds = [os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for d in (upper, work)]
    lower_fds = []
    for lower in lowers:
        if not isinstance(lower, int):
            lower = os.open(lower, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            fds.append(lower)
        lower_fds.append(lower)
    try:
        # The merged root takes its owner from the upper dir: make it the template root's owner
        # as the sandbox sees it (its root), so that bwrap, running as that user, can create
        # mount points in it.
        st = os.fstat(lower_fds[-1])
        os.chown(upper, st.st_uid, st.st_gid)
        lo = ":".join(f"/proc/self/fd/{fd}" for fd in lower_fds)
        up, wo = (f"/proc/self/fd/{fd}" for fd in (fds[0], fds[1]))
        opts = f"lowerdir={lo},upperdir={up},workdir={wo}".encode()
        rc = _libc.mount(b"overlay", str(target).encode(), b"overlay", 0, opts)
    finally:
        for fd in fds:
            os.close(fd)
    check(rc, f"overlay {target}")


def mount_tmpfs(target: Path, size: int, mode: int) -> None:
    """A small tmpfs of ``size`` bytes at ``target`` (made if missing), nosuid, nodev, noexec."""
    target.mkdir(mode=0o755, exist_ok=True)
    opts = f"size={size},mode={mode:o}".encode()
    flags = 0x2 | 0x4 | 0x8  # MS_NOSUID | MS_NODEV | MS_NOEXEC
    check(_libc.mount(b"tmpfs", str(target).encode(), b"tmpfs", flags, opts), f"tmpfs {target}")


def umount(target: Path) -> None:
    """Lazily unmount ``target`` if something is mounted there."""
    if is_mountpoint(target):
        detach(target)


def detach(target: Path) -> None:
    """Lazily unmount what is mounted at ``target`` (known to be a mount point)."""
    check(_libc.umount2(str(target).encode(), MNT_DETACH), f"umount {target}")


def is_mountpoint(path: Path) -> bool:
    needle = str(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == needle for line in f)


def mounts_under(prefix: Path) -> list[str]:
    p = str(prefix).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(p)]


def check_traversable(path: Path) -> None:
    """bwrap runs as the unprivileged uid_base: every parent of a bound directory must let
    others through, or the sandbox would fail to start with a less helpful message."""
    for parent in [*reversed(path.parents), path]:
        if not parent.stat().st_mode & 0o001:
            raise InvalidRequest(
                f"mount source {path} is not reachable by the sandbox's unprivileged owner: "
                f"{parent} is not searchable by others (chmod o+x)"
            )
