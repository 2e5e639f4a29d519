"""The ``glob`` and ``grep`` tools' program, run inside the sandbox (``python3 -c``) by the
worker: the search happens where the files are, as the sandbox's user, and is confined to its
root as the sandbox resolves it (symlinks followed inside the sandbox, never on a host).

Standard library only; its source is sent as the command. Arguments come in the environment:
``SANDHOLD_SEARCH`` (``glob`` or ``grep``), ``SANDHOLD_PATTERN``, ``SANDHOLD_ROOT`` (an absolute
path) and ``SANDHOLD_VIEW`` (the read roots of the session's file view, ``:``-separated).
Exit status: 0 with results on stdout, 1 for no match, 2 with the reason on stderr.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

MAX_ENTRIES = 50_000  # paths looked at, at most
GLOB_LIMIT = 200  # paths returned, newest first
GREP_LIMIT = 100 * 1024  # bytes of matching lines returned
MAX_LINE = 2000  # longer lines are skipped: a model-chosen regex must not backtrack for ever
SKIP_DIRS = {".git", "node_modules"}


def fail(message: str) -> None:
    print(message, file=sys.stderr)
    sys.exit(2)


def within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def search_root(raw: str, view: list[Path]) -> Path:
    try:
        real = Path(raw).resolve(strict=True)
    except (OSError, RuntimeError) as e:
        fail(f"{raw}: {e.strerror if isinstance(e, OSError) else e}")
        raise
    if not any(within(real, root) for root in view):
        fail(f"{raw} resolves to {real}, outside the session's file view")
    return real


def glob(root: Path, pattern: str) -> int:
    if not root.is_dir():
        fail(f"{root}: not a directory")
    found: list[tuple[float, str]] = []
    try:
        for seen, match in enumerate(root.glob(pattern)):
            if seen >= MAX_ENTRIES:
                break
            try:
                real = match.resolve(strict=True)
                mtime = match.stat().st_mtime
            except (OSError, RuntimeError):
                continue
            if within(real, root):  # a symlink met on the way must not lead out of the root
                found.append((mtime, str(match)))
    except (ValueError, OSError) as e:
        fail(str(e))
    if not found:
        return 1
    found.sort(key=lambda entry: entry[0], reverse=True)
    print("\n".join(path for _, path in found[:GLOB_LIMIT]))
    return 0


def grep(root: Path, pattern: str) -> int:
    try:
        rx = re.compile(pattern)
    except re.error as e:
        fail(f"invalid regex: {e}")
        raise
    lines: list[str] = []
    budget = GREP_LIMIT

    def scan(path: Path) -> bool:
        """False once the output budget is spent."""
        nonlocal budget
        try:
            with path.open("rb") as f:
                if b"\0" in f.read(512):  # binary
                    return True
                f.seek(0)
                for number, raw in enumerate(f, 1):
                    if len(raw) > MAX_LINE:
                        continue
                    line = raw.decode(errors="replace").rstrip("\r\n")
                    if rx.search(line):
                        hit = f"{path}:{number}:{line}"
                        budget -= len(hit.encode()) + 1
                        if budget < 0:
                            lines.append(f"[output truncated at {GREP_LIMIT} bytes]")
                            return False
                        lines.append(hit)
        except OSError:
            pass
        return True

    if root.is_file():
        scan(root)
    else:
        seen = 0
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            # Symlinked directories and files are not followed: they could lead out of the root.
            dirnames[:] = sorted(
                d for d in dirnames if d not in SKIP_DIRS and not (here / d).is_symlink()
            )
            for name in sorted(filenames):
                path = here / name
                if path.is_symlink() or not path.is_file():
                    continue
                seen += 1
                if seen > MAX_ENTRIES or not scan(path):
                    break
            else:
                continue
            break
    if not lines:
        return 1
    print("\n".join(lines))
    return 0


def main() -> int:
    env = os.environ
    view = [Path(p) for p in env["SANDHOLD_VIEW"].split(":") if p]
    root = search_root(env["SANDHOLD_ROOT"], view)
    search = glob if env["SANDHOLD_SEARCH"] == "glob" else grep
    try:
        return search(root, env["SANDHOLD_PATTERN"])
    except Exception as e:  # exit 2 with why, not Python's 1 ("no matches")
        fail(f"{type(e).__name__}: {e}")
        raise


if __name__ == "__main__":
    sys.exit(main())
