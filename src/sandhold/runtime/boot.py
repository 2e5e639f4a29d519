"""Booting a sandbox's process tree over a prepared root (assembly.prepare_root): its binds (the
workspace and writable mounts through idmapped views, operator mounts, egress), the agent's
configuration, bwrap, and the wait for the agent. A create boots once; a sandbox paused without
its memory (a filesystem-only pause) boots again over the same root on resume."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from sandhold.agent.libc import CAPS
from sandhold.egress.control import agent_config as egress_agent_config
from sandhold.egress.control import sandbox_env as egress_sandbox_env
from sandhold.envd import ENVD_VERSION
from sandhold.errors import Unavailable
from sandhold.runtime import disk, images, mounts
from sandhold.runtime.assembly import prepare_workspace
from sandhold.runtime.host import Host
from sandhold.runtime.launcher import (
    BOOT_ID_FILE,
    HANDOFF,
    IDENTITY_FILE,
    Launch,
    new_boot,
    spawn,
)
from sandhold.runtime.reaping import wait_ready
from sandhold.runtime.records import SandboxInfo, session_of
from sandhold.runtime.spec import SandboxSpec
from sandhold.runtime.templates.store import Template
from sandhold.runtime.uids import VIEW_LIST


def agent_config(
    spec: SandboxSpec, template: Template, env: dict[str, str], binds: list[tuple[str, str, bool]]
) -> dict[str, object]:
    """The agent's configuration (``run/agent.json``) for a sandbox of ``spec``; a warm start
    hands it to the agent restored from the template's checkpoint (warm.py)."""
    return {
        "socket": "/run/sandhold/agent.sock",
        "default_user": spec.user or template.user,
        "default_workdir": spec.workdir or template.workdir,
        "env": env,
        "envd_version": ENVD_VERSION,
        "services": template.services,
        "root_caps": [CAPS[c] for c in template.root_caps],
        "file_view": {
            **spec.file_view.model_dump(),
            "read_only": [dst for _src, dst, ro in binds if ro]
            + [dst for _src, dst in template.ro_binds],
        },
    }


def prepare_binds(
    host: Host, d: Path, spec: SandboxSpec, host_uid: int
) -> tuple[list[tuple[str, str, bool]], Path | None, SandboxSpec]:
    """What the sandbox in ``d`` binds from the host, made ready in this order (a checkpoint
    names the views by it): the workspace, writable mounts through idmapped views, egress.
    Returns the binds, the workspace and the spec with the workspace's budget filled in."""
    workspace = None
    binds: list[tuple[str, str, bool]] = []
    if spec.workspace_id or spec.workspace_dir:
        workspace = prepare_workspace(host, spec.workspace_id, spec.workspace_dir)
        # With a budget: the workspace's image, mounted under d (its own filesystem).
        files, ws_mb = host.wsdisk.attach(d, workspace, spec.workspace_disk_mb)
        spec = spec.model_copy(update={"workspace_disk_mb": ws_mb})
        view = host.uids.writable(d, files, host_uid, "/workspace")
        binds.append((str(view), "/workspace", False))
    for m in spec.mounts:
        source = m.source
        if not m.read_only:
            source = host.uids.writable(d, m.source, host_uid, m.target)
        binds.append((str(source), m.target, m.read_only))
    if spec.network.mode != "none":
        net, session = spec.network, session_of(spec.metadata)
        binds += host.egress.prepare(d, net, net.tenant, session, net.header_rules)
        host.egress.sync()  # the sandbox's socket listens before the sandbox starts
    return binds, workspace, spec


REATTACH_WAIT_S = 10.0  # for the loop device of a layer let go at suspend to detach or mount


