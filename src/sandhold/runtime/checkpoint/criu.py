"""Whether the CRIU binary the settings name can checkpoint on this host (``criu_status``).

``scripts/install.sh`` builds CRIU 4.1.1 at ``criu_path`` (docs/runtime.md, "CRIU"). Anything
older fails on current kernels, and ``criu check`` exits 0 even when it fails, so both the
version and the words of ``criu check`` are judged.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from sandhold.runtime import mounts

_libc = ctypes.CDLL(None, use_errno=True)

MIN_VERSION = (4, 1)
FIX = "run scripts/install.sh (it builds CRIU 4.1.1 at criu_path)"
# CRIU's kernel-features cache (criu.kdat) lives here (scripts/install-criu.sh builds it with
# RUNDIR set to it). CRIU keeps it only on a tmpfs, which /run is not on every host: without it
# every dump and restore probes the kernel again (~30 ms each).
KDAT_DIR = Path("/run/sandhold-criu")
TMPFS_MAGIC = 0x01021994
log = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def kdat_cache() -> bool:
    """Make KDAT_DIR a tmpfs of its own where it is not on one; False if that failed."""
    try:
        KDAT_DIR.mkdir(mode=0o700, exist_ok=True)
        if _fs_type(KDAT_DIR) == TMPFS_MAGIC:
            return True
        mounts.mount_tmpfs(KDAT_DIR, 1 << 20, 0o700)
        return True
    except OSError as e:
        log.warning(
            "CRIU runs without its kernel-features cache (%s: %s): each checkpoint and "
            "restore takes ~30 ms more",
            KDAT_DIR,
            e,
        )
        return False


def _fs_type(path: Path) -> int:
    buf = ctypes.create_string_buffer(120)  # struct statfs: f_type is its first word
    if _libc.statfs(str(path).encode(), buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int.from_bytes(buf.raw[:8], sys.byteorder)


def _run(path: Path, *args: str) -> str:
    out = subprocess.run([str(path), *args], capture_output=True, text=True, timeout=60)
    return out.stdout + out.stderr


@lru_cache(maxsize=8)
def criu_status(path: Path) -> tuple[bool, str]:
    """(usable, what was found), computed once per path and process."""
    if not path.is_file():
        return False, f"not installed at {path}"
    kdat_cache()
    try:
        m = re.search(r"^Version: (\d+)\.(\d+)(\S*)", _run(path, "--version"), re.M)
        if not m:
            return False, f"{path} does not report a CRIU version"
        version = f"{m[1]}.{m[2]}{m[3]}"
        if (int(m[1]), int(m[2])) < MIN_VERSION:
            return False, f"CRIU {version} at {path}: needs >= 4.1"
        check = _run(path, "check")
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{path} does not run: {e}"
    if "Looks good." not in check:
        errors = [line for line in check.splitlines() if "Error" in line]
        return False, f"CRIU {version} at {path}: criu check fails: " + (
            errors[0] if errors else check.strip()[-200:] or "no output"
        )
    return True, f"CRIU {version} at {path}: criu check: Looks good."
