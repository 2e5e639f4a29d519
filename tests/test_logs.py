"""sandhold.logs without a server: the ids' context, the JSON lines, the rotated files, the
request middleware and reading the files back (tests/e2b/test_logs.py drives a real server)."""

from __future__ import annotations

import asyncio
import json
import logging
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandhold import logs
from sandhold.config import Settings
from sandhold.logs import read as r
from sandhold.logs.setup import JsonLinesFile, TextFormatter, timestamp


def record(msg: str = "hello %s", *args: Any, **extra: Any) -> logging.LogRecord:
    rec = logging.LogRecord("sandhold.test", logging.WARNING, __file__, 1, msg, args or None, None)
    rec.__dict__.update(extra)
    return rec


def test_ids_are_bound_updated_and_seen_by_the_binder() -> None:
    assert logs.current() is None
    with logs.bound(request_id="r1", tenant="t") as ids:

        async def inner() -> None:  # a task: a copy of the context, the same ids object
            logs.update(sandbox="sb1", tenant=None)

        asyncio.run(inner())
        assert ids.public() == {"request_id": "r1", "tenant": "t", "sandbox": "sb1"}
        with logs.bound(session="s"):
            assert (logs.current() or logs.Ids()).public()["session"] == "s"
        assert "session" not in ids.public()
    assert logs.current() is None
    with pytest.raises(TypeError, match="unknown log ids"):
        logs.bind(api_key="x")


def test_a_json_line() -> None:
    with logs.bound(request_id="r1", sandbox="sb1"):
        line = json.loads(logs.JsonFormatter().format(record("hi %s", "there", status=200)))
        text = TextFormatter().format(record())
    assert line["message"] == "hi there" and line["level"] == "WARNING"
    assert line["logger"] == "sandhold.test" and line["status"] == 200
    assert (line["request_id"], line["sandbox"]) == ("r1", "sb1") and "tenant" not in line
    assert line["ts"].endswith("Z") and len(line["ts"]) == len("2025-01-31T12:00:00.123Z")
    assert text.endswith("hello %s [request_id=r1 sandbox=sb1]")
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        failed = record("failed")
        failed.exc_info = sys.exc_info()
    assert "ValueError: boom" in json.loads(logs.JsonFormatter().format(failed))["exc"]


@pytest.mark.parametrize("fsync_interval_s", [0.0, 1.0])
def test_files_rotate_keep_their_count_and_are_private(
    tmp_path: Path, fsync_interval_s: float
) -> None:
    path = tmp_path / "server.jsonl"
    h = JsonLinesFile(path, max_bytes=1024, backup_count=2, fsync_interval_s=fsync_interval_s)
    h.setFormatter(logs.JsonFormatter())
    try:
        for i in range(100):
            h.handle(record("line %d", i))
    finally:
        h.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "server.jsonl", "server.jsonl.1", "server.jsonl.2"
    ]  # fmt: skip
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in tmp_path.iterdir())
    got = list(r.read(tmp_path, ["server"], r.Filter(), r.Lines()))
    assert [e[0]["message"] for e in got][-1] == "line 99" and len(got) < 100
    numbers = [int(e[0]["message"].split()[1]) for e in got]
    assert numbers == sorted(numbers)  # oldest rotated file first


@pytest.fixture
def root_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    yield
    for h in root.handlers:
        if h not in saved[0]:
            h.close()
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def test_setup_replaces_its_handlers_and_takes_uvicorns(tmp_path: Path, root_logging: None) -> None:
    settings = Settings(data_dir=tmp_path, log_stderr_format="off", log_level="WARNING")
    logging.getLogger("uvicorn.error").addHandler(logging.NullHandler())
    first = logs.setup(settings, "server")
    assert logs.setup(settings, "server") == first == tmp_path / "logs" / "server.jsonl"
    ours = [h for h in logging.getLogger().handlers if getattr(h, "sandhold_logs", False)]
    assert len(ours) == 1  # stderr off: the file only
    assert not logging.getLogger("uvicorn.error").handlers
    logging.getLogger("uvicorn.error").warning("through the root")
    logging.getLogger("sandhold.x").info("below the level")
    assert [json.loads(x)["message"] for x in first.read_text().splitlines()] == [
        "through the root"
    ]  # fmt: skip
    assert stat.S_IMODE(first.parent.stat().st_mode) == 0o700
    with pytest.raises(ValueError, match="invalid log component"):
        logs.setup(settings, "../x")


