"""A template build's uploaded COPY files, kept per team
(``data_dir/template-uploads/<team>/<hash>``): one team cannot plant the files of another's. A
build's start reads each COPY's archive (runtime/templates/copy_archive.py, bounded, never
unpacked on the host): it must hold the files its hash names, and its content digest, not the
client's hash, is what the layer cache keys on (another team's upload under the same hash is not
ours)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

from sandhold.config import Settings
from sandhold.errors import InvalidRequest
from sandhold.runtime.templates import copy_archive
from sandhold.runtime.templates.build import Step

log = logging.getLogger(__name__)

KEEP_S = 7 * 86400  # an upload no build has used for a week is removed


class Uploads:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.root = settings.data_dir / "template-uploads"

    def path(self, team: str, files_hash: str) -> Path:
        if not re.fullmatch(r"[0-9a-f]{16,128}", files_hash):
            raise InvalidRequest(f"invalid files hash {files_hash!r}")
        return self.root / hashlib.sha256(team.encode()).hexdigest()[:16] / files_hash

    async def save(self, team: str, files_hash: str, chunks: Any, limit: int) -> None:
        path = self.path(team, files_hash)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        part = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        size = 0
        try:
            with part.open("wb") as f:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > limit:
                        raise InvalidRequest(
                            f"upload larger than {limit >> 20} MiB (template_upload_max_mb)"
                        )
                    f.write(chunk)
            part.rename(path)
        finally:
            part.unlink(missing_ok=True)

    def check(self, team: str, steps: list[Step]) -> None:
        """Each COPY's archive read as uploaded (never unpacked here): within the build's bounds
        and holding the files its hash claims (the SDK's filesHash, recomputed), else 400 and
        the upload removed (a retry uploads it again); its content digest goes to the step,
        for the layer's key. Nothing else changes."""
        s = self.settings
        bounds = copy_archive.Bounds.for_disk(s.template_build_disk_mb, s.template_unpack_max_depth)
        for i, step in enumerate(steps):
            if step.type != "COPY" or not step.files_hash:
                continue
            path = self.path(team, step.files_hash)
            label = f"step {i + 1} (COPY {step.args[0]} {step.args[1]})"
            try:
                f = path.open("rb")
            except FileNotFoundError:  # removed meanwhile: by a failed check of the same
                raise InvalidRequest(
                    f"{label}: its files ({step.files_hash}) were not uploaded"
                ) from None
            with f:
                try:
                    step.digest = copy_archive.digest(f)
                    got, dirs = copy_archive.files_hash(f, step.args[0], step.args[1], bounds)
                    if got != step.files_hash and not dirs:
                        raise InvalidRequest(
                            f"the archive's files hash to {got}, not to "
                            "the files hash the build names"
                        )
                    if got != step.files_hash:  # the JS SDK's: directory sizes in it
                        log.info(
                            "%s: a claim not recomputable (directories), taken on the "
                            "archive's digest %s",
                            label,
                            step.digest,
                        )
                except InvalidRequest as e:
                    with contextlib.suppress(OSError):
                        if os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:
                            path.unlink()  # the one read, not one uploaded since
                    raise InvalidRequest(
                        f"{label}: its uploaded files ({step.files_hash}) "
                        f"are refused: {e.message}; the upload was "
                        "removed"
                    ) from None
            os.utime(path)  # used: kept another week

    def prune(self) -> None:
        week = time.time() - KEEP_S
        for upload in self.root.glob("*/*"):
            with contextlib.suppress(OSError):
                if upload.stat().st_mtime < week:
                    upload.unlink()
