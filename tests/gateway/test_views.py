"""Per-session file views: every file tool's path (and run_command's cwd) is authorized against
the view and recorded in the timeline; '..' escapes, symlinks planted in the workspace and other
sessions' workspaces get nowhere."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from tests.gateway.conftest import Gateway, tool


def denied(c: httpx.Client, session: str, tool_name: str, **args: Any) -> str:
    r = c.post(f"/v1/sessions/{session}/tools/{tool_name}", json=args)
    assert r.status_code == 403, r.text
    assert r.json()["code"] == "view_denied", r.text
    return str(r.json()["message"])


def test_file_tools_are_authorized_against_the_view(make_gateway: Callable[..., Gateway]) -> None:
    gw = make_gateway("local")
    with gw.client() as c:
        # a refused first call opens no sandbox
        denied(c, "v", "read_file", path="/etc/passwd")
        assert c.get("/v1/sessions").json() == []
        tool(c, "v", "write_file", path="ok.txt", content="fine")
        # '..' escapes, lexically resolved
        msg = denied(c, "v", "read_file", path="../../etc/passwd")
        assert "normalized: /etc/passwd" in msg and "reads are allowed under" in msg
        denied(c, "v", "download", path="/workspace/../etc/hostname")
        denied(c, "v", "list_files", path="/workspace/../../")
        denied(c, "v", "run_command", command="ls", cwd="../..")
        msg = denied(c, "v", "write_file", path="/workspace/../usr/bin/evil", content="x")
        assert "writes are allowed only under /workspace, /tmp, /home/user" in msg
        denied(c, "v", "upload", path="/skills/x", content_base64="eA==")
        # symlinks planted in the workspace: re-checked as the sandbox resolves them
        links = "ln -s /etc/passwd l-passwd && ln -s /etc l-etc && ln -s /usr/bin l-bin"
        assert tool(c, "v", "run_command", command=links)["exit_code"] == 0
        msg = denied(c, "v", "write_file", path="l-etc/evil", content="pwned")
        assert "resolves (through a symlink) to /etc/evil" in msg
        denied(c, "v", "upload", path="l-bin/evil", content_base64="eA==")
        denied(c, "v", "publish_deliverable", path="l-passwd")
        denied(c, "v", "publish_deliverable", path="l-etc/hostname")
        # allowed: the workspace, /tmp, the sandbox user's home; deliverables of workspace files
        assert tool(c, "v", "write_file", path="/tmp/t.txt", content="t")["size"] == 1
        assert tool(c, "v", "read_file", path="/home/user/../../tmp/t.txt")["content"] == "t"
        assert tool(c, "v", "run_command", command="pwd", cwd="/tmp")["stdout"] == "/tmp\n"
        d = tool(c, "v", "publish_deliverable", path="ok.txt")
        assert c.get(f"/v1/deliverables/{d['id']}").content == b"fine"
        # another session's workspace is not reachable
        host_file = gw.workspaces / "acme" / "v" / "ok.txt"
        assert host_file.read_text() == "fine"
        denied(c, "w", "read_file", path="../v/ok.txt")
        out = tool(c, "w", "run_command", command=f"ls -A /workspace; cat {host_file}")
        assert out["exit_code"] != 0 and out["stdout"] == ""
        events = c.get("/v1/sessions/v/timeline").json()["events"]
    calls = [e for e in events if e["kind"] == "tool_call"]
    reasons = [e.get("reason") for e in calls]
    assert "view: read /etc/passwd denied" in reasons
    assert "view: write /workspace/ok.txt allowed" in reasons
    assert "view: write /etc/evil denied" in reasons  # through the symlink
    assert "view: read /workspace/l-passwd allowed" not in reasons  # publish re-checked
    assert "view: read /tmp allowed" in reasons  # run_command's cwd
    refused = [e for e in calls if e.get("reason", "").endswith("denied")]
    assert len(refused) == 11 and all(e["error"].startswith("view_denied: ") for e in refused)
