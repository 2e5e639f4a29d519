"""What makes a root filesystem a sandbox's (``base``'s skeleton, an image's root): the users
every template has, every file owned by the sandbox's ids, and nothing privileged (device
nodes, setuid and setgid bits, file capabilities) left in it. The root came from a user: every
path is resolved inside it, never through its links (safefs).
"""

from __future__ import annotations

import logging
import os
import stat
from collections import Counter
from pathlib import Path

from sandhold.errors import InvalidRequest
from sandhold.runtime import safefs

log = logging.getLogger(__name__)

SANDBOX_USER_UID = 1000
NOBODY = 65534  # what an id a sandbox cannot have (65,536 and over) becomes


def shift_ownership(root: Path, uid_base: int, refuse_privileged: bool = False) -> Counter[str]:
    """Make sandbox uid n own what host uid n owned (ids past the sandbox's 65,536: nobody),
    and take away what no sandbox may have from a root (an image's): device nodes, setuid and
    setgid bits, file capabilities. Returns how many of each it dropped; ``refuse_privileged``
    refuses the root instead, naming the first. Never follows a link (safefs.walk)."""
    dropped: Counter[str] = Counter()

    def visit(fd: int, name: str, st: os.stat_result) -> None:
        kind = stat.S_IFMT(st.st_mode)
        what = _privileged(fd, name, st)
        if what is not None:
            if refuse_privileged:
                raise InvalidRequest(
                    f"the image has a {what} ({name}), which "
                    "template_image_privileged=refuse does not allow"
                )
            dropped[what] += 1
            if kind in (stat.S_IFCHR, stat.S_IFBLK):
                os.unlink(name, dir_fd=fd)
                return
        os.chown(
            name,
            _shifted(st.st_uid, uid_base),
            _shifted(st.st_gid, uid_base),
            dir_fd=fd,
            follow_symlinks=False,
        )
        if what == "setuid or setgid file":  # (chown cleared them as it changed the ids; if
            os.chmod(name, st.st_mode & 0o1777, dir_fd=fd)  # it did not, this does)
        elif what == "file with capabilities":
            safefs.drop_capabilities(fd, name)

    safefs.walk(root, visit)
    st = os.lstat(root)
    os.lchown(root, _shifted(st.st_uid, uid_base), _shifted(st.st_gid, uid_base))
    if dropped:
        log.info("dropped from %s: %s", root, dict(dropped))
    return dropped


def _shifted(host_id: int, uid_base: int) -> int:
    """Host id n becomes the sandbox's n; one of the sandbox's range already (a tree shifted
    before: the interpreter's packages) stays; any other, a host id, becomes nobody's."""
    if host_id < 65536:
        return uid_base + host_id
    return host_id if uid_base <= host_id < uid_base + 65536 else uid_base + NOBODY


def _privileged(fd: int, name: str, st: os.stat_result) -> str | None:
    """What of the entry would give a sandbox (or the host) more than its files: None if
    nothing."""
    kind = stat.S_IFMT(st.st_mode)
    if kind in (stat.S_IFCHR, stat.S_IFBLK):
        return "device node"
    if kind == stat.S_IFREG and st.st_mode & 0o6000:
        return "setuid or setgid file"
    if kind == stat.S_IFREG and safefs.has_capabilities(fd, name):
        return "file with capabilities"
    return None


def add_users(rootfs: Path) -> None:
    """Make sure the rootfs has `root` and `user` (uid 1000, home /home/user). Every path is
    resolved inside the root (an image's ``etc`` may be a link to anywhere)."""
    with safefs.Root(rootfs) as root:
        root.make_dirs("etc")
        existing = root.read_text("etc/passwd")
        names = {line.split(":")[0] for line in existing.splitlines() if line}
        if "user" not in names:
            add = "" if "root" in names else "root:x:0:0:root:/root:/bin/bash\n"
            root.append("etc/passwd", add + "user:x:1000:1000:user:/home/user:/bin/bash\n")
        gexisting = root.read_text("etc/group")
        if not any(line.startswith("user:") for line in gexisting.splitlines()):
            root.append("etc/group", "user:x:1000:\n")
        root.make_dirs("home/user")
        root.chown("home/user", SANDBOX_USER_UID, SANDBOX_USER_UID)
        root.make_dirs("root", mode=0o700)
        for mp in ("proc", "dev", "tmp", "run", "workspace", "opt"):
            root.make_dirs(mp)
