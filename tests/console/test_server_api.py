"""The JSON API behind `sandhold serve`'s console pages, over real sockets against a live server:
the official SDK makes the sandboxes, a template build, a snapshot and a volume; the console
API (httpx, the team's key as a bearer token) shows them to their team only, a sandbox's
history grows while it burns CPU, and its kill and pause act as E2B's own calls do, audited
with who asked. Another team gets "not found" for all of it, in a missing thing's words."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from e2b import Sandbox, Template, Volume
from e2b.exceptions import BuildException, SandboxException

from sandhold.audit import console_dir
from tests.support.e2b_server import KEY_A, KEY_B, Server, new_server

MARKUP = "<img src=x onerror=alert(1)>"
GHOST = "nosuchsandbox0000000"
STEP = "echo console-build-step; head -c 65536 /dev/urandom > /home/user/blob"
BURN = "timeout 300 sh -c 'while :; do :; done'"


@dataclass
class World:
    server: Server
    sandbox: Sandbox  # team A's, with markup in its metadata
    burner: Sandbox  # team A's, burning a CPU
    template_id: str
    build_id: str
    snapshot_id: str
    volume_id: str
    volume_name: str


def call(server: Server, name: str, body: Any = None, key: str = KEY_A) -> httpx.Response:
    return httpx.post(
        f"{server.url}/console/api/{name}",
        json={} if body is None else body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


def ok(server: Server, name: str, body: Any = None, key: str = KEY_A) -> dict[str, Any]:
    r = call(server, name, body, key)
    assert r.status_code == 200, r.text
    return r.json()


def until(what: Callable[[], Any], deadline_s: float = 90.0) -> Any:
    """``what()`` once it is truthy, polled until the deadline (no timing is asserted)."""
    end = time.monotonic() + deadline_s
    while True:
        got = what()
        if got or time.monotonic() > end:
            return got
        time.sleep(0.3)


def audited(server: Server) -> list[dict[str, Any]]:
    d = console_dir(server.data_dir)
    return [
        json.loads(line) for f in sorted(d.glob("*.jsonl")) for line in f.read_text().splitlines()
    ]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    srv = new_server(
        tmp_path_factory.mktemp("console-api"),
        server_console_sample_interval_s="0.5",
        template_build_allow_out="[]",
    )
    srv.start()
    a, api = srv.sdk(KEY_A), {"api_key": KEY_A, "api_url": srv.url}
    made: list[Sandbox] = []
    try:
        with ThreadPoolExecutor(4) as pool:
            sbx = pool.submit(Sandbox.create, timeout=600, metadata={"label": MARKUP}, **a)
            burner = pool.submit(Sandbox.create, timeout=600, **a)
            tpl = Template().from_base_image().run_cmd(STEP)
            built = pool.submit(Template.build, tpl, "console-tpl", **a)
            vol = pool.submit(Volume.create, "console-vol", **api)
            made += [sbx.result(), burner.result()]
            info, volume = built.result(), vol.result()
        made[1].commands.run(BURN, background=True)
        snap = made[0].create_snapshot(mode="filesystem")
        yield World(
            srv,
            made[0],
            made[1],
            info.template_id,
            info.build_id,
            snap.snapshot_id,
            volume.volume_id,
            volume.name,
        )
    finally:
        for s in made:
            try:
                s.kill()
            except SandboxException:
                pass
        srv.destroy()


def test_another_team_sees_and_touches_nothing(world: World) -> None:
    srv, sid = world.server, world.sandbox.sandbox_id
    for name in ("sandbox", "kill", "pause"):
        theirs = call(srv, name, {"sandbox_id": sid}, KEY_B)
        ghost = call(srv, name, {"sandbox_id": GHOST}, KEY_B)
        assert theirs.status_code == ghost.status_code == 404, (theirs.text, ghost.text)
        assert theirs.json()["code"] == ghost.json()["code"] == "not_found"
        assert theirs.json()["message"].replace(sid, GHOST) == ghost.json()["message"]
    assert world.sandbox.is_running()  # B's kill and pause did nothing
    assert world.sandbox.commands.run("echo alive").stdout == "alive\n"

    build = {"template_id": world.template_id, "build_id": world.build_id}
    theirs = call(srv, "build", build, KEY_B)
    ghost = call(srv, "build", {**build, "build_id": "no-such-build"}, KEY_B)
    assert theirs.status_code == ghost.status_code == 404
    assert (
        theirs.json()["message"].replace(world.build_id, "no-such-build")
        == (ghost.json()["message"])
    )
    b_templates = ok(srv, "templates", key=KEY_B)["templates"]
    assert world.template_id not in [t["template_id"] for t in b_templates]
    assert any(t["aliases"] == ["base"] for t in b_templates)  # the built-ins are everyone's
    assert ok(srv, "snapshots", key=KEY_B) == {"snapshots": []}
    assert ok(srv, "volumes", key=KEY_B) == {"volumes": []}
    assert sid not in [s["sandbox_id"] for s in ok(srv, "sandboxes", key=KEY_B)["sandboxes"]]

    refused = [r for r in audited(srv) if r["actor"] == "tenant team-b"]
    assert {(r["action"], r["status"]) for r in refused if r["sandbox"] == sid} == {
        ("kill", "refused"),
        ("pause", "refused"),
    }
    assert all(r["tenant"] == "team-b" and "session" not in r for r in refused)


def test_templates_with_their_builds_and_a_builds_log(world: World) -> None:
    srv = world.server
    listed = ok(srv, "templates")["templates"]
    mine = next(t for t in listed if t["template_id"] == world.template_id)
    assert mine["kind"] == "own" and mine["aliases"] == ["console-tpl"]
    assert mine["tags"] == ["default"] and mine["status"] == "ready"
    assert mine["builds"][0]["build_id"] == world.build_id
    assert mine["builds"][0]["status"] == "ready"
    assert mine["builds"][0]["finished_at"] >= mine["builds"][0]["started_at"]
    base = next(t for t in listed if t["aliases"] == ["base"])
    assert base["kind"] == "base" and base["public"] and base["builds"] == []

    def sized() -> dict[str, Any] | None:
        t = next(
            t for t in ok(srv, "templates")["templates"] if t["template_id"] == world.template_id
        )
        return t if t["size_bytes"] is not None else None

    measured = until(sized)
    assert measured and measured["size_bytes"] >= 65536 and measured["size_of"] == ["layers"]

    body = {"template_id": world.template_id, "build_id": world.build_id}
    build = ok(srv, "build", body)
    assert build["status"] == "ready" and build["offset"] == 0
    assert [s["text"] for s in build["steps"]] == [f"RUN {STEP}"]
    texts = [e["message"] for e in build["logs"]]
    assert "console-build-step" in texts  # what the step printed
    later = ok(srv, "build", {**body, "offset": 1})
    assert [e["message"] for e in later["logs"]] == texts[1:]
    past = ok(srv, "build", {**body, "offset": 10**6})
    assert past["logs"] == [] and past["next"] is None


def test_snapshots_and_volumes_without_host_paths_or_tokens(world: World) -> None:
    srv = world.server
    r = call(srv, "snapshots")
    (snap,) = r.json()["snapshots"]
    assert snap["snapshot_id"] == world.snapshot_id
    assert snap["source_sandbox"] == world.sandbox.sandbox_id
    assert snap["mode"] == "filesystem" and snap["stored"] == ["local"]
    assert snap["template"]["alias"] == "base" and snap["size_bytes"] > 0
    assert str(srv.data_dir) not in r.text

    def sized() -> dict[str, Any] | None:
        (v,) = ok(srv, "volumes")["volumes"]
        return v if v["size_bytes"] is not None else None

    vol = until(sized)
    assert vol and vol["volume_id"] == world.volume_id and vol["name"] == world.volume_name
    assert set(vol) == {"volume_id", "name", "created_at", "size_bytes"}  # no token, no path


def test_a_sandbox_page_and_its_history_growing(world: World) -> None:
    srv, sid = world.server, world.burner.sandbox_id

    # Each page view takes a sample itself: those are told apart, the sampler's are the rest.
    since = ok(srv, "sandbox", {"sandbox_id": sid})["history"][-1]["at"]
    views = 0

    def busy() -> dict[str, Any] | None:
        nonlocal views
        page = ok(srv, "sandbox", {"sandbox_id": sid})
        views += 1
        new = [p for p in page["history"] if p["at"] > since]
        sampled = len(new) - views  # by the sampler, while nobody asked
        return page if sampled >= 3 and sum(p["cpu_pct"] > 20 for p in new) >= 3 else None

    page = until(busy)
    assert page, "no three busy samples in the sandbox's history"
    at = [p["at"] for p in page["history"]]
    assert at == sorted(at) and page["history"][-1]["memory_mib"] > 0
    s = page["sandbox"]
    assert s["sandbox_id"] == sid and s["tenant"] == "team-a" and s["state"] == "running"
    assert s["template"]["alias"] == "base" and s["limits"]["timeout_s"] == 600
    assert s["end_at"] > time.time() and s["age_s"] >= 0
    assert page["events"]  # the agent's own log: it started, it ran a command

    marked = ok(srv, "sandbox", {"sandbox_id": world.sandbox.sandbox_id, "events": 5})
    assert marked["sandbox"]["metadata"] == {"label": MARKUP}  # plain JSON text, as given
    assert len(marked["events"]) <= 5


def test_markup_in_names_is_refused_or_kept_as_text(world: World) -> None:
    srv = world.server
    with pytest.raises((BuildException, SandboxException)):
        Template.build(Template().from_base_image(), MARKUP, **srv.sdk(KEY_A))
    assert ok(srv, "templates")["templates"]  # the listing still answers
    r = call(srv, "build", {"template_id": MARKUP, "build_id": MARKUP})
    assert r.status_code == 404 and r.headers["content-type"] == "application/json"
    assert MARKUP in r.json()["message"]


def test_pause_then_kill_act_as_e2b_and_are_audited(world: World) -> None:
    srv = world.server
    sbx = Sandbox.create(timeout=300, **srv.sdk(KEY_A))
    sid = sbx.sandbox_id
    try:
        assert ok(srv, "pause", {"sandbox_id": sid}) == {
            "action": "pause",
            "status": "done",
            "sandbox_id": sid,
        }
        assert sbx.get_info().state.value == "paused"
        again = call(srv, "pause", {"sandbox_id": sid})
        assert again.status_code == 409 and again.json()["code"] == "conflict"
        resumed = Sandbox.connect(sid, **srv.sdk(KEY_A))  # resumes it, as after E2B's pause
        assert resumed.commands.run("echo back").stdout == "back\n"
        assert ok(srv, "kill", {"sandbox_id": sid})["status"] == "done"
        with pytest.raises(SandboxException):
            Sandbox.connect(sid, **srv.sdk(KEY_A))
        assert call(srv, "kill", {"sandbox_id": sid}).status_code == 404
    finally:
        try:
            sbx.kill()
        except SandboxException:
            pass
    mine = [(r["action"], r["status"]) for r in audited(srv) if r["sandbox"] == sid]
    assert mine == [
        ("pause", "done"),
        ("pause", "refused"),
        ("kill", "done"),
        ("kill", "refused"),
    ]
    rec = next(r for r in audited(srv) if r["sandbox"] == sid)
    assert rec["actor"] == "tenant team-a" and rec["tenant"] == "team-a" and rec["ts"] > 0


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("sandbox", {}),
        ("sandbox", {"sandbox_id": 7}),
        ("sandbox", {"sandbox_id": ""}),
        ("sandbox", {"sandbox_id": "x" * 1000}),
        ("sandbox", {"sandbox_id": "SID", "events": "10"}),
        ("sandbox", {"sandbox_id": "SID", "events": -1}),
        ("kill", {"sandbox_id": ["SID"]}),
        ("kill", {"id": "SID"}),
        ("pause", {"sandbox_id": None}),
        ("pause", {"sandbox_id": True}),
        ("build", {"template_id": "TID"}),
        ("build", {"template_id": "TID", "build_id": "BID", "offset": "1"}),
        ("build", {"template_id": "TID", "build_id": "BID", "offset": -1}),
        ("build", {"template_id": "TID", "build_id": "BID", "offset": 1.5}),
        ("build", {"template_id": "TID", "build_id": "BID", "offset": True}),
        ("build", {"template_id": 1, "build_id": "BID"}),
    ],
)
def test_bad_input_is_a_400_and_changes_nothing(world: World, name: str, body: Any) -> None:
    real = {"SID": world.sandbox.sandbox_id, "TID": world.template_id, "BID": world.build_id}
    filled = {k: real.get(v, v) if isinstance(v, str) else v for k, v in body.items()}
    if isinstance(body.get("sandbox_id"), list):
        filled["sandbox_id"] = [real["SID"]]
    before = len(audited(world.server))
    r = call(world.server, name, filled)
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "invalid_argument" and r.json()["message"]
    assert len(audited(world.server)) == before  # nothing done, nothing recorded
    assert world.sandbox.is_running()
