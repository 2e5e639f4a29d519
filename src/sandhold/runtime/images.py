"""Filesystem images on loop devices: what every disk budget is made of, the writable layer's
(``disk.py``) and a workspace's (``wsdisk.py``).

An empty filesystem of each size is formatted once by ``mkfs.ext4`` and kept in a cache
(``data_dir/disk-images``, a few hundred KiB of sparse file each); an image is a sparse copy of
it, attached to a free loop device with ioctls (``LOOP_CTL_GET_FREE`` + ``LOOP_CONFIGURE``, with
``LO_FLAGS_AUTOCLEAR`` and direct I/O) and mounted with mount(2). The device clears itself when
its filesystem is unmounted, so nothing is left once the mount is gone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import logging
import os
import shutil
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sandhold.errors import HostUnsupported, SandboxStartFailed
from sandhold.runtime import mounts

SETPRIV = "/usr/bin/setpriv"  # util-linux, as the launcher's
SBIN = "/usr/sbin:/sbin"
LOOP_CONTROL = "/dev/loop-control"
LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LO_FLAGS_AUTOCLEAR = 4  # the device detaches itself when its last user (the mount) goes
LO_FLAGS_DIRECT_IO = 16  # no second copy of the sandbox's data in the host's page cache
BLOCK = 4096
BYTES_PER_INODE = 16384  # ext4's default ratio: the inode limit is budget / 16 KiB
CACHED_SIZES = 8
DETACH_TIMEOUT_S = 2.0
# minixdf: statfs counts every block of the image, so `df` shows the budget itself (metadata
# shows as used); noinit_itable: the image is sparse, its inode tables already read as zeros, so
# the kernel need not write them (which would cost the host ~1.6 % of every budget).
MOUNT_OPTS = b"minixdf,noinit_itable,discard"
MS_NOSUID, MS_NODEV, MS_NOATIME = 2, 4, 1024
MOUNT_FLAGS = MS_NOSUID | MS_NODEV | MS_NOATIME

log = logging.getLogger(__name__)

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]


def tool(name: str) -> str:
    """The path of an e2fsprogs tool; refuses clearly where there is none (or no loop device)."""
    path = shutil.which(name) or shutil.which(name, path=SBIN)
    if path is None or not os.path.exists(LOOP_CONTROL):
        raise HostUnsupported(
            f"disk budgets need {name} (apt-get install e2fsprogs) and loop devices "
            f"({LOOP_CONTROL}); or set disk_enforced=false to leave disk use uncapped"
        )
    return path


def run_tool(argv: list[str], what: str) -> None:
    """Run an e2fsprogs tool; pdeathsig: a create killed mid-way (a server crash) takes it too."""
    r = subprocess.run(
        [SETPRIV, "--pdeathsig", "KILL", "--", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if r.returncode != 0:
        raise SandboxStartFailed(f"{what} failed: {r.stderr.strip() or r.returncode}")


def _loop_config(fd: int, name: str) -> bytes:
    # struct loop_config { u32 fd, block_size; struct loop_info64 info; u64 reserved[8]; }
    info = struct.pack(
        "=5Q4I64s64s32s2Q",
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO,
        name.encode()[:63],
        b"",
        b"",
        0,
        0,
    )
    return struct.pack("=II", fd, BLOCK) + info + bytes(64)


def mount_image(
    image: Path | int, target: Path, fstype: bytes, flags: int, opts: bytes, record: Path
) -> None:
    """Attach ``image`` (a path, or an open descriptor of it, which the caller keeps and
    closes) to a free loop device and mount it at ``target``; the device's name goes to
    ``record``. The device holds the image's open file (a flock taken on that descriptor lives
    as long as it) and detaches itself when its last user closes it: our descriptor until the
    mount holds it, then the mount."""
    ctl = os.open(LOOP_CONTROL, os.O_RDWR | os.O_CLOEXEC)
    owned = not isinstance(image, int)
    if isinstance(image, int):
        backing, name = image, os.readlink(f"/proc/self/fd/{image}")
    else:
        backing, name = os.open(image, os.O_RDWR | os.O_CLOEXEC), str(image)
    try:
        for _ in range(64):
            dev = f"/dev/loop{fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)}"
            fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
            try:
                # Named before it is attached: a crash just after the attach still leaves the
                # name for release() to wait on (the kernel detaches it a moment later).
                record.write_text(os.path.basename(dev))
                try:
                    fcntl.ioctl(fd, LOOP_CONFIGURE, _loop_config(backing, name))
                except OSError as e:
                    if e.errno == errno.EBUSY:
                        continue  # another create took it between GET_FREE and CONFIGURE
                    raise
                if _libc.mount(dev.encode(), str(target).encode(), fstype, flags, opts) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"mount {name} at {target}: {os.strerror(err)}")
                return
            finally:
                os.close(fd)
        raise OSError(errno.EBUSY, "no free loop device")
    finally:
        if owned:
            os.close(backing)
        os.close(ctl)


def backing(path: Path) -> str | None:
    try:
        return path.read_text().strip().removesuffix(" (deleted)")
    except OSError:
        return None  # detached


def attached(record: Path, image: Path) -> bool:
    """Whether the loop device named in ``record`` is attached to ``image`` now."""
    try:
        name = record.read_text().strip()
    except FileNotFoundError:
        return False
    return backing(Path(f"/sys/block/{name}/loop/backing_file")) == str(image)


def release(target: Path, record: Path, image: Path, timeout_s: float = DETACH_TIMEOUT_S) -> bool:
    """Unmount ``target`` and wait until the loop device named in ``record`` has detached
    itself from ``image`` (the kernel does that asynchronously, ~7 ms here). False if it is
    still attached after ``timeout_s``. Safe when nothing is mounted or attached."""
    if mounts.is_mountpoint(target) and _libc.umount2(str(target).encode(), 0) != 0:
        mounts.umount(target)  # busy (a bwrap starting elsewhere copied it): lazily then
    try:
        name = record.read_text().strip()
    except FileNotFoundError:
        return True
    if not name.startswith("loop") or not name[4:].isdigit():
        return True
    record_file = Path(f"/sys/block/{name}/loop/backing_file")
    deadline = time.monotonic() + timeout_s
    while backing(record_file) == str(image):  # another image there: the device was reused
        if time.monotonic() > deadline:
            log.warning("loop device %s of %s is still attached", name, image)
            return False
        time.sleep(0.0005)
    return True


def mount_again(
    target: Path, record: Path, image: Path, fstype: bytes, flags: int, opts: bytes, wait_s: float
) -> bool:
    """Mount ``image`` at ``target`` after ``release``: on a new loop device once the old one
    (named in ``record``) has detached, or on the old one itself while it still holds the image
    (its filesystem kept alive by a copy of the mount in a namespace being torn down: mounting
    that device reuses the live filesystem, where a second device would put two filesystems on
    one image). False if neither happened within ``wait_s``."""
    deadline = time.monotonic() + wait_s
    name = record.read_text().strip() if record.exists() else ""
    device, at = f"/dev/{name}", str(target).encode()
    err = 0
    while True:
        if not attached(record, image):
            mount_image(image, target, fstype, flags, opts, record)
            return True
        try:  # held open, it cannot detach, nor be reused for another image, while we look
            fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            fd, err = -1, e.errno or 0
        if fd >= 0:
            try:
                if attached(record, image):
                    if _libc.mount(device.encode(), at, fstype, flags, opts) == 0:
                        return True
                    err = ctypes.get_errno()
            finally:
                os.close(fd)
        if time.monotonic() > deadline:
            log.warning(
                "%s still holds %s and cannot be mounted: %s", device, image, os.strerror(err)
            )
            return False
        time.sleep(0.005)


def copy_sparse(src: Path, dst: Path | int) -> None:
    """Copy ``src`` to a new file ``dst`` (or into an open, empty descriptor) keeping its holes:
    only the extents with data are copied."""
    out = (
        os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        if not isinstance(dst, int)
        else dst
    )
    try:
        with open(src, "rb") as fi:
            end = os.fstat(fi.fileno()).st_size
            os.ftruncate(out, 0)  # a descriptor's old content must not show through holes
            os.ftruncate(out, end)
            pos = 0
            while pos < end:
                try:
                    pos = os.lseek(fi.fileno(), pos, os.SEEK_DATA)
                except OSError as e:
                    if e.errno == errno.ENXIO:  # only a hole is left
                        break
                    raise
                hole = os.lseek(fi.fileno(), pos, os.SEEK_HOLE)
                while pos < hole:
                    pos += _copy_range(fi.fileno(), out, hole - pos, pos)
    finally:
        if not isinstance(dst, int):
            os.close(out)


def _copy_range(fi: int, fo: int, count: int, pos: int) -> int:
    try:
        return os.copy_file_range(fi, fo, count, pos, pos)
    except OSError as e:  # another filesystem (a workspace on NFS): through our memory
        if e.errno not in (errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP):
            raise
        data = os.pread(fi, min(count, 1 << 20), pos)
        return os.pwrite(fo, data, pos)


class FormatCache:
    """Empty filesystems, formatted once per size and set of mkfs options and kept (the
    ``CACHED_SIZES`` used last): copying one costs 0.3 ms, mkfs.ext4 6 ms and more under load."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir

    def open(self) -> None:
        """Remove what formats cut short by a crash left in the cache."""
        for tmp in self.cache_dir.glob(".*.tmp"):
            pid = tmp.name.split(".")[-3]
            if not pid.isdigit() or not Path(f"/proc/{pid}").exists():
                tmp.unlink(missing_ok=True)

    def formatted(self, size: int, options: Callable[[int], list[str]]) -> Path:
        """An empty ext4 filesystem of ``size`` bytes made with ``options(size)``."""
        path = self.cache_dir / f"ext4-{size >> 20}m-{format_id(options)}.img"
        try:
            os.utime(path)  # recently used: the last to be evicted
            return path
        except FileNotFoundError:
            pass
        self.cache_dir.mkdir(mode=0o700, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.truncate(size)
            run_tool([tool("mkfs.ext4"), *options(size), str(tmp)], "mkfs.ext4 of a disk image")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        cached = sorted(self.cache_dir.glob("ext4-*.img"), key=lambda p: p.stat().st_mtime)
        for old in cached[:-CACHED_SIZES]:  # any budget may be asked for: keep a few sizes
            old.unlink(missing_ok=True)
        return path

    def copy(self, size: int, options: Callable[[int], list[str]], dst: Path | int) -> None:
        """A new image of ``size`` at ``dst`` (a path, or an open empty descriptor)."""
        for attempt in range(2):
            try:
                copy_sparse(self.formatted(size, options), dst)
                return
            except FileNotFoundError:
                if attempt:  # evicted by another create between the two calls, twice
                    raise


def format_id(options: Callable[[int], list[str]]) -> str:
    """Names the cached images of one set of options (with their size): others make others."""
    return hashlib.sha256(" ".join(options(1 << 30)).encode()).hexdigest()[:8]
