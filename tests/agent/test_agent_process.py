"""process.Process over the real agent: framing, exit codes, stdin, PTY, connect, signals."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import struct
import time

from tests.agent.helpers import (
    END_STREAM,
    STREAM_HEADERS,
    EnvelopeStream,
    b64,
    basic,
    command,
    envelope,
    gone,
    ok,
    open_stream,
    run,
    stream,
    unary,
)


def compact(msg: dict) -> bytes:
    payload = json.dumps(msg, separators=(",", ":")).encode()
    return struct.pack(">BI", 0, len(payload)) + payload


async def test_start_stream_framing_is_exact(agent):
    hdrs = {**STREAM_HEADERS}
    async with agent.client.stream(
        "POST", "/process.Process/Start", content=envelope(command("printf hi")), headers=hdrs
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/connect+json"
        assert r.headers["transfer-encoding"] == "chunked"
        raw = await r.aread()
    pid = EnvelopeStream().feed(raw)[0][1]["event"]["start"]["pid"]
    end = {"exitCode": 0, "exited": True, "status": "exit status 0"}
    expected = (
        compact({"event": {"start": {"pid": pid}}})
        + compact({"event": {"data": {"stdout": "aGk="}}})
        + compact({"event": {"end": end}})
        + bytes([END_STREAM])
        + struct.pack(">I", 2)
        + b"{}"
    )
    assert raw == expected


async def test_unary_framing_and_errors_are_exact(agent):
    r = await agent.client.post(
        "/process.Process/List", content=b"{}", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.content == b'{"processes":[]}'

    r = await agent.client.post(
        "/process.Process/SendSignal",
        content=json.dumps({"process": {"pid": 999999}, "signal": "SIGNAL_SIGKILL"}),
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"code": "not_found", "message": "process with pid 999999 not found"}


async def test_exit_codes(agent):
    ok_run = await run(agent.client, "true")
    assert ok_run.end_event == {"exitCode": 0, "exited": True, "status": "exit status 0"}
    fail = await run(agent.client, "echo out; echo err >&2; exit 1")
    assert fail.output() == b"out\n"
    assert fail.output("stderr") == b"err\n"
    assert fail.end_event == {
        "exitCode": 1,
        "exited": True,
        "status": "exit status 1",
        "error": "exit status 1",
    }
    killed = await run(agent.client, "kill -9 $$")
    assert killed.end_event == {
        "exitCode": -1,
        "exited": False,
        "status": "signal: killed",
        "error": "signal: killed",
    }


async def test_first_event_is_start_and_pid_is_real(agent):
    result = await run(agent.client, "echo $$")
    assert "start" in result.events[0]
    assert int(result.output()) == result.pid
    assert "end" in result.events[-1]


async def test_keepalive_events_with_ping_interval(agent):
    result = await stream(
        agent.client,
        "process.Process/Start",
        command("sleep 2.6; echo done"),
        headers={"Keepalive-Ping-Interval": "1"},
    )
    kinds = [next(iter(ev)) for ev in result.events]
    assert kinds[0] == "start" and kinds[-1] == "end"
    assert kinds.count("keepalive") >= 2
    assert result.events[1] == {"keepalive": {}}
    assert result.end == {}


async def test_environment_user_and_cwd(agent):
    result = await run(
        agent.client,
        'echo "$HOME|$USER|$LOGNAME|$SANDHOLD_TEST|$MINE|$(pwd)"',
        process={"envs": {"MINE": "x y"}},
    )
    assert result.output() == b"/root|root|root|1|x y|/root\n"

    here = await run(agent.client, "pwd", process={"cwd": str(agent.workdir)})
    assert here.output().decode().strip() == str(agent.workdir)


async def test_bad_cwd_command_and_user(agent):
    res = await stream(
        agent.client, "process.Process/Start", command("pwd", process={"cwd": "/nope"})
    )
    assert res.status == 200 and res.messages == []
    assert res.end == {
        "error": {"code": "invalid_argument", "message": "cwd '/nope' does not exist"}
    }

    res = await stream(
        agent.client, "process.Process/Start", {"process": {"cmd": "/no/such/binary"}}
    )
    assert res.end["error"]["code"] == "invalid_argument"
    assert "/no/such/binary" in res.end["error"]["message"]
    assert "no such file or directory" in res.end["error"]["message"]

    res = await stream(agent.client, "process.Process/Start", command("true"), user="ghost")
    assert res.end == {"error": {"code": "unauthenticated", "message": "invalid username: 'ghost'"}}
    status, body = await unary(agent.client, "process.Process/List", {}, user="ghost")
    assert status == 401 and body["code"] == "unauthenticated"


async def test_children_drop_every_capability(agent):
    result = await run(agent.client, "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status")
    lines = result.output().decode().split("\n")
    caps = dict(line.split(":\t") for line in lines if line)
    assert caps == dict.fromkeys(
        ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"), "0000000000000000"
    )
    oom = await run(agent.client, "cat /proc/self/oom_score_adj")
    assert oom.output() == b"500\n"


async def test_runs_as_another_user(agent):
    # nobody's home does not exist, and a missing cwd is refused like envd does
    res = await stream(agent.client, "process.Process/Start", command("true"), user="nobody")
    assert res.end == {
        "error": {"code": "invalid_argument", "message": "cwd '/nonexistent' does not exist"}
    }
    cwd = {"cwd": "/"}
    result = await run(agent.client, "id -u; id -g; echo $HOME $USER", user="nobody", process=cwd)
    assert result.output().decode().split() == ["65534", "65534", "/nonexistent", "nobody"]
    caps = await run(agent.client, "grep CapBnd /proc/self/status", user="nobody", process=cwd)
    assert caps.output().decode().split() == ["CapBnd:", "0000000000000000"]
    denied = await run(agent.client, "ls /root", user="nobody", process=cwd)
    assert denied.end_event["exitCode"] != 0


async def test_new_session_and_process_group(agent):
    result = await run(agent.client, "ps -o pid=,pgid=,sid= -p $$")
    pid, pgid, sid = result.output().decode().split()
    assert pid == pgid == sid


async def test_stdin_send_input_and_close(agent):
    body = command("read line; echo got:$line; cat", stdin=True)
    events: list[dict] = []
    async for flags, msg in open_stream(agent.client, "process.Process/Start", body):
        if flags & END_STREAM:
            assert msg == {}
            break
        ev = msg["event"]
        events.append(ev)
        if "start" in ev:
            pid = ev["start"]["pid"]
            await ok(agent.client, "process.Process/SendInput",
                     {"process": {"pid": pid}, "input": {"stdin": b64("hello\n")}})  # fmt: skip
        elif "data" in ev and b"got:hello" in base64.b64decode(ev["data"].get("stdout", "")):
            await ok(agent.client, "process.Process/SendInput",
                     {"process": {"pid": pid}, "input": {"stdin": b64("tail")}})  # fmt: skip
            await ok(agent.client, "process.Process/CloseStdin", {"process": {"pid": pid}})
    out = b"".join(base64.b64decode(e["data"]["stdout"]) for e in events if "data" in e)
    assert out == b"got:hello\ntail"
    assert events[-1]["end"]["exitCode"] == 0


async def test_stdin_disabled_by_default(agent):
    result = await run(agent.client, "cat; echo eof")
    assert result.output() == b"eof\n"  # stdin is /dev/null

    gen = open_stream(agent.client, "process.Process/Start", command("sleep 5"))
    _, first = await anext(gen)
    pid = first["event"]["start"]["pid"]
    status, body = await unary(
        agent.client, "process.Process/SendInput",
        {"process": {"pid": pid}, "input": {"stdin": b64("x")}},
    )  # fmt: skip
    assert status == 500 and body["code"] == "internal"
    assert "stdin not enabled or closed" in body["message"]
    await ok(agent.client, "process.Process/SendSignal",
             {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"})  # fmt: skip
    await gen.aclose()


async def test_stream_input_client_stream(agent):
    gen = open_stream(agent.client, "process.Process/Start", command("cat", stdin=True))
    _, first = await anext(gen)
    pid = first["event"]["start"]["pid"]

    async def body():
        yield envelope({"start": {"process": {"pid": pid}}})
        for part in ("one ", "two ", "three"):
            await asyncio.sleep(0.05)
            yield envelope({"data": {"input": {"stdin": b64(part)}}})
        yield envelope({"keepalive": {}})

    r = await agent.client.post(
        "/process.Process/StreamInput", content=body(), headers=STREAM_HEADERS
    )
    assert r.status_code == 200
    assert r.content == compact({}) + bytes([END_STREAM]) + struct.pack(">I", 2) + b"{}"
    await ok(agent.client, "process.Process/CloseStdin", {"process": {"pid": pid}})
    out = b""
    async for flags, msg in gen:
        if flags & END_STREAM:
            break
        data = msg["event"].get("data")
        if data:
            out += base64.b64decode(data["stdout"])
    assert out == b"one two three"

    async def unknown():
        yield envelope({"start": {"process": {"pid": 999999}}})

    r = await agent.client.post(
        "/process.Process/StreamInput", content=unknown(), headers=STREAM_HEADERS
    )
    flags, end = EnvelopeStream().feed(r.content)[0]
    assert flags == END_STREAM and end["error"]["code"] == "not_found"


async def test_pty_output_and_resize(agent):
    body = {
        "process": {"cmd": "/bin/sh", "args": ["-c", "stty size; echo $TERM; read x; stty size"]},
        "pty": {"size": {"cols": 80, "rows": 24}},
    }
    out = b""
    resized = False
    end = None
    async for flags, msg in open_stream(agent.client, "process.Process/Start", body):
        if flags & END_STREAM:
            break
        ev = msg["event"]
        if "start" in ev:
            pid = ev["start"]["pid"]
        elif "data" in ev:
            assert set(ev["data"]) == {"pty"}
            out += base64.b64decode(ev["data"]["pty"])
            if b"xterm-256color" in out and not resized:
                resized = True
                size = {"size": {"cols": 100, "rows": 30}}
                await ok(agent.client, "process.Process/Update",
                         {"process": {"pid": pid}, "pty": size})  # fmt: skip
                await ok(agent.client, "process.Process/SendInput",
                         {"process": {"pid": pid}, "input": {"pty": b64("\n")}})  # fmt: skip
        elif "end" in ev:
            end = ev["end"]
    text = out.decode()
    assert "24 80" in text
    assert "30 100" in text
    assert end == {"exitCode": 0, "exited": True, "status": "exit status 0"}


async def test_pty_is_controlling_terminal(agent):
    body = {
        "process": {
            "cmd": "/bin/sh",
            "args": ["-c", "tty; ps -o tty= -p $$; [ -t 0 ] && echo tty0"],
        },
        "pty": {"size": {"cols": 80, "rows": 24}},
    }
    res = await stream(agent.client, "process.Process/Start", body)
    text = res.output("pty").decode()
    assert "/dev/pts/" in text
    assert "tty0" in text
    assert "?" not in text.split("\n")[1]  # ps sees a controlling terminal


async def test_connect_list_and_tags(agent):
    script = "for i in 1 2 3 4 5 6; do echo tick$i; sleep 0.3; done"
    starter = open_stream(agent.client, "process.Process/Start", command(script, tag="ticker"))
    _, first = await anext(starter)
    pid = first["event"]["start"]["pid"]

    listing = await ok(agent.client, "process.Process/List", {})
    [info] = listing["processes"]
    assert info["pid"] == pid and info["tag"] == "ticker"
    assert info["config"] == {"cmd": "/bin/bash", "args": ["-c", script], "envs": {}}

    res = await stream(agent.client, "process.Process/Connect", {"process": {"tag": "ticker"}})
    assert res.events[0] == {"start": {"pid": pid}}
    assert b"tick6" in res.output()
    assert res.end_event["exitCode"] == 0
    assert res.end == {}
    await starter.aclose()
    assert (await ok(agent.client, "process.Process/List", {}))["processes"] == []

    res = await stream(agent.client, "process.Process/Connect", {"process": {"pid": pid}})
    assert res.messages == []
    assert res.end == {
        "error": {"code": "not_found", "message": f"process with pid {pid} not found"}
    }


async def test_process_outlives_its_stream(agent):
    marker = agent.workdir / "bg-done"
    starter = open_stream(
        agent.client, "process.Process/Start", command(f"sleep 0.7; echo ok > {marker}")
    )
    _, first = await anext(starter)
    pid = first["event"]["start"]["pid"]
    await starter.aclose()  # the client goes away
    await asyncio.sleep(0.2)
    listing = await ok(agent.client, "process.Process/List", {})
    assert [p["pid"] for p in listing["processes"]] == [pid]
    res = await stream(agent.client, "process.Process/Connect", {"process": {"pid": pid}})
    assert res.end_event["exitCode"] == 0
    assert marker.read_text() == "ok\n"


async def test_send_signal(agent):
    for signame, status in (
        ("SIGNAL_SIGTERM", "signal: terminated"),
        ("SIGNAL_SIGKILL", "signal: killed"),
    ):
        gen = open_stream(agent.client, "process.Process/Start", command("sleep 30"))
        _, first = await anext(gen)
        pid = first["event"]["start"]["pid"]
        await ok(
            agent.client, "process.Process/SendSignal", {"process": {"pid": pid}, "signal": signame}
        )
        end = None
        async for flags, msg in gen:
            if not flags and "end" in msg["event"]:
                end = msg["event"]["end"]
        assert end == {"exitCode": -1, "exited": False, "status": status, "error": status}

    status, body = await unary(agent.client, "process.Process/SendSignal",
                               {"process": {"pid": 999999}, "signal": 9})  # fmt: skip
    assert (status, body["code"]) == (404, "not_found")


async def test_signal_reaches_the_whole_group(agent):
    marker = agent.workdir / "child-pid"
    gen = open_stream(
        agent.client,
        "process.Process/Start",
        command(f"sleep 60 & echo $! > {marker}; wait"),
    )
    _, first = await anext(gen)
    pid = first["event"]["start"]["pid"]
    for _ in range(50):
        if marker.exists() and marker.read_text().strip():
            break
        await asyncio.sleep(0.05)
    child = int(marker.read_text())
    await ok(agent.client, "process.Process/SendSignal",
             {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"})  # fmt: skip
    async for _flags, _msg in gen:
        pass
    await asyncio.sleep(0.1)
    assert gone(child)


async def test_connect_timeout_ends_the_stream_and_kills_the_command(agent):
    t0 = time.monotonic()
    res = await stream(
        agent.client, "process.Process/Start", command("sleep 20"),
        headers={"Connect-Timeout-Ms": "600"},
    )  # fmt: skip
    elapsed = time.monotonic() - t0
    # like connect-go: the deadline ends the stream, which the SDK reports as a timeout
    assert res.end == {
        "error": {"code": "deadline_exceeded", "message": "context deadline exceeded"}
    }
    assert 0.5 < elapsed < 20  # ended by the deadline, not by the command's end
    pid = res.pid
    for _ in range(50):  # and the command itself does not outlive its timeout (by much)
        if not (await ok(agent.client, "process.Process/List", {}))["processes"]:
            break
        await asyncio.sleep(0.1)
    assert gone(pid)


async def test_background_children_do_not_hold_the_end_event(agent):
    t0 = time.monotonic()
    res = await run(agent.client, "sleep 30 & echo $!")
    assert time.monotonic() - t0 < 30  # ended before the child did
    os.kill(int(res.output()), signal.SIGKILL)  # the orphan is ours to clean up


async def test_large_output_and_many_concurrent_commands(agent):
    big = await run(agent.client, "head -c 3000000 /dev/zero | tr '\\0' a")
    assert big.output() == b"a" * 3_000_000

    results = await asyncio.gather(*(run(agent.client, f"echo {i}") for i in range(40)))
    assert [r.output() for r in results] == [f"{i}\n".encode() for i in range(40)]


async def test_input_to_pty_vs_stdin_errors(agent):
    body = {
        "process": {"cmd": "/bin/sh", "args": ["-c", "sleep 5"]},
        "pty": {"size": {"cols": 10, "rows": 5}},
    }
    gen = open_stream(agent.client, "process.Process/Start", body)
    _, first = await anext(gen)
    pid = first["event"]["start"]["pid"]
    status, data = await unary(agent.client, "process.Process/SendInput",
                               {"process": {"pid": pid}, "input": {"stdin": b64("x")}})  # fmt: skip
    assert status == 500 and "tty assigned to process" in data["message"]
    status, data = await unary(
        agent.client, "process.Process/CloseStdin", {"process": {"pid": pid}}
    )
    assert status == 500 and data["code"] == "unknown"
    await ok(agent.client, "process.Process/SendSignal", {"process": {"pid": pid}, "signal": 9})
    await gen.aclose()


async def test_unknown_signal_and_selector(agent):
    gen = open_stream(agent.client, "process.Process/Start", command("sleep 5"))
    _, first = await anext(gen)
    pid = first["event"]["start"]["pid"]
    status, data = await unary(
        agent.client, "process.Process/SendSignal", {"process": {"pid": pid}}
    )
    assert (status, data["code"]) == (501, "unimplemented")
    status, data = await unary(agent.client, "process.Process/SendSignal", {"signal": 9})
    assert (status, data["code"]) == (501, "unimplemented")
    await ok(agent.client, "process.Process/SendSignal", {"process": {"pid": pid}, "signal": 9})
    await gen.aclose()


async def test_authorization_header_selects_user(agent):
    r = await agent.client.post(
        "/process.Process/Start",
        content=envelope(command("id -un", process={"cwd": "/tmp"})),
        headers={**STREAM_HEADERS, **basic("nobody")},
    )
    msgs = EnvelopeStream().feed(r.content)
    out = b"".join(
        base64.b64decode(m["event"]["data"]["stdout"])
        for f, m in msgs
        if not f and "data" in m["event"]
    )
    assert out == b"nobody\n"
