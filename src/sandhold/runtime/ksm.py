"""Kernel samepage merging for sandbox memory (``memory_merge``, off by default).

Sandboxes started from one checkpoint (a warm template's, a fork's, a snapshot's) hold mostly
the same pages: an idle ``code-interpreter-v1`` sandbox is ~86 MiB of PSS alone and ~16 MiB
each once six of them are merged (docs/benchmarks.md). With ``memory_merge`` the runtime marks
its own process mergeable (``PR_SET_MEMORY_MERGE``, inherited by every sandbox it starts, across
exec) and turns the kernel's ``ksmd`` on at ``memory_merge_pages_to_scan`` pages per 20 ms.

Why it is off by default: merged pages are shared across sandboxes, and a write to a merged
page takes measurably longer (the copy), so code in one sandbox can learn whether another
holds a page of given content (a known side channel between tenants), and ``ksmd`` costs CPU.
Turn it on where sandboxes of one host trust each other that far, or density matters more.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

from sandhold.errors import HostUnsupported

KSM = Path("/sys/kernel/mm/ksm")
PR_SET_MEMORY_MERGE = 67
SLEEP_MS = 20

log = logging.getLogger(__name__)


def enable(pages_to_scan: int) -> None:
    """Make this process's memory, and its future children's, mergeable; start ``ksmd``."""
    if not (KSM / "run").exists():
        raise HostUnsupported("memory_merge needs a kernel with KSM (CONFIG_KSM)")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_MEMORY_MERGE, 1, 0, 0, 0) != 0:
        raise HostUnsupported(
            f"memory_merge: prctl(PR_SET_MEMORY_MERGE) failed (errno {ctypes.get_errno()}; "
            "it needs Linux 6.4 and CAP_SYS_RESOURCE)"
        )
    (KSM / "pages_to_scan").write_text(str(pages_to_scan))
    (KSM / "sleep_millisecs").write_text(str(SLEEP_MS))
    (KSM / "run").write_text("1")
    log.info("memory_merge: ksmd scans %d pages every %d ms", pages_to_scan, SLEEP_MS)


def stats() -> dict[str, int]:
    """ksmd's counters (pages shared, sharing, full scans), or {} without KSM."""
    out = {}
    for name in ("pages_shared", "pages_sharing", "full_scans"):
        try:
            out[name] = int((KSM / name).read_text())
        except (OSError, ValueError):
            return {}
    return out
