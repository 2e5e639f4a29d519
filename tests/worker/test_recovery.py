"""Several `sandhold worker` processes on one environment: each work item goes to one of them;
a worker killed mid-item (SIGKILL) is replaced and its session continues in the same sandbox,
with its files and its shell; a worker whose lease was taken over (412) drops the item; SIGTERM
lets the tool call in flight finish and releases the item to another worker."""

from __future__ import annotations

import signal
from collections.abc import Callable

from tests.support.gateway_server import Gateway, wait_for
from tests.support.worker import Worker, sandbox_of, text_of, workspace
from tests.worker.control_plane import ControlPlane


def acked_by(cp: ControlPlane, session_id: str) -> list[str | None]:
    return [who for what, who in cp.item_of(session_id).log if what == "acked"]


def ok(result: dict[str, object]) -> str:
    assert result["is_error"] is False, result
    return text_of(result)


def test_two_workers_share_the_environment(
    control_plane: ControlPlane, start_worker: Callable[..., Worker]
) -> None:
    cp = control_plane
    first, second = cp.create_session(), cp.create_session()
    start_worker("w1"), start_worker("w2")
    # Both sessions are served at once: a worker serves one item at a time, so each took one.
    assert ok(cp.call(first, "bash", command="echo first")) == "first"
    assert ok(cp.call(second, "bash", command="echo second")) == "second"
    owners = acked_by(cp, first) + acked_by(cp, second)
    assert sorted(owners) == ["w1", "w2"], owners  # type: ignore[type-var]
    # Their sandboxes are apart: a file of one session is not in the other's.
    ok(cp.call(first, "write", file_path="mine.txt", content="first's"))
    assert "does not exist" in text_of(cp.call(second, "read", file_path="mine.txt"))


def test_killed_worker_is_replaced_and_the_session_continues(
    gateway: Gateway, control_plane: ControlPlane, start_worker: Callable[..., Worker]
) -> None:
    cp = control_plane
    sid = cp.create_session()
    w1 = start_worker("w1")
    ok(cp.call(sid, "write", file_path="report.md", content="# draft\n"))
    ok(cp.call(sid, "bash", command="mkdir -p /tmp/work && cd /tmp/work && export PHASE=alpha"))
    sandbox = sandbox_of(gateway, sid)
    assert sandbox is not None

    # SIGKILL in the middle of a tool call: no result is posted, no stop, no heartbeat.
    pending = cp.tool_use(sid, "bash", command="touch /workspace/started; sleep 2; echo done")
    wait_for(lambda: (workspace(gateway, sid) / "started").exists())
    w1.signal(signal.SIGKILL)
    w1.wait()
    wait_for(lambda: ("requeued", "w1") in cp.item_of(sid).log, timeout=30)  # the lease ran out
    start_worker("w2")

    # The new worker takes the item over, reads the session's history and answers the tool use
    # that was left unanswered, once, in the same sandbox.
    assert ok(cp.result(sid, pending)) == "done"
    assert acked_by(cp, sid) == ["w1", "w2"]
    assert len(cp.results_for(sid, pending)) == 1
    assert ok(cp.call(sid, "read", file_path="report.md")) == "# draft\n"
    assert ok(cp.call(sid, "bash", command='echo "$PWD $PHASE"')) == "/tmp/work alpha"
    assert sandbox_of(gateway, sid) == sandbox
    assert cp.item_of(sid).state == "active"


def test_a_worker_that_lost_its_lease_drops_the_item(
    gateway: Gateway, control_plane: ControlPlane, start_worker: Callable[..., Worker]
) -> None:
    cp = control_plane
    sid = cp.create_session()
    w1 = start_worker("w1")
    ok(cp.call(sid, "write", file_path="a.txt", content="a"))
    w1.signal(signal.SIGSTOP)  # frozen past its lease: the item goes back to the queue
    try:
        wait_for(lambda: ("requeued", "w1") in cp.item_of(sid).log, timeout=30)
        start_worker("w2")
        assert ok(cp.call(sid, "read", file_path="a.txt")) == "a"
        assert acked_by(cp, sid) == ["w1", "w2"]
    finally:
        w1.signal(signal.SIGCONT)
    # w1's next heartbeat echoes a heartbeat that is no longer the lease's: 412. It drops the
    # item without stopping it; w2 keeps serving the session.
    wait_for(lambda: "lease lost" in w1.output(), timeout=30)
    assert any(what == "heartbeat_refused" for what, _ in cp.item_of(sid).log)
    assert not any(what.startswith("stopped") for what, _ in cp.item_of(sid).log)
    assert ok(cp.call(sid, "bash", command="cat a.txt")) == "a"
    assert cp.item_of(sid).state == "active"
    assert w1.proc.poll() is None  # dropping an item is not an error: it polls on


def test_sigterm_finishes_the_call_in_flight_and_releases_the_item(
    gateway: Gateway, control_plane: ControlPlane, start_worker: Callable[..., Worker]
) -> None:
    cp = control_plane
    sid = cp.create_session()
    w1 = start_worker("w1")
    ok(cp.call(sid, "bash", command="export KEPT=yes"))
    pending = cp.tool_use(sid, "bash", command="touch /workspace/begun; sleep 2; echo finished")
    wait_for(lambda: (workspace(gateway, sid) / "begun").exists())
    w1.signal(signal.SIGTERM)
    assert w1.wait() == 0
    # The call in flight finished and its result was posted before the worker let go.
    assert ok(cp.result(sid, pending, timeout=5)) == "finished"
    item = cp.item_of(sid)
    assert not any(what.startswith("stopped") for what, _ in item.log)  # released, not stopped
    wait_for(lambda: ("requeued", "w1") in cp.item_of(sid).log, timeout=30)
    w2 = start_worker("w2")
    assert ok(cp.call(sid, "bash", command="echo $KEPT")) == "yes"
    assert acked_by(cp, sid) == ["w1", "w2"]
    # An idle worker stops at once on SIGTERM too, with status 0.
    cp.end_turn(sid)
    wait_for(lambda: cp.item_of(sid).state == "stopped", timeout=30)
    w2.signal(signal.SIGTERM)
    assert w2.wait() == 0
    assert "stopped" in w2.output()
