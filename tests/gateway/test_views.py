"""Per-session file views: skills and references shown read-only, every file tool's path
authorized against the view (and recorded), symlinks and hard links useless for escaping it,
and policy validation that keeps views under the operator's roots."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from sandhold import audit
from tests.support.e2b_server import KEY_A
from tests.support.gateway_server import FAST_POLICY, Gateway, scratch_dir, tool


@pytest.fixture
def view_root() -> Iterator[Path]:
    root = scratch_dir("sandhold-gw-views-")
    (root / "skills" / "py").mkdir(parents=True)
    (root / "skills" / "py" / "SKILL.md").write_text("use python\n")
    (root / "refs" / "data").mkdir(parents=True)
    (root / "refs" / "data" / "input.csv").write_text("a,b\n1,2\n")
    for d in (root / "skills", root / "skills" / "py", root / "refs", root / "refs" / "data"):
        d.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def put_policy(gw: Gateway, **views: Any) -> httpx.Response:
    with gw.admin() as admin:
        return admin.put("/v1/admin/tenants/acme", json={"policy": {**FAST_POLICY, **views}})


def denied(c: httpx.Client, session: str, tool_name: str, **args: Any) -> str:
    r = c.post(f"/v1/sessions/{session}/tools/{tool_name}", json=args)
    assert r.status_code == 403, r.text
    assert r.json()["code"] == "view_denied", r.text
    return str(r.json()["message"])


def test_views_are_read_only_and_paths_are_authorized(
    make_gateway: Callable[..., Gateway], view_root: Path
) -> None:
    gw = make_gateway("local", gateway_view_roots=json.dumps([str(view_root)]))
    skill = view_root / "skills" / "py"
    r = put_policy(gw, skills={"py": str(skill)}, references={"data": str(view_root / "refs/data")})
    assert r.status_code == 200, r.text
    with gw.client() as c:
        # visible at their paths
        assert tool(c, "v", "read_file", path="/skills/py/SKILL.md")["content"] == "use python\n"
        names = [e["name"] for e in tool(c, "v", "list_files", path="/reference/data")["entries"]]
        assert names == ["input.csv"]
        # read-only: refused by the view, and by the mount for code in the sandbox
        msg = denied(c, "v", "write_file", path="/skills/py/SKILL.md", content="pwned")
        assert "writes are allowed only under" in msg and "read-only" in msg
        denied(c, "v", "upload", path="/reference/data/x", content_base64="eA==")
        out = tool(c, "v", "run_command", command="echo pwned > /skills/py/SKILL.md")
        assert out["exit_code"] != 0 and "Read-only file system" in out["stderr"]
        out = tool(c, "v", "run_command", command="touch /reference/data/new")
        assert out["exit_code"] != 0
        # '..' escaping the view, lexically resolved
        msg = denied(c, "v", "read_file", path="../../etc/passwd")
        assert "normalized: /etc/passwd" in msg and "reads are allowed under" in msg
        denied(c, "v", "download", path="/workspace/../etc/hostname")
        denied(c, "v", "list_files", path="/workspace/../../")
        denied(c, "v", "run_command", command="ls", cwd="../..")
        denied(c, "v", "write_file", path="/workspace/../skills/py/SKILL.md", content="x")
        # symlinks planted in the workspace
        tool(c, "v", "write_file", path="ok.txt", content="fine")
        links = ("ln -s /skills/py/SKILL.md l-skill && ln -s /etc/passwd l-passwd && "
                 "ln -s /etc l-etc && ln -s /skills/py l-dir")  # fmt: skip
        out = tool(c, "v", "run_command", command=links)
        assert out["exit_code"] == 0, out
        msg = denied(c, "v", "write_file", path="l-skill", content="pwned")
        assert "resolves (through a symlink) to /skills/py/SKILL.md" in msg
        denied(c, "v", "write_file", path="l-dir/new.md", content="pwned")
        denied(c, "v", "upload", path="l-etc/evil", content_base64="eA==")
        denied(c, "v", "publish_deliverable", path="l-passwd")
        out = tool(c, "v", "run_command", command="echo pwned > l-skill; echo x > l-dir/new")
        assert out["exit_code"] != 0 and "Read-only file system" in out["stderr"]
        # a hard link to a skill file cannot be made (another mount), nor written through
        out = tool(c, "v", "run_command", command="ln /skills/py/SKILL.md hard")
        assert out["exit_code"] != 0
        out = tool(c, "v", "run_command", command="test -e hard || echo absent")
        assert out["stdout"] == "absent\n"
        # allowed paths still work: workspace, /tmp, deliverables of workspace files
        assert tool(c, "v", "write_file", path="/tmp/t.txt", content="t")["size"] == 1
        d = tool(c, "v", "publish_deliverable", path="ok.txt")
        assert c.get(f"/v1/deliverables/{d['id']}").content == b"fine"
        # another session's workspace is not reachable
        host_file = gw.workspaces / "acme" / "v" / "ok.txt"
        assert host_file.read_text() == "fine"
        denied(c, "w", "read_file", path="../v/ok.txt")
        out = tool(c, "w", "run_command", command=f"ls /workspace; cat {host_file}")
        assert out["exit_code"] != 0 and "ok.txt" not in out["stdout"]
        events = c.get("/v1/sessions/v/timeline").json()["events"]
    assert (skill / "SKILL.md").read_text() == "use python\n"
    assert sorted(p.name for p in skill.iterdir()) == ["SKILL.md"]
    reasons = [e.get("reason") for e in events if e["kind"] == "tool_call"]
    assert "view: read /skills/py/SKILL.md allowed" in reasons
    assert "view: write /skills/py/SKILL.md denied" in reasons  # lexical and through the symlink
    assert "view: read /etc/passwd denied" in reasons
    assert "view: read /workspace/l-passwd allowed" not in reasons  # publish re-checked
    errors = [e.get("error", "") for e in events if e.get("reason", "").endswith("denied")]
    assert errors and all(err.startswith("view_denied: ") for err in errors)


def test_policy_validation(make_gateway: Callable[..., Gateway], view_root: Path) -> None:
    outside = scratch_dir("sandhold-gw-outside-")
    try:
        (view_root / "escape").symlink_to(outside)
        (view_root / "inner").symlink_to(view_root / "skills")
        gw = make_gateway("local", gateway_view_roots=json.dumps([str(view_root)]))
        good = str(view_root / "skills" / "py")
        cases: list[tuple[dict[str, Any], str]] = [
            ({"skills": {"x": str(outside)}}, "outside gateway_view_roots"),
            ({"skills": {"x": str(view_root / "escape")}}, "outside gateway_view_roots"),
            ({"references": {"x": f"{view_root}/skills/../../etc"}}, "must not contain '..'"),
            ({"skills": {"x": "skills/py"}}, "must be absolute"),
            ({"skills": {"x": good + "/"}}, "not normalized"),
            ({"skills": {"a/b": good}}, "name is not valid"),
            ({"skills": {"..": good}}, "name is not valid"),
            ({"skills": {"x": str(view_root / "missing")}}, "not an existing directory"),
            ({"skills": {"x": str(gw.workspaces)}}, "outside gateway_view_roots"),
            ({"skills": {"x": good}, "template": "no/such"}, "template"),
        ]
        for views, expected in cases:
            r = put_policy(gw, **views)
            assert r.status_code == 400, (views, r.text)
            assert r.json()["code"] == "invalid_argument" and expected in r.json()["message"], (
                views,
                r.text,
            )
        # a symlink that stays inside the root is fine (bound at its real path)
        r = put_policy(gw, skills={"x": str(view_root / "inner" / "py")})
        assert r.status_code == 200, r.text
        # without view roots no skills at all
        bare = make_gateway("local")
        r = put_policy(bare, references={"x": good})
        assert r.status_code == 400 and "no gateway_view_roots" in r.json()["message"]
    finally:
        shutil.rmtree(outside, ignore_errors=True)


def test_views_over_the_e2b_provider(
    make_gateway: Callable[..., Gateway], workspace_root: Path
) -> None:
    # The e2b server binds only under its host_mount_roots (the shared workspace root).
    root = workspace_root / f"views-{uuid.uuid4().hex[:8]}"
    skill = root / "s"
    skill.mkdir(parents=True)
    (skill / "a.txt").write_text("skill a\n")
    for d in (root, skill):
        d.chmod(0o755)
    try:
        gw = make_gateway("e2b", gateway_view_roots=json.dumps([str(root)]))
        assert put_policy(gw, skills={"s": str(skill)}).status_code == 200
        with gw.client() as c:
            assert tool(c, "e", "read_file", path="/skills/s/a.txt")["content"] == "skill a\n"
            out = tool(c, "e", "run_command", command="echo x > /skills/s/a.txt")
            assert out["exit_code"] != 0 and "Read-only file system" in out["stderr"]
            denied(c, "e", "write_file", path="/skills/s/a.txt", content="x")
        assert (skill / "a.txt").read_text() == "skill a\n"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_session_view_binds_the_e2b_file_api_too(
    make_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session's sandbox on a Sandhold server carries the view: the E2B file API (here the
    official SDK, as anyone holding the API key could use it) is authorized against it and every
    operation is recorded in the server's file audit with the session."""
    gw = make_gateway("e2b")
    assert gw.server is not None
    with gw.client() as c:
        tool(c, "fa", "write_file", path="/workspace/a.txt", content="from the gateway\n")
        sandbox_id = c.get("/v1/sessions/fa").json()["sandbox"]["id"]
    for name, value in (("E2B_API_URL", gw.server.url), ("E2B_SANDBOX_URL", gw.server.url),
                        ("E2B_API_KEY", KEY_A), ("NO_PROXY", "127.0.0.1,localhost")):  # fmt: skip
        monkeypatch.setenv(name, value)
    sbx = Sandbox.connect(sandbox_id)
    assert sbx.files.read("/workspace/a.txt") == "from the gateway\n"
    for attempt in (lambda: sbx.files.read("/etc/passwd"),
                    lambda: sbx.files.write("/usr/local/x", "x"),
                    lambda: sbx.files.list("/")):  # fmt: skip
        with pytest.raises(Exception, match="outside the sandbox's file view"):
            attempt()
    recs = audit.query(audit.files_dir(gw.server.data_dir), sandbox=sandbox_id)
    assert {r["session"] for r in recs} == {"fa"}
    seen = {(r["op"], r["path"], r["decision"]) for r in recs}
    expected = {("upload", "/workspace/a.txt", "allowed"),  # the gateway's own write_file
                ("download", "/workspace/a.txt", "allowed"), ("download", "/etc/passwd", "denied"),
                ("upload", "/usr/local/x", "denied"), ("ListDir", "/", "denied")}  # fmt: skip
    assert expected <= seen, seen
