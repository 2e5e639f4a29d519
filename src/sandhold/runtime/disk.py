"""A disk budget per sandbox, enforced by the kernel.

Each sandbox's writable layer (the overlay's ``upper`` and ``work``) lives on a filesystem of its
own: a sparse ext4 image of exactly the budget, ``sandboxes/<id>/disk.img``, attached to a loop
device and mounted at ``sandboxes/<id>/disk``. The kernel refuses writes past it with ENOSPC
inside the sandbox; the host loses at most the budget; overlayfs reports its upper filesystem in
statfs, so ``df /`` inside shows the budget.

Why not XFS (or ext4) project quotas on one shared filesystem: this kernel is built without
CONFIG_XFS_QUOTA and without CONFIG_QFMT_V2 (``XFS: quota support not available in this kernel``,
``EXT4-fs: The kernel was not built with CONFIG_QUOTA and CONFIG_QFMT_V2``), so neither can
enforce a project's limit. A loop device and ext4 are built in. docs/runtime.md has the figures.

No tool runs per create but ``mkfs.ext4`` (~6 ms); the loop device is configured with ioctls
and the image mounted with mount(2). The loop device clears itself when its filesystem is
unmounted (``LO_FLAGS_AUTOCLEAR``), so nothing is left once the sandbox is gone.
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
from dataclasses import dataclass
from pathlib import Path

from sandhold.config import Settings
from sandhold.errors import HostUnsupported, InvalidRequest, SandboxStartFailed
from sandhold.runtime import mounts
from sandhold.runtime.spec import SandboxSpec
from sandhold.runtime.templates import Template

SETPRIV = "/usr/bin/setpriv"  # util-linux, as the launcher's
LOOP_CONTROL = "/dev/loop-control"
LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LO_FLAGS_AUTOCLEAR = 4  # the device detaches itself when its last user (the mount) goes
LO_FLAGS_DIRECT_IO = 16  # no second copy of the sandbox's data in the host's page cache
BLOCK = 4096
BYTES_PER_INODE = 16384  # ext4's default ratio: the inode limit is budget / 16 KiB
IMAGE = "disk.img"
CACHE = "disk-images"  # under data_dir: formatted empty images, one per recent budget size
CACHED_SIZES = 8
MOUNT = "disk"
DEVICE = "disk.loop"  # the loop device's name, to wait for it to detach at kill
DETACH_TIMEOUT_S = 2.0
# minixdf: statfs counts every block of the image, so `df` shows the budget itself (metadata
# shows as used); noinit_itable: the image is sparse, its inode tables already read as zeros, so
# the kernel need not write them (which would cost the host ~1.6 % of every budget).
MOUNT_OPTS = b"minixdf,noinit_itable,discard"
MS_NOSUID, MS_NODEV, MS_NOATIME = 2, 4, 1024

log = logging.getLogger(__name__)

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]  # fmt: skip


@dataclass(frozen=True)
class Layer:
    """Where a sandbox's writable layer lives."""

    upper: Path
    work: Path


def _loop_config(fd: int, name: str) -> bytes:
    # struct loop_config { u32 fd, block_size; struct loop_info64 info; u64 reserved[8]; }
    info = struct.pack(
        "=5Q4I64s64s32s2Q", 0, 0, 0, 0, 0, 0, 0, 0, LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO,
        name.encode()[:63], b"", b"", 0, 0,
    )  # fmt: skip
    return struct.pack("=II", fd, BLOCK) + info + bytes(64)


def mount_image(
    image: Path, target: Path, fstype: bytes, flags: int, opts: bytes, record: Path
) -> None:
    """Attach ``image`` to a free loop device and mount it at ``target``; the device's name goes
    to ``record``. The device detaches itself when its last user closes it: our descriptor until
    the mount holds it, then the mount."""
    ctl = os.open(LOOP_CONTROL, os.O_RDWR | os.O_CLOEXEC)
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(64):
            dev = f"/dev/loop{fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)}"
            fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
            try:
                try:
                    fcntl.ioctl(fd, LOOP_CONFIGURE, _loop_config(backing, str(image)))
                except OSError as e:
                    if e.errno == errno.EBUSY:
                        continue  # another create took it between GET_FREE and CONFIGURE
                    raise
                record.write_text(os.path.basename(dev))
                if _libc.mount(dev.encode(), str(target).encode(), fstype, flags, opts) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"mount {image} at {target}: {os.strerror(err)}")
                return
            finally:
                os.close(fd)
        raise OSError(errno.EBUSY, "no free loop device")
    finally:
        os.close(backing)
        os.close(ctl)


def _backing(path: Path) -> str | None:
    try:
        return path.read_text().strip().removesuffix(" (deleted)")
    except OSError:
        return None  # detached


def mkfs_options(size: int) -> list[str]:
    # No journal: the layer dies with the sandbox, and no sandbox survives a host crash. Lazy
    # inode tables: the image stays sparse (see noinit_itable). No reserved blocks, no resize.
    inodes = max(size // BYTES_PER_INODE, 1024)
    return ["-q", "-F", "-b", str(BLOCK), "-I", "256", "-N", str(inodes), "-m", "0",
            "-O", "^has_journal,^resize_inode", "-E", "lazy_itable_init=1,nodiscard"]  # fmt: skip


# Names the cached images (with their size): other options make other images.
FORMAT_ID = hashlib.sha256(" ".join(mkfs_options(1 << 30)).encode()).hexdigest()[:8]


def copy_sparse(src: Path, dst: Path) -> None:
    """Copy ``src`` to a new ``dst`` keeping its holes: only the extents with data are copied."""
    with open(src, "rb") as fi, open(dst, "xb") as fo:
        end = os.fstat(fi.fileno()).st_size
        fo.truncate(end)
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
                pos += os.copy_file_range(fi.fileno(), fo.fileno(), hole - pos, pos, pos)


class DiskBudget:
    """Budgets (which one a sandbox gets) and the per-sandbox filesystem that enforces it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cache_dir = settings.data_dir / CACHE
        self._mkfs_path: str | None = None

    def _mkfs(self) -> str:
        if self._mkfs_path is None:
            path = shutil.which("mkfs.ext4") or shutil.which("mkfs.ext4", path="/usr/sbin:/sbin")
            if path is None or not os.path.exists(LOOP_CONTROL):
                raise HostUnsupported(
                    "disk budgets need mkfs.ext4 (apt-get install e2fsprogs) and loop devices "
                    f"({LOOP_CONTROL}); or set disk_enforced=false to leave disk use uncapped"
                )
            self._mkfs_path = path
        return self._mkfs_path

    @property
    def enforced(self) -> bool:
        return self.settings.disk_enforced

    def resolve(self, spec: SandboxSpec, template: Template) -> SandboxSpec:
        """The spec with its budget filled in: the create's, else the template's, else the
        default; never above the operator's maximum. Without enforcement, no budget at all."""
        s = self.settings
        if not self.enforced:
            if spec.limits.disk_mb is not None:
                raise InvalidRequest(
                    "limits.disk_mb: disk budgets are off on this host (disk_enforced=false)"
                )
            return spec
        mb = spec.limits.disk_mb or template.disk_mb or s.default_disk_mb
        if mb > s.max_disk_mb:
            whose = (
                "limits.disk_mb" if spec.limits.disk_mb else f"template {template.name}'s disk_mb"
            )
            raise InvalidRequest(
                f"{whose}: {mb} MiB is above the operator's maximum (max_disk_mb={s.max_disk_mb})"
            )
        self._mkfs()
        limits = spec.limits.model_copy(update={"disk_mb": mb})
        return spec.model_copy(update={"limits": limits})

    def prepare(self, sandbox_dir: Path, spec: SandboxSpec) -> Layer:
        """Make the sandbox's writable layer: on its own image when a budget is set."""
        if spec.limits.disk_mb is None:
            return Layer(sandbox_dir / "upper", sandbox_dir / "work")
        image, mnt = sandbox_dir / IMAGE, sandbox_dir / MOUNT
        size = spec.limits.disk_mb * 1024 * 1024
        for attempt in range(2):
            try:
                copy_sparse(self._formatted(size), image)
                break
            except FileNotFoundError:
                if attempt:  # evicted by another create between the two calls, twice
                    raise
        mnt.mkdir(mode=0o755)
        flags = MS_NOSUID | MS_NODEV | MS_NOATIME
        mount_image(image, mnt, b"ext4", flags, MOUNT_OPTS, sandbox_dir / DEVICE)
        return Layer(mnt / "upper", mnt / "work")

    def open(self) -> None:
        """Remove what formats cut short by a crash left in the cache."""
        for tmp in self.cache_dir.glob(".*.tmp"):
            pid = tmp.name.split(".")[-3]
            if not pid.isdigit() or not Path(f"/proc/{pid}").exists():
                tmp.unlink(missing_ok=True)

    def _formatted(self, size: int) -> Path:
        """An empty filesystem of ``size`` bytes, formatted once and kept (a few hundred KiB of
        a sparse file): copying it costs 0.3 ms, mkfs.ext4 6 ms and more under load."""
        path = self.cache_dir / f"ext4-{size >> 20}m-{FORMAT_ID}.img"
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
            # pdeathsig: a create killed mid-way (a server crash) takes its mkfs with it.
            r = subprocess.run(
                [SETPRIV, "--pdeathsig", "KILL", "--", self._mkfs(), *mkfs_options(size),
                 str(tmp)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            if r.returncode != 0:
                raise SandboxStartFailed(f"mkfs.ext4 of a disk image failed: {r.stderr.strip()}")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        cached = sorted(self.cache_dir.glob("ext4-*.img"), key=lambda p: p.stat().st_mtime)
        for old in cached[:-CACHED_SIZES]:  # any budget may be asked for: keep a few sizes
            old.unlink(missing_ok=True)
        return path

    def release(self, sandbox_dir: Path) -> None:
        """Unmount the sandbox's filesystem and wait until its loop device has detached itself
        (the kernel does that asynchronously, ~7 ms here), so that a kill leaves nothing behind
        when it returns; the image goes with the sandbox's directory. Safe on a half-made
        sandbox, and on one whose mounts someone else removed."""
        mnt = sandbox_dir / MOUNT
        if mounts.is_mountpoint(mnt) and _libc.umount2(str(mnt).encode(), 0) != 0:
            mounts.umount(mnt)  # busy (a bwrap starting elsewhere copied it): lazily then
        try:
            name = (sandbox_dir / DEVICE).read_text().strip()
        except FileNotFoundError:
            return
        if not name.startswith("loop") or not name[4:].isdigit():
            return
        backing = Path(f"/sys/block/{name}/loop/backing_file")
        image = str(sandbox_dir / IMAGE)
        deadline = time.monotonic() + DETACH_TIMEOUT_S
        while _backing(backing) == image:  # another image there: the device was reused
            if time.monotonic() > deadline:
                log.warning("loop device %s of %s is still attached", name, image)
                return
            time.sleep(0.0005)

    def usage(self, sandbox_dir: Path) -> tuple[int, int] | None:
        """(used, total) bytes of the sandbox's filesystem, from statfs: no walk of the tree.
        None for a sandbox without a budget."""
        mnt = sandbox_dir / MOUNT
        if not mounts.is_mountpoint(mnt):
            return None
        st = os.statvfs(mnt)
        return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize
