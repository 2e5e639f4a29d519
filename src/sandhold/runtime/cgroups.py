"""Per-sandbox cgroups, on either kind of host: the backend is chosen once per process from
what the host mounts, and nothing above this module knows which (``Group``, cgroup_files.py).

- **v2** (cgroup_v2.py): ``/sys/fs/cgroup`` is the unified hierarchy, with its controllers.
- **v1** (cgroup_v1.py): hybrid hosts, whose resource controllers are v1 hierarchies.
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType
from typing import Literal

from sandhold.runtime import cgroup_v1, cgroup_v2
from sandhold.runtime.cgroup_files import CGROUP_ROOT, Group

Kind = Literal["v1", "v2"]


@functools.cache
def kind() -> Kind:
    return "v2" if (CGROUP_ROOT / "cgroup.controllers").exists() else "v1"


def why() -> str:
    """What the choice was made from, for ``sandhold doctor``."""
    if kind() == "v2":
        r = cgroup_v2.root()
        how = "the server's own group" if r == cgroup_v2.own_group() else "a systemd scope"
        return f"{CGROUP_ROOT} is the unified hierarchy; sandboxes go below {r} ({how})"
    return f"{CGROUP_ROOT} holds v1 hierarchies (a hybrid host)"


def missing_controllers() -> list[str]:
    """What the chosen backend lacks to make a sandbox's groups (nothing: ready)."""
    return _backend().missing_controllers()


def group(name: str, parent: str) -> Group:
    """Sandbox ``name``'s cgroups under the runtime's ``parent`` group."""
    if kind() == "v2":
        return cgroup_v2.V2Group(name, parent)
    return cgroup_v1.V1Group(name, parent)


def group_dirs(parent: str, name: str) -> list[Path]:
    """The directories group ``name`` may have been made in (a create can die between two)."""
    return _backend().group_dirs(parent, name)


def list_names(parent: str) -> list[str]:
    return _backend().list_names(parent)


def remove_parent(parent: str) -> None:
    """Remove a runtime's (empty) parent groups, e.g. when a test data dir is thrown away."""
    _backend().remove_parent(parent)


def _backend() -> ModuleType:
    return cgroup_v2 if kind() == "v2" else cgroup_v1
