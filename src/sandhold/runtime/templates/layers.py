"""The layer store (``data_dir/templates/.layers/<id>/``): the read-only layers that templates
built from steps stack over their base's root (build.py), shared on disk by every template
whose build made the same step over the same parent (the id says so: build.py's cache key).

A layer is a build sandbox's overlayfs upper directory as the step left it: files, and the
whiteouts (character devices 0:0) and opaque directories (``trusted.overlay.opaque``) through
which overlayfs, taking it as a lower layer, hides what the step removed. Its owners are the
canonical range's (uids.py), like a template's root. Layers no template names are collected
(``collect``) when a template is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from sandhold.errors import TemplateBuildFailed
from sandhold.runtime import safefs, staging
from sandhold.runtime.templates.store import flocked

if TYPE_CHECKING:
    from sandhold.runtime.templates.store import TemplateStore
    from sandhold.runtime.uids import UidPool

log = logging.getLogger(__name__)
NEW = ".new-"  # a layer being kept (staging.py)


class LayerStore:
    def __init__(self, root: Path, uids: UidPool) -> None:
        self.root = root
        self.uids = uids

    def path(self, layer_id: str) -> str:
        return str(self.root / layer_id)

    def exists(self, layer_id: str) -> bool:
        return (self.root / layer_id).is_dir()

    def commit(self, layer_id: str, upper: Path) -> None:
        """Keep ``upper`` (a stopped build sandbox's) as layer ``layer_id``."""
        self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
        staged = staging.make(self.root, NEW)
        try:
            # cp -a keeps what overlayfs needs of a lower layer: whiteout devices, xattrs.
            r = subprocess.run(
                ["cp", "-a", "--", f"{upper}/.", f"{staged}/"], capture_output=True, text=True
            )
            if r.returncode != 0:
                raise TemplateBuildFailed(f"keeping the step's layer failed: {r.stderr[-500:]}")
            self.uids.shift_tree(staged, self.uids.canonical)
            staged.chmod(0o755)
            try:
                staged.rename(self.root / layer_id)
            except OSError:  # made meanwhile by an identical build: the same layer
                safefs.remove_quietly(staged)
        except BaseException:
            safefs.remove_quietly(staged)
            raise

    @contextlib.contextmanager
    def building(self) -> Iterator[None]:
        """Held (shared, across processes) by a build from its first cache lookup until its
        template is recorded: no collection meanwhile removes a layer it counts on."""
        with self._lock(fcntl.LOCK_SH):
            yield

    def _lock(self, how: int) -> contextlib.AbstractContextManager[bool]:
        self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
        return flocked(self.root / ".lock", how)

    def collect(self, templates: TemplateStore) -> int:
        """Remove the layers that no template of ``templates`` names; returns how many. Not
        while a build runs (the next collection does it)."""
        if not self.root.is_dir():
            return 0
        with self._lock(fcntl.LOCK_EX | fcntl.LOCK_NB) as free:
            return self._collect(templates) if free else 0

    def _collect(self, templates: TemplateStore) -> int:
        used = {Path(p).name for t in templates.list() for p in t.layers}
        removed = 0
        for d in self.root.iterdir():
            if d.name.startswith(".") or d.name in used:
                continue
            safefs.remove_quietly(d)
            removed += 1
        staging.sweep(self.root, [NEW])  # what a crash cut short
        if removed:
            log.info("collected %d unused template layers", removed)
        return removed
