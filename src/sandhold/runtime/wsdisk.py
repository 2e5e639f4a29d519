"""A disk budget per workspace, enforced by the kernel.

A workspace with a budget keeps its files in an ext4 image of that size inside its own directory
(``<workspace>/.sandhold-workspace.img``, so it goes wherever the workspace goes: a shared NFS
root, ``rmtree`` at session delete). At create the runtime attaches the image to a loop device
and mounts it at ``sandboxes/<id>/workspace``, which is bound at ``/workspace`` through the
sandbox's idmapped view (``uids.writable``) as a plain workspace is; kill unmounts it. Writes past
the budget fail with ENOSPC inside, ``df /workspace`` shows it, and the host pays at most it.

One sandbox at a time: the image is flocked on the descriptor handed to the loop device, so the
lock lives exactly as long as the device holds the image (the server may restart meanwhile) and
is dropped by the kernel when it detaches. A second attach, on this host or another one sharing
the directory, is a Conflict.

The image is the only trusted thing in the directory: it is used only if it is a regular file of
host root with one link, which nothing inside a sandbox can make (they never see it; a sandbox
that had the directory bound without a budget can only create files of its own ids).

- First attach with a budget: an empty image is made under a temporary name (flocked as well),
  the files already in the directory are copied in (``cp -a``: owners, modes, links, times) if
  they fit, else ``QuotaExceeded`` and nothing changes; the image is renamed into place, then the
  originals are removed.
- A larger budget later: the unmounted image is grown (truncate, ``e2fsck``, ``resize2fs``). A
  smaller one is not applied (a warning): images never shrink.
- No budget asked, but an image there: the image is used as it is (the files live in it).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import logging
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

from sandhold.config import Settings
from sandhold.errors import Conflict, InvalidRequest, QuotaExceeded, SandboxStartFailed
from sandhold.runtime import images, safefs
from sandhold.runtime.images import BLOCK, BYTES_PER_INODE, MOUNT_FLAGS, MOUNT_OPTS
from sandhold.runtime.spec import SandboxSpec
from sandhold.runtime.templates.store import SANDBOX_USER_UID

IMAGE = ".sandhold-workspace.img"  # in the workspace directory: the workspace's files
NEW = IMAGE + ".new"  # a first image being filled, before it is renamed into place
MOUNT = "workspace"  # under the sandbox's directory: the image, mounted
DEVICE = "workspace.loop"  # the loop device's name
SOURCE = "workspace.image"  # the image's path, for kill and reconcile to wait on
DETACH_TIMEOUT_S = 10.0  # the next sandbox of the session attaches it right after a kill
CP_BATCH = 256
GROUP_BLOCKS = 4096  # 16 MiB of 4 KiB blocks

log = logging.getLogger(__name__)
_libc = ctypes.CDLL(None, use_errno=True)


def mkfs_options(size: int) -> list[str]:
    # A journal, unlike the layer's: a workspace outlives its sandboxes and a host crash. Lazy
    # inode tables and journal: the image stays sparse. No reserved blocks. Block groups of
    # 16 MiB: a grow adds groups, each with its inodes, so the inode limit grows with the budget.
    inodes = max(size // BYTES_PER_INODE, 1024)
    return ["-q", "-F", "-b", str(BLOCK), "-g", str(GROUP_BLOCKS), "-I", "256", "-N", str(inodes),
            "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"]  # fmt: skip


def fs_bytes(fd: int) -> int:
    """The size of the ext4 filesystem in an image, from its superblock (not the file's size:
    a grow cut short may have lengthened the file only)."""
    sb = os.pread(fd, 1024, 1024)
    if len(sb) < 1024 or sb[0x38:0x3A] != b"\x53\xef":
        raise SandboxStartFailed("the workspace's disk image holds no ext4 filesystem")
    lo, log_block = int.from_bytes(sb[4:8], "little"), int.from_bytes(sb[24:28], "little")
    features = int.from_bytes(sb[0x60:0x64], "little")
    hi = int.from_bytes(sb[0x150:0x154], "little") if features & 0x80 else 0  # 64bit
    return ((hi << 32) | lo) * (1024 << log_block)


class WorkspaceDisk:
    def __init__(self, settings: Settings, cache: images.FormatCache, sandboxes_dir: Path) -> None:
        self.settings = settings
        self.cache = cache
        self.sandboxes_dir = sandboxes_dir
        self.owner = settings.uid_base + SANDBOX_USER_UID  # as _prepare_workspace's

    def check(self, spec: SandboxSpec) -> None:
        """Refuse a budget this host cannot give, before anything is made."""
        mb = spec.workspace_disk_mb
        if mb is None:
            return
        if not self.settings.disk_enforced:
            raise InvalidRequest(
                "workspace_disk_mb: disk budgets are off on this host (disk_enforced=false)"
            )
        if mb > self.settings.max_disk_mb:
            raise InvalidRequest(
                f"workspace_disk_mb: {mb} MiB is above the operator's maximum "
                f"(max_disk_mb={self.settings.max_disk_mb})"
            )
        for name in ("mkfs.ext4", "e2fsck", "resize2fs"):
            images.tool(name)

    def attach(self, d: Path, workspace: Path, mb: int | None) -> tuple[Path, int | None]:
        """Mount the workspace's image for sandbox directory ``d`` (making, filling or growing
        it first); returns what to bind at /workspace and the budget enforced (MiB), or the
        directory itself and None for a workspace without one."""
        for _ in range(3):
            fd = self._open(workspace, IMAGE, create=False)
            if fd is not None:
                try:
                    size = self._existing(workspace, fd, mb)
                    return self._mount(d, workspace, fd), size
                finally:
                    os.close(fd)
            if mb is None:
                return workspace, None
            fd = self._open(workspace, NEW, create=True)
            assert fd is not None
            try:
                self._lock(fd, workspace)
                if (workspace / IMAGE).exists() or os.fstat(fd).st_nlink == 0:
                    _unlink_if(workspace / NEW, fd)  # made meanwhile by another create
                    continue
                self._first(d, workspace, fd, mb)
                return d / MOUNT, mb
            finally:
                os.close(fd)
        raise Conflict(f"workspace {workspace} is being attached by other sandboxes; retry")

    def release(self, d: Path) -> None:
        """Unmount sandbox ``d``'s workspace image (its views are gone already) and wait until
        its loop device has detached and dropped the image's lock, so that the session's next
        sandbox can attach it at once. Safe on a half-made sandbox and after a crash."""
        try:
            image = Path((d / SOURCE).read_text())
        except FileNotFoundError:
            return
        if not images.release(d / MOUNT, d / DEVICE, image, DETACH_TIMEOUT_S):
            return
        # Whatever the record says (a crash can come between any two steps of an attach, a
        # first one's image renamed or not): wait until no loop device holds the image.
        deadline = time.monotonic() + DETACH_TIMEOUT_S
        while _held_by_a_loop_device(image, image.with_name(NEW)):
            if time.monotonic() > deadline:
                log.warning("the workspace image %s is still attached after its release", image)
                return
            time.sleep(0.001)
        while not _lock_free(image):  # the kernel closes the device's file a moment after
            if time.monotonic() > deadline:
                log.warning("the workspace image %s is still locked after its release", image)
                return
            time.sleep(0.001)

    # -- steps ------------------------------------------------------------------------------------
    def _open(self, workspace: Path, name: str, create: bool) -> int | None:
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(workspace / name, flags | (os.O_CREAT if create else 0), 0o600)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.ETXTBSY):
                raise _foreign(workspace, name) from e  # a symlink, a directory, a socket
            raise SandboxStartFailed(f"workspace {workspace}: opening its disk image: {e}") from e
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_nlink > 1:
            os.close(fd)
            raise _foreign(workspace, name)
        fcntl.fcntl(fd, fcntl.F_SETFL, os.O_RDWR)  # blocking I/O for the loop device
        return fd

    def _lock(self, fd: int, workspace: Path) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Conflict(
                f"workspace {workspace} is in use: its disk image is mounted by another sandbox "
                "(on this host or another); a workspace with a disk budget is attached to one "
                "sandbox at a time"
            ) from None

    def _existing(self, workspace: Path, fd: int, mb: int | None) -> int:
        """Lock an image that is there and grow it to ``mb`` if asked; returns its size (MiB)."""
        self._lock(fd, workspace)
        if left := [n for n in os.listdir(workspace) if not n.startswith(IMAGE)]:
            log.warning(
                "workspace %s holds %d entries beside its disk image, which sandboxes "
                "do not see (a move into it cut short?): %s",
                workspace,
                len(left),
                left[:5],
            )
        have = fs_bytes(fd)
        want = (mb << 20) if mb is not None else have
        if want > have:
            image = workspace / IMAGE
            os.ftruncate(fd, max(want, os.fstat(fd).st_size))
            _fsck(image)
            images.run_tool(
                [images.tool("resize2fs"), "-p", str(image), f"{want >> 10}K"],
                f"growing the disk image of workspace {workspace}",
            )
            log.info(
                "workspace %s: disk image grown from %d to %d MiB",
                workspace,
                have >> 20,
                want >> 20,
            )
            return want >> 20
        if want < have:
            log.warning(
                "workspace %s: a budget of %d MiB is below its disk image's %d MiB; "
                "images never shrink, it stays %d MiB",
                workspace,
                want >> 20,
                have >> 20,
                have >> 20,
            )
        return have >> 20

    def _mount(self, d: Path, workspace: Path, fd: int) -> Path:
        mnt = d / MOUNT
        mnt.mkdir(mode=0o755, exist_ok=True)
        (d / SOURCE).write_text(str(workspace / IMAGE))
        images.mount_image(fd, mnt, b"ext4", MOUNT_FLAGS, MOUNT_OPTS, d / DEVICE)
        # The workspace's root is the filesystem's: no lost+found of host root in it (mkfs and
        # e2fsck make one; e2fsck makes it again should it ever need it).
        with contextlib.suppress(OSError):  # not empty: leave it
            os.rmdir(mnt / "lost+found")
        st = os.stat(mnt)
        if (st.st_uid, st.st_gid) != (self.owner, self.owner):
            os.chown(mnt, self.owner, self.owner)
        return mnt

    def _first(self, d: Path, workspace: Path, fd: int, mb: int) -> None:
        """A workspace's first image (``fd``, locked, at NEW), with the files already there."""
        self.cache.copy(mb << 20, mkfs_options, fd)
        names = sorted(n for n in os.listdir(workspace) if not n.startswith(IMAGE))
        self._refuse_if_shared(workspace)
        mnt = self._mount(d, workspace, fd)
        try:
            os.chmod(mnt, stat.S_IMODE(os.stat(workspace).st_mode))
            if names:
                self._copy_in(workspace, names, mnt, mb)
            _syncfs(mnt)
            os.fsync(fd)
            os.rename(workspace / NEW, workspace / IMAGE)
            _fsync_dir(workspace)
        except BaseException:
            images.release(mnt, d / DEVICE, workspace / NEW, DETACH_TIMEOUT_S)
            _unlink_if(workspace / NEW, fd)
            (d / SOURCE).unlink(missing_ok=True)
            raise
        for name in names:  # in the image now: the originals go (a crash leaves them unseen)
            path = workspace / name
            try:
                safefs.remove_tree(path)
            except OSError as e:
                log.warning(
                    "workspace %s: could not remove %s after moving it into the disk image: %s",
                    workspace,
                    name,
                    e,
                )
        if names:
            log.info("workspace %s: %d entries moved into its disk image", workspace, len(names))

    def _refuse_if_shared(self, workspace: Path) -> None:
        """A first image is made only while no sandbox of this host has the directory bound
        (it would go on writing beside the image, unseen)."""
        for entry in self.sandboxes_dir.iterdir():
            try:
                record = json.loads((entry / "state.json").read_text())
            except (OSError, ValueError):
                continue
            if record.get("workspace") == str(workspace):
                raise Conflict(
                    f"workspace {workspace} is bound without a disk budget in sandbox "
                    f"{entry.name}; its files can be moved into a budget only when no sandbox "
                    "has it"
                )

    def _copy_in(self, workspace: Path, names: list[str], mnt: Path, mb: int) -> None:
        used, inodes = _tree_usage(workspace, names)
        st = os.statvfs(mnt)
        free, ifree = st.f_bavail * st.f_frsize, st.f_favail
        if used > free or inodes > ifree:
            raise _too_big(
                workspace,
                mb,
                f"{-(-used >> 20)} MiB in {inodes} files and "
                f"directories, {free >> 20} MiB and {ifree} inodes free",
            )
        cp = shutil.which("cp") or "/bin/cp"
        for i in range(0, len(names), CP_BATCH):
            batch = [str(workspace / n) for n in names[i : i + CP_BATCH]]
            r = subprocess.run(
                [cp, "-a", "--", *batch, f"{mnt}/"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            if r.returncode != 0:
                if "No space left" in r.stderr:
                    raise _too_big(workspace, mb, r.stderr.strip().splitlines()[-1])
                raise SandboxStartFailed(
                    f"moving workspace {workspace}'s files into its disk "
                    f"image failed: {r.stderr.strip()[-500:]}"
                )


def _foreign(workspace: Path, name: str) -> InvalidRequest:
    return InvalidRequest(
        f"workspace {workspace} holds a {name} that Sandhold did not make; move it away"
    )


def _too_big(workspace: Path, mb: int, detail: str) -> QuotaExceeded:
    return QuotaExceeded(
        f"the files of workspace {workspace} do not fit its disk budget of "
        f"{mb} MiB ({detail}); nothing was changed: raise workspace_disk_mb "
        "or remove files"
    )


def _tree_usage(root: Path, names: list[str]) -> tuple[int, int]:
    """(bytes, inodes) the entries would take on a 4 KiB-block filesystem (hard links once)."""
    used, seen = 0, set()
    paths = [str(root / n) for n in names]
    while paths:
        path = paths.pop()
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        if stat.S_ISDIR(st.st_mode):
            used += BLOCK
            paths += [os.path.join(path, n) for n in os.listdir(path)]
        else:
            used += -(-st.st_blocks * 512 // BLOCK) * BLOCK
    return used, len(seen)


def _fsck(image: Path) -> None:
    """resize2fs wants a freshly checked filesystem; 1 means errors were corrected."""
    argv = [images.SETPRIV, "--pdeathsig", "KILL", "--", images.tool("e2fsck"), "-f", "-p",
            str(image)]  # fmt: skip
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode not in (0, 1):
        raise SandboxStartFailed(
            f"checking the disk image {image} failed ({r.returncode}): {r.stdout.strip()[-500:]}"
        )


def _lock_free(image: Path) -> bool:
    try:
        fd = os.open(image, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # and the lock with it


def _unlink_if(path: Path, fd: int) -> None:
    """Remove ``path`` if it is still the file open at ``fd``."""
    try:
        if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
            os.unlink(path)
    except FileNotFoundError:
        pass


def _syncfs(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.EINVAL:  # some filesystems cannot sync a directory
            raise
    finally:
        os.close(fd)


def _held_by_a_loop_device(*paths: Path) -> bool:
    wanted = {str(p) for p in paths}
    return any(
        images.backing(f) in wanted for f in Path("/sys/block").glob("loop*/loop/backing_file")
    )
