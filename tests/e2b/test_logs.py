"""Structured logs of a real `sandhold serve` (sandhold.logs): JSON lines under the data dir with
the request, tenant and sandbox ids, no secrets, rotation, `sandhold logs`, and a server killed
with SIGKILL that leaves its last request's line on disk."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from tests.support.e2b_server import API_KEYS, KEY_A, KEY_B, Server, new_server

CREATES = ("/sandboxes", "/v2/sandboxes")


def lines(log_dir: Path) -> list[dict[str, Any]]:
    """Every record of the server's files, oldest first (each line must be JSON)."""
    files = sorted(log_dir.glob("server.jsonl.*"), key=lambda p: -int(p.suffix[1:]))
    out = []
    for p in [*files, log_dir / "server.jsonl"]:
        out += [json.loads(line) for line in p.read_text().splitlines()]
    return out


def has_line(log_dir: Path, request_id: str) -> bool:
    try:  # (a read may meet a rotation or a line being written)
        return any(r.get("request_id") == request_id for r in lines(log_dir))
    except (OSError, ValueError):
        return False


def sandhold_logs(log_dir: Path, *args: str) -> list[dict[str, Any]]:
    r = subprocess.run([sys.executable, "-m", "sandhold.cli", "logs", "--dir", str(log_dir),
                        "--json", *args], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = new_server(tmp_path_factory.mktemp("logs"))
    srv.start()
    yield srv
    srv.destroy()


def test_requests_are_logged_with_their_ids_and_no_secrets(logged: Server) -> None:
    srv = logged
    sbx = Sandbox.create(timeout=300, api_url=srv.url, sandbox_url=srv.url, api_key=KEY_A)
    try:
        assert sbx.commands.run("echo hi").stdout == "hi\n"
        token = sbx._envd_access_token or ""
        traffic = sbx.traffic_access_token or ""
        assert token and traffic
        seen: dict[str, str] = {}  # request id -> what it was
        with srv.api() as api:
            r = api.get("/v2/sandboxes", params={"state": "running"})
            seen[r.headers["x-request-id"]] = "list"
            r = api.get(f"/sandboxes/{sbx.sandbox_id}", headers={"X-Request-Id": "op-req.42"})
            assert r.headers["x-request-id"] == "op-req.42"  # a sane incoming id is kept
            seen["op-req.42"] = "info"
            insane = "not sane;" * 20
            r = api.get("/v2/sandboxes", headers={"X-Request-Id": insane})
            assert r.headers["x-request-id"] != insane  # replaced by one of ours
            seen[r.headers["x-request-id"]] = "list"
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            envd = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": token}
            r = c.post("/filesystem.Filesystem/Stat", json={"path": "/home/user"},
                       headers={**envd, "Connect-Protocol-Version": "1"})  # fmt: skip
            assert r.status_code == 200, r.text
            seen[r.headers["x-request-id"]] = "envd"
            port = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000",
                    "E2B-Traffic-Access-Token": traffic}  # fmt: skip
            r = c.get("/nothing/listens", headers=port)
            assert r.status_code == 502
            seen[r.headers["x-request-id"]] = "port"
        sbx.files.write("/tmp/signed.txt", "signed")
        url = sbx.download_url("/tmp/signed.txt", use_signature_expiration=60)
        signature = httpx.URL(url).params["signature"]
        r = httpx.get(url)
        assert r.content == b"signed"
        seen[r.headers["x-request-id"]] = "signed"
    finally:
        sbx.kill()

    log_dir = srv.data_dir / "logs"
    path = log_dir / "server.jsonl"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    records = lines(log_dir)
    requests = [r for r in records if r["logger"] == "sandhold.request"]
    by_id = {r["request_id"]: r for r in requests}
    assert set(seen) <= set(by_id), set(seen) - set(by_id)
    for rid, what in seen.items():
        rec = by_id[rid]
        assert rec["path"] in rec["message"] and isinstance(rec["duration_ms"], float)
        if what == "list":
            assert rec["tenant"] == "team-a" and "sandbox" not in rec, rec
        elif what == "signed":  # it names no sandbox (the data plane finds it by signature)
            assert rec["status"] == 200 and rec["path"] == "/files", rec
        else:  # every other request for the sandbox names it and its owner
            assert (rec["tenant"], rec["sandbox"]) == ("team-a", sbx.sandbox_id), rec
    assert by_id["op-req.42"]["path"] == f"/sandboxes/{sbx.sandbox_id}"
    assert by_id["op-req.42"]["status"] == 200
    create = next(r for r in requests if r["method"] == "POST" and r["path"] in CREATES)
    assert (create["sandbox"], create["tenant"], create["status"]) == (
        sbx.sandbox_id, "team-a", 201
    )  # fmt: skip
    runs = [r for r in requests if r["path"] == "/process.Process/Start"]
    assert runs and all(r["sandbox"] == sbx.sandbox_id and r["tenant"] == "team-a" for r in runs)
    assert all(r["ts"].endswith("Z") and len(r["ts"]) == 24 for r in records)

    # No secret anywhere: API keys, access and traffic tokens, signatures, query strings.
    everything = "".join(p.read_text() for p in log_dir.iterdir()) + srv.log.read_text()
    secrets = (KEY_A, KEY_B, token, traffic, signature, "signature=", "state=running", "sane;")
    for secret in secrets:
        assert secret not in everything, secret

    # `sandhold logs --sandbox`: that sandbox's lines only.
    mine = sandhold_logs(log_dir, "--sandbox", sbx.sandbox_id)
    assert len(mine) >= len(runs) + 3
    assert all(r["sandbox"] == sbx.sandbox_id for r in mine)
    assert sandhold_logs(log_dir, "--request", "op-req.42") == [by_id["op-req.42"]]
    assert sandhold_logs(log_dir, "--tenant", "team-b") == []


