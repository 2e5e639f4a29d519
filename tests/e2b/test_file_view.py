"""The E2B file API authorized against the sandbox's file view and recorded in the server's
file-API audit log, driven by the official SDK (``files.*`` and signed URLs)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from sandhold import audit
from tests.support.e2b_server import Server

VIEW_KEY = "sandhold.file-view"
VIEW = {"read": ["/home/user", "/tmp"], "write": ["/home/user/out"]}


@pytest.fixture(scope="module")
def viewed(server: Server) -> Iterator[Sandbox]:
    sbx = Sandbox.create(timeout=300, metadata={VIEW_KEY: json.dumps(VIEW), "session_id": "s-42"})
    yield sbx
    sbx.kill()


def records(server: Server, sandbox_id: str, **match: str) -> list[dict[str, Any]]:
    return audit.query(audit.files_dir(server.data_dir), sandbox=sandbox_id, **match)


def refused(call: Any) -> str:
    with pytest.raises(Exception) as info:
        call()
    assert "outside the sandbox's file view" in str(info.value), info.value
    return str(info.value)


CONTENT = "CONTENT-7f3a91\n"


def test_operations_inside_the_view_work_and_are_recorded(server: Server, viewed: Sandbox) -> None:
    viewed.files.write("/home/user/out/report.txt", CONTENT)
    assert viewed.files.read("/home/user/out/report.txt") == CONTENT
    viewed.files.make_dir("/home/user/out/sub")
    viewed.files.rename("/home/user/out/report.txt", "/home/user/out/sub/report.txt")
    assert [e.name for e in viewed.files.list("/home/user/out/sub")] == ["report.txt"]
    viewed.files.remove("/home/user/out/sub/report.txt")
    recs = records(server, viewed.sandbox_id, decision="allowed")
    ops = [(r["op"], r["path"]) for r in recs]
    for expected in [("upload", "/home/user/out/report.txt"),
                     ("download", "/home/user/out/report.txt"),
                     ("MakeDir", "/home/user/out/sub"),
                     ("Move", "/home/user/out/report.txt"),
                     ("ListDir", "/home/user/out/sub"),
                     ("Remove", "/home/user/out/sub/report.txt")]:  # fmt: skip
        assert expected in ops, (expected, ops)
    move = next(r for r in recs if r["op"] == "Move")
    assert move["destination"] == "/home/user/out/sub/report.txt"
    assert all(r["session"] == "s-42" and r["team"] == "team-a" for r in recs)
    download = next(r for r in recs if r["op"] == "download")
    assert download["bytes_out"] > 0 and download["status"] == 200  # as sent (maybe gzip)
    logged = "".join(f.read_text() for f in audit.files_dir(server.data_dir).glob("*.jsonl"))
    assert "CONTENT-7f3a91" not in logged  # what was moved, never the contents


def test_operations_outside_the_view_are_refused_recorded_and_change_nothing(
    server: Server, viewed: Sandbox
) -> None:
    refused(lambda: viewed.files.read("/etc/hostname"))
    refused(lambda: viewed.files.write("/home/user/notes.txt", "x"))  # readable, not writable
    refused(lambda: viewed.files.write("/tmp/x", "x"))
    refused(lambda: viewed.files.write("/home/user/out/../escape.txt", "x"))
    refused(lambda: viewed.files.list("/"))
    refused(lambda: viewed.files.make_dir("/home/user/newdir"))
    viewed.commands.run("touch /home/user/keep.txt")
    refused(lambda: viewed.files.remove("/home/user/keep.txt"))
    viewed.files.write("/home/user/out/moveme", "m")
    refused(lambda: viewed.files.rename("/home/user/out/moveme", "/tmp/moved"))
    refused(lambda: viewed.files.watch_dir("/etc"))
    check = viewed.commands.run(
        "ls /home/user/notes.txt /tmp/x /home/user/escape.txt /home/user/newdir /tmp/moved "
        "2>&1; test -f /home/user/keep.txt && test -f /home/user/out/moveme && echo intact",
        user="root",
    )
    assert check.stdout.count("No such file") == 5 and "intact" in check.stdout, check.stdout
    # a signed URL is the same operation, refused the same way
    url = viewed.download_url("/etc/passwd", use_signature_expiration=60)
    r = httpx.get(url)
    assert r.status_code == 403 and "file view" in r.text
    denied = records(server, viewed.sandbox_id, decision="denied")
    paths = {(r["op"], r["path"]) for r in denied}
    for expected in [("download", "/etc/hostname"), ("upload", "/home/user/notes.txt"),
                     ("ListDir", "/"), ("Remove", "/home/user/keep.txt"),
                     ("Move", "/home/user/out/moveme"), ("CreateWatcher", "/etc"),
                     ("download", "/etc/passwd")]:  # fmt: skip
        assert expected in paths, (expected, paths)
    assert all("file view" in r["reason"] and r["status"] == 403 for r in denied)


def test_symlinks_planted_by_the_sandbox_do_not_widen_the_view(
    server: Server, viewed: Sandbox
) -> None:
    viewed.commands.run(
        "ln -sfn /etc /home/user/out/etc && ln -sfn /home/user/notes /home/user/out/notes",
    )
    msg = refused(lambda: viewed.files.read("/home/user/out/etc/passwd"))
    assert "resolves to /etc/passwd" in msg
    refused(lambda: viewed.files.write("/home/user/out/notes", "x"))  # lands outside /out
    assert viewed.commands.run("test -e /home/user/notes || echo absent").stdout == "absent\n"
    # the link itself is inside the view: removing it is allowed, its target is untouched
    viewed.files.remove("/home/user/out/etc")
    assert viewed.commands.run("test -f /etc/passwd && echo kept").stdout == "kept\n"


def test_the_default_view_refuses_writes_to_read_only_mounts(server: Server) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        msg = refused(lambda: sbx.files.write("/usr/bin/pwned", "x"))
        assert "read-only /usr" in msg
        assert sbx.files.read("/etc/hostname")  # the whole sandbox is readable by default
        assert records(server, sbx.sandbox_id, decision="denied")[0]["path"] == "/usr/bin/pwned"
    finally:
        sbx.kill()


@pytest.mark.parametrize(
    "value, words",
    [
        ("not json", "must be a JSON object"),
        (json.dumps({"read": ["relative"]}), "must be an absolute path"),
        (json.dumps({"write": ["/a/../b"]}), "must be normalized"),
        (json.dumps({"read": ["/"], "delete": ["/"]}), "delete"),
    ],
)
def test_a_bad_view_is_refused_and_creates_nothing(
    server: Server, api: httpx.Client, value: str, words: str
) -> None:
    before = len(server.runtime().list())
    r = api.post("/sandboxes", json={"templateID": "base", "metadata": {VIEW_KEY: value}})
    assert r.status_code == 400 and words in r.json()["message"], r.text
    assert len(server.runtime().list()) == before


def test_audit_cli_prints_the_records(server: Server, viewed: Sandbox) -> None:
    refused(lambda: viewed.files.read("/etc/shadow"))
    out = subprocess.run(
        [sys.executable, "-m", "sandhold.cli", "audit", "files", "--sandbox", viewed.sandbox_id,
         "--decision", "denied"],
        env={"SANDHOLD_DATA_DIR": str(server.data_dir), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines and lines[-1]["path"] == "/etc/shadow" and lines[-1]["decision"] == "denied"
