"""`sandhold doctor`: what the runtime needs from this host, checked for real, with the fix."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sandhold.runtime import cgroup_v1, cgroup_v2, cgroups, idmap
from sandhold.runtime.checkpoint import criu
from sandhold.runtime.idmap import ID_RANGE


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


# The kernel features the runtime uses, each from the release that brought it
# (docs/runtime.md, "Kernel features and versions"); 6.1 is the oldest proven (the v2 guest).
KERNEL_FEATURES = (
    "namespaces and seccomp 4.6",
    "idmapped mounts 5.12 (overlay layers 5.19)",
    "cgroup.kill 5.14",
)
OLDEST_PROVEN = (6, 1)


def _kernel() -> Check:
    release = os.uname().release
    parts = release.split(".")
    version = (int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0))
    return Check(
        "kernel",
        version >= OLDEST_PROVEN,
        f"{release}; uses {', '.join(KERNEL_FEATURES)}",
        "run Linux 6.1 or later (Debian 12's kernel or newer)",
    )


def _userns() -> Check:
    try:
        limit = int(Path("/proc/sys/user/max_user_namespaces").read_text())
    except OSError:
        limit = 0
    return Check(
        "user namespaces",
        limit > 0,
        f"max_user_namespaces={limit}",
        "sysctl -w user.max_user_namespaces=65536",
    )


def _bwrap() -> Check:
    path = shutil.which("bwrap")
    if not path:
        return Check("bubblewrap", False, "bwrap not found", "apt-get install bubblewrap")
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.strip()
    return Check("bubblewrap", True, out)


def _cgroups() -> list[Check]:
    """Which backend this host gets and why; what it needs there."""
    backend = Check("cgroup backend", True, f"{cgroups.kind()}: {cgroups.why()}")
    if cgroups.kind() == "v2":
        missing = cgroup_v2.missing_controllers()
        return [
            backend,
            Check(
                "cgroup v2 controllers",
                not missing,
                " ".join(cgroup_v2.CONTROLLERS) if not missing else f"missing: {' '.join(missing)}",
                "delegate them to the server's cgroup (a container's: docs/deploy.md)",
            ),
        ]
    missing = cgroup_v1.missing_controllers()
    kill = cgroup_v1.has_v2_kill()
    return [
        backend,
        Check(
            "cgroup v1 controllers",
            not missing,
            " ".join(cgroup_v1.V1_CONTROLLERS) if not missing else f"missing: {' '.join(missing)}",
            "mount the v1 hierarchies, or boot with the unified hierarchy only (v2)",
        ),
        Check(
            "cgroup v2 cgroup.kill",
            kill,
            "unified hierarchy mounted" if kill else "absent",
            "optional: freeze+SIGKILL on v1 is used instead",
            required=False,
        ),
    ]


def _filesystem(name: str, fix: str) -> Check:
    text = Path("/proc/filesystems").read_text()
    ok = any(line.split()[-1] == name for line in text.splitlines() if line.strip())
    return Check(name, ok, "supported" if ok else "not in /proc/filesystems", fix)


def _seccomp() -> Check:
    status = Path("/proc/self/status").read_text()
    if "Seccomp:" not in status:
        return Check("seccomp", False, "kernel without CONFIG_SECCOMP", "use a kernel with seccomp")
    try:
        from sandhold.runtime.seccomp import filter_bpf

        size = len(filter_bpf())
    except Exception as e:  # libseccomp missing or broken
        return Check(
            "seccomp", False, f"cannot build the filter: {e}", "apt-get install libseccomp2"
        )
    return Check("seccomp", True, f"filter compiled ({size} bytes of BPF)")


def _root() -> Check:
    ok = os.geteuid() == 0
    return Check(
        "running as root",
        ok,
        f"euid={os.geteuid()}",
        "run the runtime as root (sandboxes themselves never are)",
    )


def _python() -> Check:
    ok = os.access("/usr/bin/python3", os.X_OK)
    return Check(
        "/usr/bin/python3",
        ok,
        "present" if ok else "missing",
        "apt-get install python3 (the agent and the base template use it)",
    )


def _uid_range(uid_base: int, ranges: int) -> Check:
    end = uid_base + ID_RANGE * (ranges + 1)  # the canonical range, then one per sandbox
    clash = []
    for line in Path("/etc/passwd").read_text().splitlines():
        parts = line.split(":")
        if len(parts) > 2 and parts[2].isdigit() and uid_base <= int(parts[2]) < end:
            clash.append(parts[0])
    return Check(
        "sandbox uid ranges",
        not clash,
        f"{uid_base}..{end - 1} " + ("free" if not clash else f"used by {clash}"),
        "set SANDHOLD_UID_BASE (or uid_ranges) to a free range",
    )


def _idmapped_mounts() -> Check:
    """What per-sandbox uid ranges stand on: an idmapped mount of a directory here."""
    detail = "work"
    try:
        with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
            cache = idmap.UsernsCache(1)
            try:
                os.close(idmap.clone(d, cache.get(ID_RANGE * 2, ID_RANGE * 3)))
            finally:
                cache.close()
    except OSError as e:
        detail = f"fail: {e}"
    return Check(
        "idmapped mounts",
        detail == "work",
        detail,
        "needs Linux >= 5.19 with idmapped mounts on the data directory's filesystem, "
        "or uid_isolation = false (all sandboxes share one host uid range)",
    )


def _kvm() -> Check:
    ok = os.path.exists("/dev/kvm")
    return Check(
        "KVM",
        ok,
        "/dev/kvm present" if ok else "absent",
        "optional: a microVM tier is reached through the e2b provider",
        required=False,
    )


def _criu(path: Path) -> Check:
    ok, detail = criu.criu_status(path)
    return Check(
        "CRIU", ok, detail, f"optional (pause uses the cgroup freezer): {criu.FIX}", required=False
    )


def run_checks(uid_base: int, uid_ranges: int, criu_path: Path) -> list[Check]:
    return [
        _root(),
        _kernel(),
        _userns(),
        _bwrap(),
        *_cgroups(),
        _filesystem("overlay", "enable CONFIG_OVERLAY_FS"),
        _seccomp(),
        _python(),
        _uid_range(uid_base, uid_ranges),
        _idmapped_mounts(),
        _kvm(),
        _criu(criu_path),
    ]
