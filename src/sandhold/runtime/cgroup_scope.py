"""Under systemd, on cgroup v2, sandboxes live in a scope of their own: ``<unit>-sandboxes.scope``,
beside the server's unit in its slice, made through ``systemd-run`` with ``Delegate=yes``.

Not in the server's own unit: sandboxes outlive a server restart, and systemd (252, measured in
tests/guest/under_systemd.py) cannot start a unit's process again in a group that has
controllers enabled for children that still run ("no internal processes": the restart fails
with status 219/CGROUP). The scope is the same delegation the container managers use under
systemd: its tree is ours to manage, systemd never writes in it, and it is not the unit's,
so a restart finds it as it was. A holder process (``sleep infinity``, in the scope's leaf
``holder``) keeps the scope while no sandbox runs; stopping the scope
(``systemctl stop <unit>-sandboxes.scope``) kills every sandbox of that server.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from sandhold.errors import HostUnsupported
from sandhold.runtime.cgroup_files import read

SYSTEMD_BOOTED = Path("/run/systemd/system")  # sd_booted(3)
HOLDER_LEAF = "holder"
_holders: list[subprocess.Popen[bytes]] = []  # ours to keep a handle on (no zombie warning)


def scope_for(own: Path) -> Path | None:
    """The scope for a server whose own cgroup is ``own``: under systemd, when ``own`` is a
    service's group; None otherwise (a container, a shell, a host without systemd)."""
    if not (own.name.endswith(".service") and SYSTEMD_BOOTED.is_dir()):
        return None
    if shutil.which("systemd-run") is None:
        return None
    stem = own.name.removesuffix(".service").replace("@", "-")
    return own.parent / f"{stem}-sandboxes.scope"


def start(scope: Path, timeout: float = 60.0) -> None:
    """Make ``scope`` with its holder in it; returns once systemd has put the holder there."""
    with tempfile.TemporaryFile() as err:
        holder = subprocess.Popen(
            ["systemd-run", "--scope", "--quiet", "--collect", f"--unit={scope.name}",
             f"--slice={scope.parent.name}", "--property=Delegate=yes",
             "--property=TasksMax=infinity", "--",
             "sleep", "infinity"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            start_new_session=True,  # outlives this process, as the sandboxes do
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not _holds(scope, holder.pid):
            if holder.poll() is not None or time.monotonic() > deadline:
                holder.kill()
                holder.wait()
                err.seek(0)
                raise HostUnsupported(
                    f"systemd-run could not make the sandboxes' scope {scope.name}: "
                    f"{err.read().decode(errors='replace').strip() or 'timed out'}"
                )
            time.sleep(0.01)
    _holders.append(holder)


def _holds(scope: Path, pid: int) -> bool:
    try:
        return str(pid) in read(scope / "cgroup.procs").split()
    except FileNotFoundError:
        return False
