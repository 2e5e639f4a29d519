"""Templates: the shipped `base`, imports of a root filesystem, and a real debootstrap build."""

from __future__ import annotations

import os
import stat
import urllib.request
from pathlib import Path

import pytest

from sandhold.errors import InvalidRequest
from sandhold.runtime.templates.store import debian_archive
from tests.runtime.helpers import sh

MIRROR = debian_archive()  # the machine's own, from its apt sources


def test_base_template_is_curated_and_owned_by_mapped_ids(runtime):
    t = runtime.templates.get("base")
    root = t.rootfs
    assert t.kind == "host" and ("/usr", "/usr") in t.ro_binds
    assert not (root / "etc/shadow").exists() and not (root / "etc/ssl/private").exists()
    assert (root / "etc/passwd").read_text().count("\n") == 3
    for p in (root, root / "etc", root / "etc/passwd", root / "root"):
        assert os.lstat(p).st_uid == runtime.uid_base, p
    assert os.lstat(root / "home/user").st_uid == runtime.uid_base + 1000
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            mode = os.lstat(os.path.join(dirpath, f)).st_mode
            assert not mode & (stat.S_ISUID | stat.S_ISGID), f


def test_import_of_something_that_is_not_a_rootfs_changes_nothing(runtime, tmp_path):
    before = sorted(os.listdir(runtime.templates.root))
    (tmp_path / "etc").mkdir()
    with pytest.raises(InvalidRequest, match="does not look like a root filesystem"):
        runtime.templates.build_from_rootfs("notroot", tmp_path)
    with pytest.raises(InvalidRequest, match="not valid"):
        runtime.templates.build_from_rootfs("../evil", tmp_path)
    assert sorted(os.listdir(runtime.templates.root)) == before


def _mirror_reachable() -> bool:
    try:
        urllib.request.urlopen(f"{MIRROR}/dists/bookworm/Release", timeout=10).close()
        return True
    except OSError:
        return False


async def test_debootstrap_template_runs_sandboxes(runtime, make_sandbox):
    if not _mirror_reachable():  # a host without the network, not a failure of ours
        pytest.skip(f"{MIRROR} is not reachable from this machine")
    t = runtime.templates.build_debootstrap("bookworm-min", mirror=MIRROR)
    assert t.kind == "rootfs" and t.ro_binds == []
    assert os.lstat(t.rootfs / "usr/bin/python3").st_uid == runtime.uid_base
    assert "bookworm-min" in [x.name for x in runtime.templates.list()]
    sbx = await make_sandbox(template="bookworm-min", workspace_id="deb")
    r = await sh(sbx, "cat /etc/debian_version; id -un; python3 -c 'print(1+1)'")
    assert r.text.split()[1:] == ["user", "2"]
    # Root owns this root filesystem (in its own layer): it can install into /usr...
    r = await sh(sbx, "echo 'echo tool' > /usr/local/bin/tool && chmod +x /usr/local/bin/tool"
                      " && tool", user="root")  # fmt: skip
    assert r.text.strip() == "tool"
    # ...which `user` cannot, and the template itself never changes.
    r = await sh(sbx, "touch /usr/bin/x 2>&1; echo rc=$?")
    assert "rc=1" in r.text
    assert not (t.rootfs / "usr/local/bin/tool").exists()
    make_sandbox.runtime.kill(sbx.id)
    runtime.templates.remove("bookworm-min")
    assert not Path(t.rootfs).exists()


def test_the_debian_archive_comes_from_the_machines_apt_sources(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "a.sources").write_text(
        "Types: deb\nURIs: http://archive.example/debian-security\nSuites: x-security\n\n"
        "Types: deb deb-src\nURIs: http://archive.example/debian\nSuites: x\n"
    )
    assert debian_archive(tmp_path) == "http://archive.example/debian"
    (tmp_path / "sources.list.d" / "a.sources").unlink()
    (tmp_path / "sources.list").write_text(
        "# a comment\ndeb [arch=amd64] http://archive.example/d x main\n"
    )
    assert debian_archive(tmp_path) == "http://archive.example/d"


async def test_base_has_a_python_command(make_sandbox):
    """As E2B's base: `python` is the sandbox's Python 3, for root and user alike."""
    info = await make_sandbox()
    for user in ("user", "root"):
        r = await sh(info, "python -c 'import sys; print(sys.version_info[0])'", user=user)
        assert r.text.strip() == "3", r.text


async def test_a_login_shell_sets_paths_by_uid_without_running_id(make_sandbox):
    """/etc/profile picks PATH by uid (root gets the sbin directories), from bash's $EUID: a
    login shell, which every SDK command is, runs no `id` (strace is not allowed: a PATH with
    no `id` on it proves it)."""
    info = await make_sandbox()
    for user, first in (("root", "/usr/local/sbin"), ("user", "/usr/local/bin")):
        r = await sh(info, "env -i PATH=/nowhere /bin/bash -l -c 'echo $PATH' 2>&1", user=user)
        assert r.text.startswith(first + ":") and "command not found" not in r.text, r.text
    r = await sh(info, "env -i PATH=/nowhere /bin/dash -l -c 'echo $PATH' 2>&1", user="user")
    assert "id: not found" in r.text  # (dash has no $EUID: it still asks `id`)


async def test_base_has_passwordless_sudo_confined_like_root(make_sandbox, runtime):
    """As E2B's base: `sudo` for user, without a password; root it gives is the sandbox's root,
    no one outside (no capabilities: the host's files stay out of reach)."""
    info = await make_sandbox()
    r = await sh(info, "sudo id -un; sudo -u user id -un; echo in | sudo cat; "
                 "sudo sh -c 'exit 7'; echo $?", user="user")  # fmt: skip
    assert r.text.split() == ["root", "user", "in", "7"], r.text
    r = await sh(info, "sudo touch /etc/made-by-sudo && ls -l /etc/made-by-sudo | cut -d' ' -f3; "
                 "sudo mount -t tmpfs x /mnt 2>&1; sudo grep Cap[EP] /proc/self/status",
                 user="user")  # fmt: skip
    out = r.text
    assert out.startswith("root\n") and "mount: /mnt: permission denied" in out, out
    assert "CapPrm:\t0000000000000000" in out and "CapEff:\t0000000000000000" in out, out
    # A caller gone takes its command with it.
    await sh(info, "timeout -s KILL 1 sudo sleep 300; true", user="user")
    r = await sh(info, "sleep 0.5; pgrep -x sleep || echo none")
    assert r.text.strip() == "none", r.text
