"""Each built-in tool of a session served by one `sandhold worker`: a scripted brain on the
stand-in control plane sends tool uses; the tools run in the session's real sandbox through a
real gateway; every result is checked, errors included (is_error results, never a crash)."""

from __future__ import annotations

from collections.abc import Callable

from tests.support.gateway_server import TENANT_KEY, Gateway, wait_for
from tests.support.worker import Worker, sandbox_of, text_of, workspace
from tests.worker.control_plane import ControlPlane


def ok(result: dict[str, object]) -> str:
    assert result["is_error"] is False, result
    return text_of(result)


def failed(result: dict[str, object]) -> str:
    assert result["is_error"] is True, result
    return text_of(result)


def test_built_in_tools_in_the_sessions_sandbox(
    gateway: Gateway, control_plane: ControlPlane, start_worker: Callable[..., Worker]
) -> None:
    cp = control_plane
    sid = cp.create_session(custom_tools=["lookup_order"])
    start_worker("w1")

    # bash: one persistent shell: cwd, exported variables and functions survive between calls
    assert ok(cp.call(sid, "bash", command="pwd")) == "/workspace"
    # the worker's credentials never reach the sandbox: it gets commands, not the worker's env
    sandbox_env = ok(cp.call(sid, "bash", command="env; cat /proc/1/environ | tr '\\0' '\\n'"))
    assert cp.environment_key not in sandbox_env and TENANT_KEY not in sandbox_env
    assert "ANTHROPIC_" not in sandbox_env
    ok(cp.call(sid, "bash", command="mkdir -p /tmp/proj/src && cd /tmp/proj && export STAGE=two"))
    ok(cp.call(sid, "bash", command='greet() { echo "hello $1"; }; LOCAL_ONLY=1'))
    assert ok(cp.call(sid, "bash", command='echo "$PWD $STAGE"; greet you')) == (
        "/tmp/proj two\nhello you"
    )
    # `exit` and `unset` are a shell's too; stderr is merged into the output
    out = failed(cp.call(sid, "bash", command="cd src; unset STAGE; echo to-stderr >&2; exit 3"))
    assert out == "to-stderr"
    assert (
        ok(cp.call(sid, "bash", command='echo "$PWD [${STAGE-unset}]"')) == "/tmp/proj/src [unset]"
    )
    timed_out = failed(cp.call(sid, "bash", command="sleep 30", timeout_ms=1000))
    assert "timed out after 1s" in timed_out
    assert "command is required" in failed(cp.call(sid, "bash"))
    assert ok(cp.call(sid, "bash", restart=True)) == "bash session restarted"
    assert ok(cp.call(sid, "bash", command="pwd; echo ${STAGE-gone}")) == "/workspace\ngone"

    # write then read, through the gateway's file tools (relative paths are under /workspace)
    assert ok(cp.call(sid, "write", file_path="notes/plan.txt", content="one\ntwo\nthree\n")) == (
        "wrote 14 bytes to notes/plan.txt"
    )
    assert (workspace(gateway, sid) / "notes/plan.txt").read_text() == "one\ntwo\nthree\n"
    assert ok(cp.call(sid, "read", file_path="/workspace/notes/plan.txt")) == "one\ntwo\nthree\n"
    assert ok(cp.call(sid, "read", file_path="notes/plan.txt", view_range=[2, 3])) == "two\nthree"
    assert "does not exist" in failed(cp.call(sid, "read", file_path="missing.txt"))
    outside = "outside the session's file view"
    assert outside in failed(cp.call(sid, "read", file_path="/etc/passwd"))
    assert outside in failed(cp.call(sid, "write", file_path="/etc/evil", content="x"))
    ok(cp.call(sid, "bash", command="printf '\\x00\\xff' > blob.bin"))
    assert "not valid UTF-8" in failed(cp.call(sid, "read", file_path="blob.bin"))
    assert "Invalid arguments" in failed(cp.call(sid, "read"))
    # an image comes back as an image block; a text file over 256 KiB only by view_range
    ok(cp.call(sid, "bash", command="printf '\\x89PNG\\r\\n\\x1a\\n' > dot.png"))
    image = cp.call(sid, "read", file_path="dot.png")
    assert image["is_error"] is False and image["content"] == [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]  # fmt: skip
    ok(cp.call(sid, "bash", command="yes line | head -n 60000 > big.txt"))
    assert "Use the view_range parameter" in failed(cp.call(sid, "read", file_path="big.txt"))
    assert ok(cp.call(sid, "read", file_path="big.txt", view_range=[59999, 0])) == "line\nline\n"

    # edit: a unique match, none, several, all of them
    assert ok(cp.call(sid, "edit", file_path="notes/plan.txt", old_string="two",
                      new_string="2")) == "edited notes/plan.txt (1 replacement(s))"  # fmt: skip
    assert "not found" in failed(
        cp.call(sid, "edit", file_path="notes/plan.txt", old_string="four", new_string="4")
    )
    ok(cp.call(sid, "write", file_path="rep.txt", content="a a a"))
    assert "appears 3 times" in failed(
        cp.call(sid, "edit", file_path="rep.txt", old_string="a", new_string="b")
    )
    ok(cp.call(sid, "edit", file_path="rep.txt", old_string="a", new_string="b", replace_all=True))
    assert (workspace(gateway, sid) / "rep.txt").read_text() == "b b b"
    assert ok(cp.call(sid, "read", file_path="notes/plan.txt")) == "one\n2\nthree\n"

    # glob, inside the sandbox: newest first, confined to its root
    ok(cp.call(sid, "bash", command="mkdir -p src/pkg && touch -d '1 hour ago' src/a.py && "
               "touch src/pkg/b.py src/c.txt && ln -s /etc src/etc-link"))  # fmt: skip
    assert ok(cp.call(sid, "glob", pattern="**/*.py")).split("\n") == [
        "/workspace/src/pkg/b.py", "/workspace/src/a.py",
    ]  # fmt: skip
    assert ok(cp.call(sid, "glob", pattern="*.txt", path="src")) == "/workspace/src/c.txt"
    assert ok(cp.call(sid, "glob", pattern="etc-link/*", path="src")) == "no matches"
    assert ok(cp.call(sid, "glob", pattern="*.rs")) == "no matches"
    assert "'..' is not permitted" in failed(cp.call(sid, "glob", pattern="../*"))
    assert "absolute pattern" in failed(cp.call(sid, "glob", pattern="/etc/*"))
    assert "outside the session's file view" in failed(
        cp.call(sid, "glob", pattern="*", path="/etc")
    )

    # grep, inside the sandbox: path:line:text
    ok(
        cp.call(
            sid, "write", file_path="src/pkg/b.py", content="import os\n\ndef main():\n    pass\n"
        )
    )
    assert ok(cp.call(sid, "grep", pattern=r"def \w+\(")) == "/workspace/src/pkg/b.py:3:def main():"
    assert ok(cp.call(sid, "grep", pattern="^import", path="src/pkg/b.py")) == (
        "/workspace/src/pkg/b.py:1:import os"
    )
    assert ok(cp.call(sid, "grep", pattern="no-such-text")) == "no matches"
    assert "invalid regex" in failed(cp.call(sid, "grep", pattern="(unclosed"))
    assert outside in failed(cp.call(sid, "grep", pattern="root", path="src/etc-link"))

    # a custom tool of the agent: answered with an error result (no handler on this worker)
    custom = cp.call(sid, "lookup_order", custom=True, order="A-1")
    assert custom["type"] == "user.custom_tool_result"
    assert "has no handler" in failed(custom)

    # one sandbox served all of it, and the item was held by this worker's lease
    assert sandbox_of(gateway, sid) is not None
    item = cp.item_of(sid)
    assert item.state == "active" and item.last_heartbeat is not None
    assert ("acked", "w1") in item.log
    # the turn ends: the worker stops the item after its max idle (1 s) and polls again
    cp.end_turn(sid)
    wait_for(lambda: cp.item_of(sid).state == "stopped", timeout=30)
    assert ("stopped", "w1") in cp.item_of(sid).log
