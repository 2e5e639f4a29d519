"""Checkpoint and restore of a sandbox's process tree with CRIU (>= 4.1, see docs/runtime.md).

A sandbox is checkpointable as it is launched: its agent is pid 1 (``--as-pid-1``), nothing runs
outside its namespaces, and what the host handed the agent (its listening socket, its log file)
is given up before the dump and handed back after it (agent/checkpoint.py): the agent is asked
to quiesce, ``criu dump`` takes the tree (which ends it), ``criu restore`` recreates it inside
the sandbox's cgroups, over its root, and the host hands the agent a new socket through
``handoff/agent.sock``, accepting only the agent's own process (``SO_PEERCRED``). A dump that
fails leaves the tree running; the same handoff gives the agent its socket back.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import lz4.frame

from sandhold.errors import CheckpointFailed
from sandhold.runtime.checkpoint.criuimg import remap_userns
from sandhold.runtime.launcher import (
    BOOT_ID,
    BOOT_ID_FILE,
    HANDOFF,
    HANDOFF_AT,
    JOIN_AND_EXEC,
    RW_DIRS,
)
from sandhold.runtime.uids import VIEW_LIST

IMAGES = "checkpoint"  # in the sandbox's directory
QUIESCE = b"POST /sandhold/quiesce HTTP/1.1\r\nHost: agent\r\nContent-Length: 0\r\n\r\n"
# Shared by dump and restore: mounts bound from the host are external (the root, /usr, the
# workspace view, ...), found again by path; the sandbox's netns has no route to lock.
COMMON = ["--ext-mount-map", "auto", "--network-lock", "skip", "--tcp-established"]
# inotify watches (the file API's watchers, a user's tools) name inodes of the overlay, which
# CRIU cannot reopen by handle: it finds their paths by scanning where users keep files.
IRMAP = ["--force-irmap", "--irmap-scan-path", "/home", "--irmap-scan-path", "/workspace",
         "--irmap-scan-path", "/root"]  # fmt: skip
# The read-only covers over the agent's OOM files (launcher.py) are binds of the agent's own
# /proc files, gone with it: the dump names them, the restore covers them with host files.
COVERS = {
    f"/proc/1/{sub}{name}": f"{sub.replace('/', '-')}{name}"
    for sub in ("", "task/1/")
    for name in ("oom_score_adj", "oom_adj")
}
BOOT_ID_KEY = "boot_id"  # the sandbox's own boot id file (launcher.BOOT_ID), found again by key
# A template's writable dirs under a read-only bind (launcher.RW_DIRS: /usr/local of a template
# built on `base`) are binds of the sandbox's own root: "auto" would find them again at the
# path of the root that was dumped, another sandbox's (a fork's source, a warm start's maker,
# gone or on another host). They are named instead (key -> path in the root), in the images.
RW_BINDS = "sandhold-rw-binds.json"


@dataclass(frozen=True)
class Criu:
    path: Path
    timeout_s: float  # per dump or restore: killed past it (settings' criu_timeout_s)

    def run(self, argv: list[str], what: str, logfile: Path, **kw: object) -> None:
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s, **kw)  # type: ignore[call-overload]
        except subprocess.TimeoutExpired:
            raise CheckpointFailed(
                f"criu {what} did not finish in {self.timeout_s:g} s (killed; "
                f"criu_timeout_s): {_errors(logfile)}"
            ) from None
        if r.returncode != 0:
            raise CheckpointFailed(f"criu {what} failed: {_errors(logfile)}")


def quiesce(agent_socket: Path, init_pid: int, timeout: float = 5.0) -> None:
    """Ask the agent to let go of the host's descriptors; returns once it has."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(agent_socket))
        s.sendall(QUIESCE)
        status = s.recv(64)
    if not status.startswith(b"HTTP/1.1 204"):
        raise CheckpointFailed(f"the agent refused to quiesce: {status[:40]!r}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _quiet(agent_socket, init_pid):
            return
        time.sleep(0.005)
    raise CheckpointFailed("the agent did not quiesce in time")


def _quiet(agent_socket: Path, init_pid: int) -> bool:
    try:
        if os.readlink(f"/proc/{init_pid}/fd/2") != "/dev/null":
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(agent_socket))
        return False  # still listening
    except ConnectionRefusedError:
        return True