def run_app(mw: logs.RequestLog, path: str, headers: list[tuple[bytes, bytes]],
            query: bytes = b"") -> list[dict[str, Any]]:  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "query_string": query,
             "headers": headers}  # fmt: skip
    asyncio.run(mw(scope, receive, send))
    return sent


async def ok_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    logging.getLogger("sandhold.inner").info("inside")
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def test_request_ids_and_one_line_per_request(caplog: pytest.LogCaptureFixture) -> None:
    def identify(scope: dict[str, Any], ids: logs.Ids) -> None:
        ids.tenant = "team-a"

    mw = logs.RequestLog(ok_app, identify=identify)
    caplog.set_level(logging.DEBUG)
    sent = run_app(mw, "/things/1", [(b"x-request-id", b"abc-1")], query=b"signature=s3cret")
    assert (b"x-request-id", b"abc-1") in sent[0]["headers"]
    sent = run_app(mw, "/things/2", [(b"x-request-id", b"bad id\n")])
    rid = dict(sent[0]["headers"])[b"x-request-id"].decode()
    assert rid != "bad id\n" and len(rid) == 16
    run_app(mw, "/health", [])
    ours = [x for x in caplog.records if x.name.startswith("sandhold.")]
    lines = [(x.name, x.levelname, x.getMessage()) for x in ours]
    assert [n for n, _, _ in lines] == ["sandhold.inner", "sandhold.request"] * 3
    assert lines[1][2].startswith("GET /things/1 204 ") and lines[5][1] == "DEBUG"
    assert "s3cret" not in caplog.text
    line = json.loads(logs.JsonFormatter().format(ours[1]))
    assert (line["method"], line["path"], line["status"]) == ("GET", "/things/1", 204)


def test_a_failed_request_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    async def broken(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        run_app(logs.RequestLog(broken), "/x", [])
    (rec,) = [x for x in caplog.records if x.name == "sandhold.request"]
    assert rec.levelname == "WARNING" and rec.__dict__["status"] is None


def test_tail_follows_rotation_and_truncation(tmp_path: Path) -> None:
    path = tmp_path / "server.jsonl"
    path.write_text('{"ts": "1"}\n{"ts": "2"}\n{"ts": "3"')  # the last line is being written
    tail = r.Tail(path)
    try:
        assert tail.read() == [b'{"ts": "1"}', b'{"ts": "2"}']
        with open(path, "a") as f:
            f.write('}\n{"ts": "4"}\n')
        path.rename(tmp_path / "server.jsonl.1")
        path.write_text('{"ts": "5"}\n')
        assert tail.read() == [b'{"ts": "3"}', b'{"ts": "4"}', b'{"ts": "5"}']
        path.write_text("")
        assert tail.read() == []
        path.write_text('{"ts": "6"}\n')
        assert tail.read() == [b'{"ts": "6"}']
    finally:
        tail.close()


def test_malformed_lines_are_counted_and_skipped(tmp_path: Path) -> None:
    (tmp_path / "gateway.jsonl").write_text(
        '{"ts": "2025-01-01T00:00:00.000Z", "level": "INFO", "message": "a"}\nnot json\n[1]\n'
        '{"level": "INFO"}\n\n'
        '{"ts": "2025-01-01T00:00:01.000Z", "level": "ERROR", "message": "b"}\n'
    )
    (tmp_path / "server.jsonl").write_text(
        '{"ts": "2025-01-01T00:00:00.500Z", "level": "WARNING", "message": "c"}\n'
    )
    lines = r.Lines()
    got = [e[0]["message"] for e in r.read(tmp_path, r.components(tmp_path), r.Filter(), lines)]
    assert got == ["a", "c", "b"] and lines.skipped == 3  # merged by time
    warn = r.Filter(min_level=r.LEVELS["WARNING"])
    assert [e[0]["message"] for e in r.read(tmp_path, ["gateway"], warn, r.Lines())] == ["b"]


def test_times() -> None:
    assert r.parse_time("2025-01-31T12:00:00") == "2025-01-31T12:00:00.000Z"
    assert r.parse_time("2025-01-31T13:00:00.5+01:00") == "2025-01-31T12:00:00.500Z"
    assert r.parse_time("2025-01-31T12:00:00Z") == "2025-01-31T12:00:00.000Z"
    assert r.parse_time("10m", now=1_000_000.0) == timestamp(999_400.0)
    assert r.parse_time("2h", now=7200.0) == "1970-01-01T00:00:00.000Z"
    with pytest.raises(ValueError, match="invalid time"):
        r.parse_time("yesterday")