def test_since_and_until(logged: Server) -> None:
    log_dir = logged.data_dir / "logs"
    with logged.api(KEY_B) as api:
        for _ in range(3):
            api.get("/v2/sandboxes")
    everything = sandhold_logs(log_dir)
    assert everything == lines(log_dir)
    stamps = sorted({r["ts"] for r in everything})
    middle = stamps[len(stamps) // 2]
    later = sandhold_logs(log_dir, "--since", middle)
    assert later and all(r["ts"] >= middle for r in later)
    assert len(later) == sum(r["ts"] >= middle for r in everything) < len(everything)
    earlier = sandhold_logs(log_dir, "--until", middle)
    assert all(r["ts"] <= middle for r in earlier)
    assert len(earlier) + len(later) - sum(r["ts"] == middle for r in everything) == len(everything)
    assert sandhold_logs(log_dir, "--since", "1d") == everything
    assert sandhold_logs(log_dir, "--since", "2999-01-01T00:00:00") == []
    team_b = sandhold_logs(log_dir, "--tenant", "team-b", "--since", "1h", "--limit", "2")
    assert len(team_b) == 2 and all(r["tenant"] == "team-b" for r in team_b)
    assert team_b == [r for r in everything if r.get("tenant") == "team-b"][-2:]


def test_rotation_and_a_killed_server_keeps_its_last_line(tmp_path: Path) -> None:
    srv = new_server(tmp_path, log_max_bytes="2048", log_backup_count="2",
                     log_stderr_format="json")  # fmt: skip
    srv.start()
    log_dir = srv.data_dir / "logs"
    try:
        with srv.api() as api:
            for i in range(60):
                api.get(f"/sandboxes/rot{i}")
            last = api.get("/sandboxes/thelastone")
        rid = last.headers["x-request-id"]
        # The line is written just after the response's last bytes: it must reach the file
        # while the server runs (a buffered line would not), then the kill loses nothing.
        deadline = time.monotonic() + 30
        while not has_line(log_dir, rid):
            assert time.monotonic() < deadline, "the last request's line never reached the file"
            time.sleep(0.05)
        assert srv.proc is not None
        os.kill(srv.proc.pid, signal.SIGKILL)  # no shutdown, no flush at exit
        srv.proc.wait()
        srv.proc = None
        names = sorted(p.name for p in log_dir.iterdir())
        assert names == ["server.jsonl", "server.jsonl.1", "server.jsonl.2"]
        assert all(p.stat().st_size <= 2048 for p in log_dir.iterdir())
        records = lines(log_dir)
        assert records[-1]["request_id"] == rid and records[-1]["path"] == "/sandboxes/thelastone"
        assert "rot0" not in json.dumps(records)  # rotated out: only backup_count files kept
        assert sandhold_logs(log_dir) == records  # across the files, in order
        # stderr had the same JSON lines
        assert any(
            rid in line and line.startswith("{") for line in srv.log.read_text().splitlines()
        )
        # a line torn by a crash (or anything else malformed) is skipped and counted
        with open(log_dir / "server.jsonl", "a") as f:
            f.write('{"ts": "2030-01-01T00:00:00.000Z", "level": "INF\n')
        r = subprocess.run([sys.executable, "-m", "sandhold.cli", "logs", "--dir", str(log_dir),
                            "--grep", "thelastone"], capture_output=True, text=True,
                           timeout=60)  # fmt: skip
        assert r.returncode == 0 and "thelastone" in r.stdout
        assert "1 malformed line(s) skipped" in r.stderr
    finally:
        srv.destroy()


assert API_KEYS[KEY_A] == "team-a" and API_KEYS[KEY_B] == "team-b"
