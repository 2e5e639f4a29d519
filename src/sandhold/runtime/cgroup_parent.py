"""The cgroup parent a data dir's sandboxes live under, and the claim that keeps it theirs.

Reconcile kills every group under its parent that no sandbox of its data dir owns, so two data
dirs on one parent kill each other's sandboxes. A parent was once named after the data dir's
*path*, which two hosts of a fleet share (pods with a volume each, mounted at the same path).

- **The name** is ``cgroup_parent`` when set; otherwise ``sandhold-<instance id>``
  (``instance.py``), chosen once and written in ``<data_dir>/cgroup-parent``. A data dir that held
  sandboxes before names were written keeps the name they run under (the path's, as before), so
  an upgrade finds them.
- **The claim** is a file ``cgroup-<name>`` in the host-wide uid registry (the one directory every
  runtime on a kernel shares), holding the claiming data dir's id, path and mount namespace. It is
  made by linking a complete file into place (one maker wins). A runtime opens only on a parent it
  holds; another data dir's claim is taken over only when that data dir is surely gone (its path,
  seen in the same mount namespace, holds no data dir with that id).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from pathlib import Path

from sandhold.config import Settings
from sandhold.errors import ConfigError
from sandhold.runtime import instance
from sandhold.runtime.uids import mount_namespace

FILE = "cgroup-parent"
DEFAULT_DATA_DIR = Path("/var/lib/sandhold")


def name(settings: Settings) -> str:
    """The parent of ``settings``'s data dir (made and written on first use)."""
    if settings.cgroup_parent:
        return settings.cgroup_parent
    d = settings.data_dir
    if (found := _read(d / FILE)) is not None:
        return found
    chosen = _legacy(d) if _has_sandboxes(d) else "sandhold-" + instance.ensure(d)
    _link_new(d / FILE, chosen + "\n")
    found = _read(d / FILE)
    assert found is not None
    return found


def claim(settings: Settings, group: str) -> None:
    """Hold ``group`` for this data dir, or raise ConfigError naming the data dir holding it."""
    registry = settings.uid_registry
    registry.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = registry / f"cgroup-{group}"
    ours = instance.ensure(settings.data_dir)
    entry = f"{ours}\n{settings.data_dir.resolve()}\n{mount_namespace()}\n"
    for _ in range(3):
        if _link_new(path, entry):
            return
        held = (_read(path) or "").splitlines()
        if not held:
            continue  # removed meanwhile: try again
        if held[0] == ours:
            return
        if len(held) >= 3 and _gone(held):
            with contextlib.suppress(FileNotFoundError):
                if (_read(path) or "").splitlines() == held:
                    path.unlink()
            continue
        where = f"{held[1]} (instance {held[0]})" if len(held) >= 3 else held[0]
        raise ConfigError(
            f"cgroup parent {group!r} belongs to the data dir {where}: two data dirs on one "
            "parent would kill each other's sandboxes; give this one its own cgroup_parent "
            f"(or, if that data dir is gone for good, remove {path})"
        )
    raise ConfigError(f"cgroup parent {group!r}: its claim {path} keeps changing")


def release(settings: Settings) -> None:
    """Give up this data dir's claim (it is being removed, with its parent group)."""
    ours = instance.read(settings.data_dir)
    path = settings.uid_registry / f"cgroup-{name(settings)}"
    held = (_read(path) or "").splitlines()
    if ours is not None and held and held[0] == ours:
        path.unlink(missing_ok=True)


def prune(registry: Path) -> int:
    """Remove the claims of data dirs that are surely gone (as ``claim`` judges); returns how
    many: a test's or a wiped host's data dir leaves one behind."""
    pruned = 0
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(registry):
            if not entry.name.startswith("cgroup-"):
                continue
            held = (_read(Path(entry.path)) or "").splitlines()
            if len(held) >= 3 and _gone(held):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    pruned += 1
    return pruned


def _gone(held: list[str]) -> bool:
    data_id, data_dir, mnt_ns = held[:3]
    return mnt_ns == mount_namespace() and instance.read(Path(data_dir)) != data_id


def _legacy(data_dir: Path) -> str:
    if data_dir == DEFAULT_DATA_DIR:
        return "sandhold"
    return "sandhold-" + hashlib.sha256(str(data_dir).encode()).hexdigest()[:10]


def _has_sandboxes(data_dir: Path) -> bool:
    try:
        return any((data_dir / "sandboxes").iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return False


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def _link_new(path: Path, text: str) -> bool:
    """Write ``path`` whole unless it exists; True if this call made it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    tmp.write_text(text)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink()
