"""An imported root filesystem (runtime/templates/rootfs_owners.py through
TemplateStore.build_from_rootfs)
on real directories: its owners become the sandbox's, nothing privileged stays (setuid and setgid
bits, file capabilities, device nodes, host ids past 65,535), no link of it is followed to the
host, and with refuse_privileged such a root is refused leaving nothing behind."""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

import pytest

from sandhold.errors import InvalidRequest
from sandhold.runtime.templates.store import TemplateStore

BASE = 100_000
CAP_NET_RAW = struct.pack("<5I", 0x02000001, 1 << 13, 0, 0, 0)


def hostile_root(d: Path, host_file: Path) -> Path:
    root = d / "root"
    (root / "usr/bin").mkdir(parents=True)
    (root / "dev").mkdir()
    escalate = root / "usr/bin/escalate"
    escalate.write_bytes(b"\x7fELF")
    escalate.chmod(0o4755)
    hostid = root / "usr/bin/hostid"
    hostid.write_text("#!/bin/sh\n")
    os.chown(hostid, 70000, 70000)
    hostid.chmod(0o2755)
    capped = root / "usr/bin/capped"
    capped.write_text("#!/bin/sh\n")
    os.setxattr(capped, "security.capability", CAP_NET_RAW)
    os.mknod(root / "dev/mem", stat.S_IFCHR | 0o600, os.makedev(1, 1))
    (root / "usr/bin/host").symlink_to(host_file)  # (its owner changes, never the host file's)
    return root


@pytest.fixture
def host_file(tmp_path: Path) -> Path:
    f = tmp_path / "host-owned"
    f.write_text("host\n")
    os.chown(f, 4321, 4321)
    f.chmod(0o4755)
    return f


def test_nothing_privileged_stays_and_owners_are_the_sandboxs(
    tmp_path: Path, host_file: Path
) -> None:
    store = TemplateStore(tmp_path / "templates", BASE)
    tpl = store.build_from_rootfs(
        "img", hostile_root(tmp_path, host_file), copy=False, agent_kit=True
    )
    root = tpl.rootfs
    for name in ("escalate", "hostid", "capped"):
        st = (root / "usr/bin" / name).lstat()
        assert not st.st_mode & 0o6000, name
        assert not os.listxattr(root / "usr/bin" / name), name
    assert (root / "usr/bin/hostid").lstat().st_uid == BASE + 65534
    assert (root / "usr/bin/escalate").lstat().st_uid == BASE
    assert (root / "usr/bin/host").lstat().st_uid == BASE
    assert not (root / "dev/mem").exists()
    st = host_file.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (4321, 0o4755)


def test_refuse_privileged_refuses_the_root_and_leaves_nothing(
    tmp_path: Path, host_file: Path
) -> None:
    store = TemplateStore(tmp_path / "templates", BASE)
    with pytest.raises(InvalidRequest, match="template_image_privileged=refuse"):
        store.build_from_rootfs(
            "img",
            hostile_root(tmp_path, host_file),
            copy=False,
            agent_kit=True,
            refuse_privileged=True,
        )
    assert not store.exists("img")
    assert [p.name for p in store.root.iterdir() if p.name.startswith(".build-")] == []
