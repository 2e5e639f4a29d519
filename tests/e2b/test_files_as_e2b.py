"""Where the file service does what E2B's envd does rather than what a plain permission check
would (issue 31), through the official SDK as the default user:

- a write, a ``make_dir`` or a ``rename`` into directories that do not exist makes them, owned
  by the user, even under ``/`` (E2B's envd runs as root; the user could use sudo anyway); but
  never into a directory the user may not search (``/root``), nor through a link of the user's;
- ``get_info`` and ``list`` of a symlink give the target's type, with ``symlink_target``."""

from __future__ import annotations

import pytest
from e2b import FileType, Sandbox
from e2b.exceptions import SandboxException


def owner(sbx: Sandbox, *paths: str) -> list[str]:
    return sbx.commands.run(f"stat -c %U {' '.join(paths)}").stdout.split()


def test_missing_parents_are_made_and_given_to_the_user(sbx: Sandbox) -> None:
    sbx.files.write("/0/a.txt", "hi")
    assert sbx.files.read("/0/a.txt") == "hi"
    assert owner(sbx, "/0", "/0/a.txt") == ["user", "user"]

    sbx.files.make_dir("/newtop/sub/deeper")
    assert owner(sbx, "/newtop", "/newtop/sub", "/newtop/sub/deeper") == ["user"] * 3

    sbx.files.write("/home/user/moved.txt", "m")
    sbx.files.rename("/home/user/moved.txt", "/other/x/moved.txt")
    assert sbx.files.read("/other/x/moved.txt") == "m"
    assert owner(sbx, "/other", "/other/x") == ["user", "user"]


def test_never_where_the_user_may_not_search_nor_through_its_links(sbx: Sandbox) -> None:
    with pytest.raises(SandboxException, match="permission denied"):
        sbx.files.write("/root/made/x.txt", "no")
    assert "made" not in sbx.commands.run("ls /root", user="root").stdout

    sbx.commands.run("ln -sfn /etc /home/user/etc-link")
    with pytest.raises(SandboxException, match="permission denied"):
        sbx.files.write("/home/user/etc-link/planted/x.txt", "no")
    assert "planted" not in sbx.commands.run("ls /etc").stdout


def test_a_symlink_reports_its_targets_type(sbx: Sandbox) -> None:
    sbx.commands.run(
        "mkdir -p /home/user/ldir && echo x > /home/user/lfile && "
        "ln -sfn /home/user/lfile /home/user/to-file && ln -sfn /home/user/ldir /home/user/to-dir"
    )
    info = sbx.files.get_info("/home/user/to-file")
    assert (info.type, info.symlink_target) == (FileType.FILE, "/home/user/lfile")
    info = sbx.files.get_info("/home/user/to-dir")
    assert (info.type, info.symlink_target) == (FileType.DIR, "/home/user/ldir")
    listed = {e.name: e for e in sbx.files.list("/home/user")}
    assert listed["to-dir"].type == FileType.DIR
    assert listed["to-dir"].symlink_target == "/home/user/ldir"
    assert listed["lfile"].symlink_target is None
