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

The image, its loop device and the cache of formatted images are ``images.py``'s, shared with
the workspaces' budgets (``wsdisk.py``). The loop device clears itself when its filesystem is
unmounted (``LO_FLAGS_AUTOCLEAR``), so nothing is left once the sandbox is gone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sandhold.config import Settings
from sandhold.errors import InvalidRequest
from sandhold.runtime import images, mounts
from sandhold.runtime.images import BLOCK, BYTES_PER_INODE, MOUNT_OPTS, copy_sparse, mount_image
from sandhold.runtime.spec import SandboxSpec
from sandhold.runtime.templates.store import Template

__all__ = ["MOUNT_OPTS", "DiskBudget", "Layer", "copy_sparse", "mount_image"]  # bench/ uses them
IMAGE = "disk.img"
CACHE = "disk-images"  # under data_dir: formatted empty images, one per recent budget size
MOUNT = "disk"
DEVICE = "disk.loop"  # the loop device's name, to wait for it to detach at kill


@dataclass(frozen=True)
class Layer:
    """Where a sandbox's writable layer lives."""

    upper: Path
    work: Path


def mkfs_options(size: int) -> list[str]:
    # No journal: the layer dies with the sandbox, and no sandbox survives a host crash. Lazy
    # inode tables: the image stays sparse (see noinit_itable). No reserved blocks, no resize.
    inodes = max(size // BYTES_PER_INODE, 1024)
    return ["-q", "-F", "-b", str(BLOCK), "-I", "256", "-N", str(inodes), "-m", "0",
            "-O", "^has_journal,^resize_inode", "-E", "lazy_itable_init=1,nodiscard"]  # fmt: skip


class DiskBudget:
    """Budgets (which one a sandbox gets) and the per-sandbox filesystem that enforces it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cache = images.FormatCache(settings.data_dir / CACHE)

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
        images.tool("mkfs.ext4")
        limits = spec.limits.model_copy(update={"disk_mb": mb})
        return spec.model_copy(update={"limits": limits})

    def prepare(self, sandbox_dir: Path, spec: SandboxSpec, source: Path | None = None) -> Layer:
        """Make the sandbox's writable layer: on its own image when a budget is set; a copy of
        ``source`` (another layer's image: a fork's, a snapshot's) when given."""
        if spec.limits.disk_mb is None:
            if source is not None:
                raise InvalidRequest("only a sandbox with a disk budget can be copied")
            return Layer(sandbox_dir / "upper", sandbox_dir / "work")
        image, mnt = sandbox_dir / IMAGE, sandbox_dir / MOUNT
        if source is not None:
            images.copy_sparse(source, image)
        else:
            self.cache.copy(spec.limits.disk_mb << 20, mkfs_options, image)
        mnt.mkdir(mode=0o755)
        mount_image(image, mnt, b"ext4", images.MOUNT_FLAGS, MOUNT_OPTS, sandbox_dir / DEVICE)
        return Layer(mnt / "upper", mnt / "work")

    def open(self) -> None:
        """Remove what formats cut short by a crash left in the cache."""
        self.cache.open()

    def _formatted(self, size: int) -> Path:
        return self.cache.formatted(size, mkfs_options)

    def release(self, sandbox_dir: Path) -> None:
        """Unmount the sandbox's filesystem and wait until its loop device has detached itself,
        so that a kill leaves nothing behind when it returns; the image goes with the sandbox's
        directory. Safe on a half-made sandbox, and on one whose mounts someone else removed."""
        images.release(sandbox_dir / MOUNT, sandbox_dir / DEVICE, sandbox_dir / IMAGE)

    def usage(self, sandbox_dir: Path) -> tuple[int, int] | None:
        """(used, total) bytes of the sandbox's filesystem, from statfs: no walk of the tree.
        None for a sandbox without a budget."""
        mnt = sandbox_dir / MOUNT
        if not mounts.is_mountpoint(mnt):
            return None
        st = os.statvfs(mnt)
        return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize
