"""Attacks on `sandhold worker` from the two sides it does not trust: the model's tool inputs
and the code in the sandbox (which may replace the sandbox's own programs and rewrite the
persistent shell's state), and a control plane that names the wrong session in a session's
body. Each must stay inside the work item's own session and its sandbox, with bounded
results and no credential in reach."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.gateway_server import TENANT_KEY, Gateway, wait_for
from tests.support.worker import Worker, text_of, workspace
from tests.worker.control_plane import ControlPlane

POSTED_LIMIT = 100 * 1024 + 200  # what any one result may carry back, and its notice


def ok(result: dict[str, object]) -> str:
    assert result["is_error"] is False, text_of(result)[:500]
    return text_of(result)


def failed(result: dict[str, object]) -> str:
    assert result["is_error"] is True, result
    return text_of(result)


def test_tool_inputs_and_sandbox_code_stay_in_their_session(
    gateway: Gateway, control_plane: ControlPlane, start_worker: Callable[..., Worker]
) -> None:
    cp = control_plane
    mine, other = cp.create_session(), cp.create_session()
    start_worker("h1"), start_worker("h2")
    ok(cp.call(other, "write", file_path="other.txt", content="other's"))
    ok(cp.call(mine, "bash", command="touch here-i-am"))
    assert (workspace(gateway, mine) / "here-i-am").exists()
    assert not (workspace(gateway, other) / "here-i-am").exists()
    assert "does not exist" in failed(cp.call(mine, "read", file_path="other.txt"))

    # glob/grep inputs reach the sandbox as data, never as shell
    for pattern in ("$(touch /tmp/pwned)*", "'; touch /tmp/pwned; '", "`touch /tmp/pwned`"):
        assert ok(cp.call(mine, "glob", pattern=pattern)) == "no matches"
        assert ok(cp.call(mine, "grep", pattern=pattern)) == "no matches"
    for path in ("$(touch /tmp/pwned)", "x'; touch /tmp/pwned; '"):
        assert "No such file" in failed(cp.call(mine, "glob", pattern="*", path=path))
    assert ok(cp.call(mine, "bash", command="ls /tmp/pwned 2>&1 || echo absent")).endswith("absent")

    # no credential of the worker is anywhere the sandbox can read: any process's argv or
    # environment, or a file under the session's view
    secrets = [cp.environment_key, cp.item_of(mine).sessions_token, TENANT_KEY]
    seen = ok(cp.call(mine, "bash", command=(
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; tr '\\0' ' ' < $p/environ; "
        "done 2>/dev/null; grep -rIl . /workspace /tmp /home 2>/dev/null | xargs cat 2>/dev/null"
    )))  # fmt: skip
    assert seen and not any(s in seen for s in secrets)

    # the sandbox's code replaces python3 (what glob and grep run): what comes back is bounded
    ok(cp.call(mine, "bash", command=(
        "mkdir -p ~/bin && printf '#!/bin/sh\\nhead -c 3000000 /dev/zero | tr \"\\\\\\\\0\" a\\n"
        "[ \"$SANDHOLD_SEARCH\" = grep ] && exit 2\\nexit 0\\n' > ~/bin/python3 && "
        "chmod +x ~/bin/python3 && echo 'export PATH=$HOME/bin:$PATH' >> ~/.bash_profile"
    )))  # fmt: skip
    flooded = ok(cp.call(mine, "glob", pattern="*"))
    assert flooded.startswith("aaaa") and len(flooded.encode()) <= POSTED_LIMIT
    assert flooded.endswith("bytes]")
    flood_error = failed(cp.call(mine, "grep", pattern="x"))
    assert len(flood_error.encode()) <= POSTED_LIMIT
    ok(cp.call(mine, "bash", command="rm ~/bin/python3 ~/.bash_profile"))

    # the persistent shell's state is the session's to change, and only its own
    marker = f"evil-{uuid.uuid4().hex[:8]}"
    # (planted by a background process, after the call's own state was saved)
    plant = f"echo 'evil() {{ touch /tmp/{marker}; echo ran; }}' >> /tmp/.sandhold-shell/functions"
    ok(cp.call(mine, "bash", command=f"(sleep 0.3; {plant}; touch planted) >/dev/null 2>&1 &"))
    wait_for(lambda: (workspace(gateway, mine) / "planted").exists())
    assert ok(cp.call(mine, "bash", command="evil")) == "ran"  # its own session: allowed
    assert "not found" in failed(cp.call(other, "bash", command="evil"))
    assert ok(cp.call(other, "bash", command=f"ls /tmp/{marker} 2>&1 || echo absent")).endswith(
        "absent"
    )
    assert not Path(f"/tmp/{marker}").exists()  # nor on the worker's host


def test_an_item_whose_session_body_names_another_session_is_refused(
    gateway: Gateway, control_plane: ControlPlane, start_worker: Callable[..., Worker]
) -> None:
    """The SDK serves the events of the session the control plane's body names, and the tools
    run in the item's session's sandbox: a body naming another session would run that
    session's calls in this one's sandbox. The worker stops such an item instead."""
    cp = control_plane
    mine, other = cp.create_session(), cp.create_session()
    cp.misreported[mine] = other
    w = start_worker("h3")
    pending = cp.tool_use(mine, "bash", command="touch here-i-am")
    wait_for(lambda: cp.item_of(mine).state == "stopped", timeout=30)
    assert "names" in w.output() and "refused" in w.output()
    assert not (workspace(gateway, mine) / "here-i-am").exists()
    assert not (workspace(gateway, other) / "here-i-am").exists()
    with pytest.raises(AssertionError, match="no result"):  # no worker ran it
        cp.result(mine, pending, timeout=2)
