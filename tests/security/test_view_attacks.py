"""Attacks on a sandbox's file view through the E2B file API, with the sandbox's own code as the
accomplice: ``..`` games, planted symlinks, hard links onto a read-only mount, and symlinks
swapped in a loop while the client reads and writes (the check-then-open race). Each must fail:
nothing outside the view is read or written, and the host's read-only directory is untouched."""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b import Sandbox

from tests.support.e2b_server import KEY_A, Server, new_server

SECRET = "TOPSECRET-4c1d"
VIEW = {"read": ["/home/user/out", "/skills"], "write": ["/home/user/out"]}


@pytest.fixture(scope="module")
def skill_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="sandhold-view-attacks-", dir="/var/tmp"))
    root.chmod(0o755)
    (root / "skill").mkdir(mode=0o755)
    (root / "skill" / "a.txt").write_text("skill a\n")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, skill_dir: Path) -> Iterator[Server]:
    srv = new_server(tmp_path_factory.mktemp("view-attacks"),
                     host_mount_roots=json.dumps([str(skill_dir)]))  # fmt: skip
    srv.start()
    yield srv
    srv.destroy()


@pytest.fixture(scope="module")
def sbx(server: Server, skill_dir: Path) -> Iterator[Sandbox]:
    mounts = [{"hostPath": str(skill_dir / "skill"), "mountPath": "/skills/s", "readOnly": True}]
    box = Sandbox.create(
        timeout=600, api_url=server.url, sandbox_url=server.url, api_key=KEY_A,
        metadata={"sandhold.file-view": json.dumps(VIEW), "host-mount": json.dumps(mounts)},
    )  # fmt: skip
    box.commands.run(
        f"mkdir -p /home/user/out/real /home/user/other && echo -n inside > "
        f"/home/user/out/real/f.txt && echo -n {SECRET} > /home/user/other/f.txt"
    )
    yield box
    box.kill()


def refused(call: Any) -> str:
    with pytest.raises(Exception) as info:
        call()
    assert "outside the sandbox's file view" in str(info.value), info.value
    return str(info.value)


@pytest.mark.parametrize(
    "path",
    [
        "/home/user/out/../other/f.txt",
        "/home/user/out/real/../../other/f.txt",
        "out/../other/f.txt",  # relative to the user's home
        "~/out/../../user/other/f.txt",
        "/home/user/out/./real/./../../../../etc/passwd",
        "/home/user//out/../other/f.txt",
    ],
)
def test_dot_dot_paths_stay_outside(sbx: Sandbox, path: str) -> None:
    msg = refused(lambda: sbx.files.read(path))
    assert SECRET not in msg
    refused(lambda: sbx.files.write(path, "x"))
    assert sbx.commands.run("cat /home/user/other/f.txt").stdout == SECRET


def test_planted_symlinks_do_not_carry_reads_or_writes_out(sbx: Sandbox) -> None:
    sbx.commands.run(
        "cd /home/user/out && ln -sfn /home/user/other dirlink && "
        "ln -sfn ../other/f.txt filelink && ln -sfn dirlink chain && ln -sfn /etc etc"
    )
    for path in ("/home/user/out/dirlink/f.txt", "/home/user/out/filelink",
                 "/home/user/out/chain/f.txt"):  # fmt: skip
        assert SECRET not in refused(lambda p=path: sbx.files.read(p))  # type: ignore[misc]
        refused(lambda p=path: sbx.files.write(p, "overwritten"))  # type: ignore[misc]
    refused(lambda: sbx.files.write("/home/user/out/etc/evil.conf", "x"))
    refused(lambda: sbx.files.list("/home/user/out/dirlink"))
    refused(lambda: sbx.files.make_dir("/home/user/out/dirlink/new"))
    refused(lambda: sbx.files.rename("/home/user/out/real/f.txt", "/home/user/out/dirlink/g"))
    out = sbx.commands.run("cat /home/user/other/f.txt; ls /home/user/other /etc", user="root")
    assert out.stdout.startswith(SECRET) and "new" not in out.stdout, out.stdout
    assert "evil.conf" not in out.stdout and " g\n" not in out.stdout, out.stdout


def test_read_only_mount_cannot_be_written_directly_or_through_a_hard_link(
    sbx: Sandbox, skill_dir: Path
) -> None:
    assert sbx.files.read("/skills/s/a.txt") == "skill a\n"
    refused(lambda: sbx.files.write("/skills/s/a.txt", "pwned"))
    refused(lambda: sbx.files.remove("/skills/s/a.txt"))
    # A hard link into the writable part of the view cannot be made across the mount.
    ln = sbx.commands.run("ln /skills/s/a.txt /home/user/out/a.txt 2>&1; echo rc=$?", user="root")
    assert "rc=0" not in ln.stdout, ln.stdout
    # A symlink can be made, but a write through it is refused by the view and by the mount.
    sbx.commands.run("ln -sfn /skills/s/a.txt /home/user/out/skill-link")
    refused(lambda: sbx.files.write("/home/user/out/skill-link", "pwned"))
    assert (skill_dir / "skill" / "a.txt").read_text() == "skill a\n"


def _flipper(sbx: Sandbox, link: str, inside: str, outside: str) -> Any:
    """Swap ``link`` between a directory inside the view and one outside, as fast as it can."""
    script = f"while :; do ln -sfn {inside} {link}; ln -sfn {outside} {link}; done"
    return sbx.commands.run(script, background=True)


def test_racing_a_symlink_swap_never_reads_outside(sbx: Sandbox) -> None:
    flipper = _flipper(sbx, "/home/user/out/race-r", "/home/user/out/real", "/home/user/other")
    outcomes: dict[str, int] = {}
    try:

        def read_once(_: int) -> str:
            try:
                return str(sbx.files.read("/home/user/out/race-r/f.txt"))
            except Exception as e:
                return "refused" if "file view" in str(e) else f"error: {type(e).__name__}"

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for got in pool.map(read_once, range(300)):
                outcomes[got] = outcomes.get(got, 0) + 1
    finally:
        flipper.kill()
    assert SECRET not in outcomes, outcomes
    assert outcomes.get("inside", 0) + outcomes.get("refused", 0) > 0, outcomes


def test_racing_a_symlink_swap_never_writes_outside(sbx: Sandbox) -> None:
    flipper = _flipper(sbx, "/home/user/out/race-w", "/home/user/out/real", "/home/user/other")
    try:

        def write_once(i: int) -> None:
            name = "f.txt" if i % 2 else f"new-{i}.txt"
            try:
                sbx.files.write(f"/home/user/out/race-w/{name}", "overwritten")
            except Exception as e:
                assert "file view" in str(e) or "not found" in str(e).lower(), e

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            list(pool.map(write_once, range(300)))
    finally:
        flipper.kill()
    out = sbx.commands.run("cat /home/user/other/f.txt; echo; ls /home/user/other", user="root")
    assert out.stdout == f"{SECRET}\nf.txt\n", out.stdout  # untouched, nothing created there
