"""Whether the CRIU binary the settings name can checkpoint on this host (``criu_status``).

``scripts/install.sh`` builds CRIU 4.1.1 at ``criu_path`` (docs/runtime.md, "CRIU"). Anything
older fails on current kernels, and ``criu check`` exits 0 even when it fails, so both the
version and the words of ``criu check`` are judged.
"""

from __future__ import annotations

import re
import subprocess
from functools import lru_cache
from pathlib import Path

MIN_VERSION = (4, 1)
FIX = "run scripts/install.sh (it builds CRIU 4.1.1 at criu_path)"


def _run(path: Path, *args: str) -> str:
    out = subprocess.run([str(path), *args], capture_output=True, text=True, timeout=60)
    return out.stdout + out.stderr


@lru_cache(maxsize=8)
def criu_status(path: Path) -> tuple[bool, str]:
    """(usable, what was found), computed once per path and process."""
    if not path.is_file():
        return False, f"not installed at {path}"
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