def remount(host: Host, d: Path, info: SandboxInfo, binds: bool) -> None:
    """After a host reboot: mount again what a paused sandbox's directory had mounted (its
    layer's image, its root's overlay, its handoff tmpfs and, with ``binds``, the views of what
    it binds); what is still mounted is left as it is."""
    assert info.host_uid is not None
    if info.spec.limits.disk_mb is not None and not mounts.is_mountpoint(d / disk.MOUNT):
        image = (d / disk.MOUNT, d / disk.DEVICE, d / disk.IMAGE)
        if not images.mount_again(
            *image, b"ext4", images.MOUNT_FLAGS, disk.MOUNT_OPTS, REATTACH_WAIT_S
        ):
            raise Unavailable(f"sandbox {info.id}'s layer is still attached; try again")
    if not mounts.is_mountpoint(d / "root"):
        layer = d / disk.MOUNT if info.spec.limits.disk_mb is not None else d
        template = host.templates.get(info.template)
        with host.uids.lower(template.lowers(), info.host_uid, d) as lower:
            mounts.mount_overlay(lower, layer / "upper", layer / "work", d / "root")
    if not mounts.is_mountpoint(d / HANDOFF):
        mounts.mount_tmpfs(d / HANDOFF, 64 << 10, 0o755)
        if not _restore_handoff(d):  # the host rebooted: so did it
            new_boot(d / HANDOFF, info.id, info.template)
    views = [line.split("\t")[1] for line in _lines(d / VIEW_LIST)]
    if binds and not all(mounts.is_mountpoint(Path(v)) for v in views):
        host.uids.give_back(d)
        host.wsdisk.release(d)
        prepare_binds(host, d, info.spec, info.host_uid)


SAVED_HANDOFF = "handoff.json"  # its boot files, while a suspended sandbox's tmpfs is let go
HOST_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def save_handoff(d: Path) -> None:
    """Keep the handoff tmpfs's files (the sandbox's boot id and identity) for ``remount``,
    with the host's boot: the sandbox has not rebooted until the host has."""
    files = {
        f.name: f.read_text()
        for f in (d / HANDOFF).iterdir()
        if f.is_file() and f.name in (BOOT_ID_FILE, IDENTITY_FILE)
    }
    tmp = d / f".{SAVED_HANDOFF}"
    tmp.write_text(json.dumps({"host_boot": HOST_BOOT_ID.read_text(), "files": files}))
    tmp.rename(d / SAVED_HANDOFF)


def _restore_handoff(d: Path) -> bool:
    try:
        saved = json.loads((d / SAVED_HANDOFF).read_text())
    except FileNotFoundError:
        return False
    (d / SAVED_HANDOFF).unlink()
    if saved["host_boot"] != HOST_BOOT_ID.read_text():
        return False
    for name, text in saved["files"].items():
        (d / HANDOFF / name).write_text(text)
        (d / HANDOFF / name).chmod(0o444)
    return True


def _lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text().splitlines() if line]
    except FileNotFoundError:
        return []


def boot(
    host: Host, d: Path, spec: SandboxSpec, template: Template, host_uid: int
) -> tuple[subprocess.Popen[bytes], int, Path | None, SandboxSpec]:
    """Start the sandbox in ``d``; returns bwrap's Popen, the agent's host pid, the workspace
    and the spec as it was carried out (the workspace's budget filled in). On failure nothing
    of the tree is left running; the caller removes the rest."""
    ready_r, ready_w = os.pipe()
    proc: subprocess.Popen[bytes] | None = None
    try:
        root, run_dir = d / "root", d / "run"
        binds, workspace, spec = prepare_binds(host, d, spec, host_uid)
        egress_env: dict[str, str] = {}
        egress_agent: dict[str, object] | None = None
        if spec.network.mode != "none":
            egress_env, egress_agent = egress_sandbox_env(), egress_agent_config()
        env = {**template.env, **egress_env, **spec.env}
        agent_cfg = agent_config(spec, template, env, binds)
        agent_cfg.update(ready_fd=ready_w, egress=egress_agent)
        (run_dir / "agent.json").write_text(json.dumps(agent_cfg))
        new_boot(d / HANDOFF, d.name, template.name)
        launch = Launch(
            root=root,
            ro_binds=template.ro_binds,
            binds=binds,
            run_dir=run_dir,
            agent_lib=host.agent_lib.path(),
            memory_mb=spec.limits.memory_mb,
            handoff=d / HANDOFF,
            root_caps=template.root_caps,
            agent_kit=template.agent_kit,
            rw_dirs=template.rw_dirs,
            env={"PATH": env.get("PATH", "/usr/bin:/bin"), "HOME": "/root", "LANG": "C.UTF-8"},
        )
        proc, init_pid = spawn(launch, host.cgroup(d.name), host_uid, ready_w, d / "sandbox.log")
        os.close(ready_w)
        ready_w = -1
        wait_ready(ready_r, host.settings.ready_timeout_s, d / "sandbox.log")
        return proc, init_pid, workspace, spec
    except BaseException:
        if proc is not None:
            host.cgroup(d.name).kill_all()
            proc.wait()
        raise
    finally:
        os.close(ready_r)
        if ready_w >= 0:
            os.close(ready_w)