def handoff(
    d: Path,
    agent_pid: int,
    listener: socket.socket,
    log_fd: int,
    config_fd: int | None = None,
    timeout: float = 10.0,
) -> None:
    """Hand the agent (host pid ``agent_pid``) its new listening socket and log file and,
    for a warm start, its own configuration; returns once it has taken them."""
    path = d / HANDOFF / "agent.sock"
    path.unlink(missing_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(str(path))
        os.chmod(path, 0o666)  # the agent runs as the sandbox's root, unprivileged here
        srv.listen(8)
        srv.settimeout(timeout)
        try:
            while True:
                conn, _ = srv.accept()
                with conn:
                    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                    if struct.unpack("3i", creds)[0] != agent_pid:
                        continue  # someone else inside the sandbox
                    fds = array.array("i", [listener.fileno(), log_fd])
                    if config_fd is not None:
                        fds.append(config_fd)
                    conn.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
                    conn.settimeout(timeout)
                    ack = conn.recv(1)  # nothing: an agent from before acknowledgements
                    if ack == b"0" or (config_fd is not None and ack != b"1"):
                        raise CheckpointFailed("the agent could not take its new configuration")
                    return
        except TimeoutError:
            raise CheckpointFailed("the agent did not take its socket back in time") from None
        finally:
            path.unlink(missing_ok=True)


def _set_pings(init_pid: int) -> None:
    # Read back inside the user namespace, the default range names an unmapped gid and
    # cannot be restored: make it one the namespace maps.
    subprocess.run(["nsenter", "-t", str(init_pid), "-n", "sh", "-c",
                    "echo '0 0' > /proc/sys/net/ipv4/ping_group_range"], check=True)  # fmt: skip


def _views(d: Path) -> dict[str, tuple[str, str]]:
    """Path inside -> (key, host path) of each idmapped view bound in (uids.writable lists
    them): by path alone CRIU would find the plain directory under a view, not the view."""
    out = {}
    with contextlib.suppress(FileNotFoundError):
        for i, line in enumerate((d / VIEW_LIST).read_text().splitlines()):
            mountpoint, view = line.split("\t")
            out[mountpoint] = (f"view{i}", view)
    return out


def _rw_binds(init_pid: int) -> dict[str, tuple[str, str]]:
    """key -> (mount point, path in the root) of the sandbox's binds of its own RW_DIRS."""
    out: dict[str, tuple[str, str]] = {}
    with open(f"/proc/{init_pid}/mountinfo") as f:
        for line in f:
            root, mountpoint = line.split()[3:5]
            if root.startswith(f"/{RW_DIRS}/"):
                out[f"rw{len(out)}"] = (mountpoint, root)
    return out


def dump(
    criu: Criu, d: Path, init_pid: int, images: Path | None = None, *, freezer: Path | None = None
) -> Path:
    """Checkpoint the tree of ``init_pid`` into ``images`` (``d/checkpoint``). The tree ends;
    with ``freezer`` (its frozen freezer cgroup) it stays, frozen."""
    images = images or d / IMAGES
    images.mkdir(mode=0o700, exist_ok=True)
    _set_pings(init_pid)
    rw = _rw_binds(init_pid)
    (images / RW_BINDS).write_text(json.dumps({k: root for k, (_m, root) in rw.items()}))
    named = {
        **COVERS,
        HANDOFF_AT: HANDOFF,
        BOOT_ID: BOOT_ID_KEY,
        **{m: k for m, (k, _v) in _views(d).items()},
        **{m: k for k, (m, _root) in rw.items()},
    }
    keep = ["--freeze-cgroup", str(freezer), "--leave-running"] if freezer else []
    criu.run(
        [str(criu.path), "dump", "-t", str(init_pid), "-D", str(images), "-o", "dump.log",
         "--enable-external-sharing", "--enable-external-masters", *IRMAP, *COMMON, *keep,
         *(a for m, k in named.items() for a in ("--ext-mount-map", f"{m}:{k}"))],
        "dump", images / "dump.log",
    )  # fmt: skip
    return images


def restore(criu: Criu, d: Path, cgroup_procs: list[str], host_uid: int, own: bool = True) -> int:
    """Recreate the tree from ``d/checkpoint`` over ``d/root``, in the given cgroups, in the
    uid range at ``host_uid``; returns its init's pid. ``own``: the images are this sandbox's
    (a suspend), so the groups they name are its own: CRIU puts every task, threads too, back
    in them. A fork's or snapshot's name another sandbox's: the tasks, threads too (our third
    CRIU patch), stay in CRIU's, which are the new sandbox's."""
    images = d / IMAGES
    expand_pages(images)
    remap_userns(images, host_uid)
    # The restored tasks read their images after taking the sandbox's ids: the files become
    # its root's (0600), in a directory it may search but not list. (Hard links are shared
    # read-only pages: copy_images.)
    for f in images.iterdir():
        if f.stat().st_nlink == 1:
            os.chown(f, host_uid, host_uid)
    # Except the time namespace's: CRIU's root task reads it in its new user namespace before
    # CRIU has written that namespace's uid map, when its ids are no one's there (it failed
    # with "Unable to open timens-0.img: Permission denied" whenever the task ran first, on a
    # loaded host). It holds clock offsets, nothing of the sandbox's.
    for f in images.glob("timens-*.img"):
        f.chmod(0o644)
    images.chmod(0o711)
    covers = d / "covers"
    covers.mkdir(exist_ok=True)
    maps = [
        "--ext-mount-map",
        f"{HANDOFF}:{d / HANDOFF}",
        "--ext-mount-map",
        f"{BOOT_ID_KEY}:{d / HANDOFF / BOOT_ID_FILE}",
    ]
    for key in COVERS.values():
        (covers / key).write_text("0\n")
        maps += ["--ext-mount-map", f"{key}:{covers / key}"]
    for key, view in _views(d).values():
        maps += ["--ext-mount-map", f"{key}:{view}"]
    with contextlib.suppress(FileNotFoundError):  # (images from before it was written)
        for key, root in json.loads((images / RW_BINDS).read_text()).items():
            maps += ["--ext-mount-map", f"{key}:{d / 'root'}{root}"]
    pidfile = images / "restored.pid"
    pidfile.unlink(missing_ok=True)
    criu.run(
        ["/bin/sh", "-c", JOIN_AND_EXEC, "sh", *cgroup_procs, "--",
         str(criu.path), "restore", "-D", str(images), "-d", "-o", "restore.log",
         "--root", str(d / "root"), f"--manage-cgroups={'none' if own else 'ignore'}",
         "--pidfile", str(pidfile), *COMMON, *maps],
        "restore", images / "restore.log", start_new_session=True,
    )  # fmt: skip
    return int(pidfile.read_text())


def copy_images(src: Path, dst: Path) -> None:
    """Copy a checkpoint's images for a new sandbox; read-only ones (0444: a warm template's
    memory pages, restored by many) are hard-linked instead."""
    dst.mkdir(mode=0o700)
    for f in src.iterdir():
        if f.stat().st_mode & 0o777 == 0o444:
            os.link(f, dst / f.name)
        else:
            shutil.copy2(f, dst / f.name)


COMPRESSED = ".lz4"  # a memory image kept compressed while its sandbox is suspended
_CHUNK = 1 << 20


def compress_pages(images: Path) -> None:
    """lz4-compress the memory pages of a dump in ``images`` (``pages-*.img``), each written
    under a temporary name and renamed into place before its original goes."""
    for f in images.glob("pages-*.img"):
        tmp = f.with_name(f".{f.name}{COMPRESSED}")
        with f.open("rb") as src, lz4.frame.open(tmp, "wb", compression_level=0) as dst:
            shutil.copyfileobj(src, dst, _CHUNK)
        tmp.rename(f.with_name(f.name + COMPRESSED))
        f.unlink()


def expand_pages(images: Path) -> None:
    """Undo ``compress_pages`` before a restore; a damaged file (or a full disk) is a
    CheckpointFailed that leaves the compressed image as it was."""
    for f in images.glob(f"pages-*.img{COMPRESSED}"):
        out = f.with_name(f.name.removesuffix(COMPRESSED))
        tmp = f.with_name(f".{out.name}")
        try:
            with lz4.frame.open(f, "rb") as src, tmp.open("wb") as dst:
                shutil.copyfileobj(src, dst, _CHUNK)
        except (RuntimeError, EOFError, OSError) as e:
            tmp.unlink(missing_ok=True)
            raise CheckpointFailed(f"the memory image {f.name} cannot be read back: {e}") from None
        tmp.rename(out)
        f.unlink()


def _errors(logfile: Path) -> str:
    try:
        lines = logfile.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "no log"
    errs = [ln.strip() for ln in lines if "Error" in ln and "RLIMIT_NOFILE" not in ln]
    return " | ".join(errs[-3:]) or (lines[-1] if lines else "empty log")
