"""The Python SDK tour of the compatibility matrix (test_matrix.py), run by the interpreter of
a venv holding one released ``e2b`` against a live server (E2B_API_URL, E2B_SANDBOX_URL,
E2B_API_KEY): one line of JSON on stdout, each feature "ok", "n/a" (this SDK has no such call)
or "fail: <why>". Plain Python: it runs under every SDK version, with nothing of the project's."""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable

from e2b import Sandbox

results: dict[str, str] = {}
made: list[Sandbox] = []


def feature(name: str) -> Callable[[Callable[[], None]], None]:
    def run(fn: Callable[[], None]) -> None:
        try:
            fn()
            results[name] = "ok"
        except NotImplementedError:
            results[name] = "n/a"
        except Exception as e:  # (every failure is a cell of the table)
            line = traceback.format_exception_only(type(e), e)[-1].strip()
            results[name] = "fail: " + line[:300]

    return run


def create(*args: object, **kw: object) -> Sandbox:
    sbx = Sandbox.create(*args, **kw)  # type: ignore[arg-type]
    made.append(sbx)
    return sbx


def call(obj: object, *names: str) -> Callable[..., object]:
    """The first of ``names`` this SDK has (renamed calls), else n/a."""
    for name in names:
        if hasattr(obj, name):
            return getattr(obj, name)  # type: ignore[no-any-return]
    raise NotImplementedError(names[0])


@feature("sandbox lifecycle")
def _lifecycle() -> None:
    sbx = create(metadata={"matrix": "py"}, timeout=120)
    assert sbx.get_info().metadata["matrix"] == "py"
    sbx.set_timeout(300)
    assert Sandbox.connect(sbx.sandbox_id).commands.run("echo c").stdout == "c\n"
    assert sbx.is_running()
    sbx.kill()
    assert not sbx.is_running()


@feature("list and metadata filter")
def _list() -> None:
    sbx = create(metadata={"matrix": "list"})
    from e2b import SandboxQuery

    pages = Sandbox.list(query=SandboxQuery(metadata={"matrix": "list"}))
    assert any(s.sandbox_id == sbx.sandbox_id for s in pages.next_items())


@feature("commands and stdin")
def _commands() -> None:
    sbx = create()
    seen: list[str] = []
    r = sbx.commands.run("echo a; echo b >&2", on_stdout=seen.append)
    assert (r.stdout, r.stderr, "".join(seen)) == ("a\n", "b\n", "a\n")
    h = sbx.commands.run("read x; echo got:$x", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "hi\n")
    assert h.wait().stdout == "got:hi\n"


@feature("pty")
def _pty() -> None:
    from e2b import PtySize

    sbx = create()
    term = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.send_stdin(term.pid, b"exit\n")
    term.wait()


@feature("files and watch")
def _files() -> None:
    sbx = create()
    sbx.files.write("/home/user/a.txt", "alpha")
    assert sbx.files.read("/home/user/a.txt") == "alpha"
    assert [e.name for e in sbx.files.list("/home/user") if e.name == "a.txt"] == ["a.txt"]
    watcher = sbx.files.watch_dir("/home/user")
    sbx.files.write("/home/user/b.txt", "b")
    deadline = time.monotonic() + 10
    while not any(e.name == "b.txt" for e in watcher.get_new_events()):
        assert time.monotonic() < deadline, "no watch event"
        time.sleep(0.1)
    watcher.stop()


@feature("pause and resume")
def _pause() -> None:
    sbx = create(timeout=300)
    sbx.files.write("/home/user/kept.txt", "kept")
    call(sbx, "pause", "beta_pause")()
    back = Sandbox.connect(sbx.sandbox_id)
    assert back.files.read("/home/user/kept.txt") == "kept"


@feature("snapshots")
def _snapshots() -> None:
    sbx = create(timeout=300)
    sbx.files.write("/home/user/s.txt", "snap")
    snap = call(sbx, "create_snapshot")()
    again = create(snap.snapshot_id)  # type: ignore[attr-defined]
    assert again.files.read("/home/user/s.txt") == "snap"
    call(Sandbox, "delete_snapshot")(snap.snapshot_id)  # type: ignore[attr-defined]


@feature("fork")
def _fork() -> None:
    sbx = create(timeout=300)
    sbx.files.write("/home/user/f.txt", "fork")
    forks = [f for f in call(sbx, "fork")(count=1) if isinstance(f, Sandbox)]
    made.extend(forks)
    assert forks and forks[0].files.read("/home/user/f.txt") == "fork"


@feature("templates")
def _templates() -> None:
    from e2b import Template

    tpl = Template().from_base_image().run_cmd("echo built > /home/user/t.txt")
    name = os.environ["MATRIX_TEMPLATE"]  # one per run: the runs build at once
    Template.build(tpl, name)
    sbx = create(name)
    assert sbx.files.read("/home/user/t.txt") == "built\n"


@feature("metrics")
def _metrics() -> None:
    sbx = create()
    sbx.commands.run("true")
    deadline = time.monotonic() + 20
    while not sbx.get_metrics():
        assert time.monotonic() < deadline, "no metrics"
        time.sleep(0.5)


for s in made:
    try:
        s.kill()
    except Exception:  # (killed already, or gone)
        pass
print(json.dumps(results))
