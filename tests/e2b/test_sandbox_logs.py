"""A sandbox's logs through E2B's API (``GET /sandboxes/{id}/logs``, the CLI's, and ``/v2``):
its processes started and ended, what its start command printed, in E2B's shapes; filters and
directions of v2; another team's sandbox is not found. The agent's log stays bounded."""

from __future__ import annotations

import json
import os
import sys
import time

import httpx
import pytest
from e2b import Sandbox, Template, wait_for_port

from sandhold.agent import log as agent_log
from tests.support.e2b_server import KEY_B, Server

START = "for i in 1 2 3; do echo served-$i; done; exec python3 -m http.server 8000"


def v2(server: Server, sandbox_id: str, key: str | None = None, **query: object) -> httpx.Response:
    with server.api(key) if key else server.api() as api:
        return api.get(f"/v2/sandboxes/{sandbox_id}/logs", params=query)


def test_processes_and_the_start_commands_output_in_e2bs_shapes(server: Server) -> None:
    tpl = Template().from_base_image().set_start_cmd(START, wait_for_port(8000))
    Template.build(tpl, "logged", **server.sdk())
    sbx = Sandbox.create("logged", timeout=120, **server.sdk())
    try:
        pid = sbx.commands.run("echo hi", background=True).pid
        time.sleep(0.5)
        with server.api() as api:
            r = api.get(f"/sandboxes/{sbx.sandbox_id}/logs")
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"logs", "logEntries"}
        lines = [json.loads(entry["line"]) for entry in body["logs"]]  # what the CLI parses
        assert all(set(line) == {"level", "logger", "message"} for line in lines)
        messages = [line["message"] for line in lines]
        assert any(
            m.startswith(f"process {pid} started (user): /bin/bash -l -c echo hi") for m in messages
        ), messages
        assert f"process {pid} ended: exit status 0" in messages
        printed = [m for m in messages if m.startswith("start: ")]  # its service is "start"
        assert printed == [f"start: served-{i}" for i in (1, 2, 3)]
        stamps = [entry["timestamp"] for entry in body["logs"]]
        assert stamps == sorted(stamps) and stamps[0].endswith("Z")

        got = v2(server, sbx.sandbox_id, search="start: served", limit=2).json()["logs"]
        assert [e["message"] for e in got] == ["start: served-1", "start: served-2"]
        assert set(got[0]) == {"timestamp", "level", "message", "fields"}
        back = v2(server, sbx.sandbox_id, direction="backward", limit=1).json()["logs"]
        assert back[0]["message"] == messages[-1]  # the newest first
        assert v2(server, sbx.sandbox_id, level="error").json()["logs"] == []
        assert v2(server, sbx.sandbox_id, level="loud").status_code == 400
        assert v2(server, sbx.sandbox_id, KEY_B).status_code == 404  # another team's
    finally:
        sbx.kill()


def test_the_agents_log_is_bounded(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(agent_log, "INFO_MAX", 4096)
    monkeypatch.setattr(agent_log, "ALL_MAX", 8192)
    path = tmp_path / "sandbox.log"
    saved = os.dup(2)  # the agent writes on sys.stderr and measures fd 2: both the file here
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(fd, 2)
        with os.fdopen(os.dup(fd), "w") as stream:
            monkeypatch.setattr(sys, "stderr", stream)
            for i in range(200):
                agent_log.info("a chatty line %d %s", i, "x" * 40)
            agent_log.warning("a warning past the info budget")
            for i in range(400):
                agent_log.error("an error %d %s", i, "y" * 40)
            monkeypatch.undo()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)
    text = path.read_text()
    assert path.stat().st_size <= 8192 + 200
    assert "a warning past the info budget" in text
    assert 0 < text.count("a chatty line") < 200
