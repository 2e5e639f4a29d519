"""What a template built on the host's ``/usr`` takes from the host's ``/etc``: the entries that
are safe and useful inside a sandbox (``base``, ``TemplateStore.build_base``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ENTRIES = (
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "environment",
    "gai.conf",
    "host.conf",
    "inputrc",
    "issue",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "localtime",
    "login.defs",
    "magic",
    "magic.mime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "profile",
    "profile.d",
    "protocols",
    "python3",
    "python3.*",  # the release's own: 3.11 on Debian 12, 3.13 on 13
    "services",
    "shells",
    "skel",
    "ssl",
    "timezone",
    "fonts",
    "R",
    "java-*-openjdk",  # 17 on Debian 12, 21 on 13
)


def entries() -> list[str]:
    """ENTRIES, their patterns matched against this host's /etc."""
    out: list[str] = []
    for entry in ENTRIES:
        out += sorted(p.name for p in Path("/etc").glob(entry)) if "*" in entry else [entry]
    return out


# Never copied even when nested in an entry above.
EXCLUDE = ("ssl/private",)


def copy(dest: Path) -> None:
    """The selected entries of this host's /etc, copied into a template's ``dest``."""
    for entry in entries():
        src = Path("/etc") / entry
        if not (src.exists() or src.is_symlink()):
            continue
        target = dest / entry
        if src.is_symlink():
            target.symlink_to(os.readlink(src))
        elif src.is_dir():
            shutil.copytree(
                src,
                target,
                symlinks=True,
                ignore=lambda d, names: [
                    n for n in names if os.path.relpath(os.path.join(d, n), "/etc") in EXCLUDE
                ],
            )
        else:
            shutil.copy2(src, target)
