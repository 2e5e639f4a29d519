"""Templates built from steps (runtime/templates/build.py): each step in a build sandbox, its files
kept as a layer (removals too), the layers stacked under the template's sandboxes, an identical
rebuild served from the cache, a changed step rebuilt from there on, a failing step reported with
its exit code and output and no template left."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from sandhold.errors import InvalidRequest, TemplateBuildFailed
from sandhold.runtime.runtime import Runtime
from sandhold.runtime.templates.build import Builder, BuildRequest, Step
from tests.runtime.helpers import sh


@pytest.fixture
def uploads(tmp_path: Path) -> dict[str, Path]:
    """Archives by files hash, as the E2B surface keeps what the SDK uploads."""
    return {}


def archive(uploads: dict[str, Path], tmp: Path, files: dict[str, bytes]) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    key = f"h{len(uploads)}"
    (tmp / key).write_bytes(buf.getvalue())
    uploads[key] = tmp / key
    return key


def build(runtime: Runtime, uploads: dict[str, Path], name: str, steps: list[Step],
          **kw: object) -> tuple[object, list[str]]:  # fmt: skip
    lines: list[str] = []
    tpl = Builder(runtime, uploads.__getitem__).build(
        BuildRequest(name=name, base="base", steps=steps, **kw),  # type: ignore[arg-type]
        lambda level, msg: lines.append(msg),
    )
    return tpl, lines


STEPS = [
    Step("ENV", ["GREETING", "hello"]),
    Step("WORKDIR", ["/opt/app"]),
    Step("RUN", ["echo $GREETING > made.txt; rm /etc/issue; mkdir -p gone; touch gone/x", "root"]),
    Step("RUN", ["rm -r /opt/app/gone", "root"]),
    Step("USER", ["user"]),
]


async def test_a_built_template_runs_its_layers(runtime, make_sandbox, uploads, tmp_path):
    h = archive(uploads, tmp_path, {"conf/app.ini": b"[app]\n", "conf/extra.txt": b"x"})
    steps = [*STEPS, Step("COPY", ["conf", "etc/", "user", "0600"], files_hash=h)]
    tpl, lines = build(runtime, uploads, "built-a", steps,
                       start_cmd="cd /opt/app && python3 -m http.server 8123",
                       ready_cmd="curl -sf localhost:8123 >/dev/null")  # fmt: skip
    try:
        assert not any(line.startswith("CACHED") for line in lines)
        info = await make_sandbox(template="built-a")
        r = await sh(
            info,
            "pwd; id -un; echo $GREETING; cat made.txt; ls /etc/issue gone 2>&1 "
            "| wc -l; stat -c '%U %a' etc/app.ini; curl -sf localhost:8123/made.txt",
        )
        out = r.text.split("\n")
        assert out[:4] == ["/opt/app", "user", "hello", "hello"], r.text
        assert out[4] == "2"  # both removed (whiteouts in a lower layer), both errors listed
        assert out[5] == "user 600" and out[6] == "hello"  # COPY's owner, mode; start serving
        # An identical rebuild: every step from the cache, nothing run.
        _, again = build(runtime, uploads, "built-a", steps,
                         start_cmd="cd /opt/app && python3 -m http.server 8123",
                         ready_cmd="curl -sf localhost:8123 >/dev/null")  # fmt: skip
        assert sum(line.startswith("CACHED") for line in again) == 4, again
        # Another template differing in its last step shares every layer below it.
        last = Step("RUN", ["touch /home/user/b"])
        other, olines = build(runtime, uploads, "built-b", [*STEPS, last])
        assert sum(line.startswith("CACHED") for line in olines) == 3
        assert other.layers[1:] == tpl.layers[1:] and other.layers[0] != tpl.layers[0]
    finally:
        for name in ("built-a", "built-b"):
            if runtime.templates.exists(name):
                runtime.templates.remove(name)
        runtime.layers.collect(runtime.templates)


async def test_a_failing_step_reports_and_leaves_no_template(runtime, uploads):
    before = set(runtime.sandboxes_dir.iterdir())
    steps = [Step("RUN", ["echo partial; echo oops >&2; exit 3"])]
    with pytest.raises(TemplateBuildFailed, match=r"exit code 3\): partial\noops"):
        build(runtime, uploads, "built-fail", steps)
    assert not runtime.templates.exists("built-fail")
    assert set(runtime.sandboxes_dir.iterdir()) == before  # its build sandbox is gone
    with pytest.raises(InvalidRequest, match="unsupported instruction 'ADD'"):
        build(runtime, uploads, "built-bad", [Step("ADD", ["x", "y"])])
    with pytest.raises(InvalidRequest, match="WORKDIR /tmp/w: it is under a file system"):
        build(runtime, uploads, "built-bad", [Step("WORKDIR", ["/tmp/w"])])


def test_no_layer_is_collected_while_a_build_runs(runtime):
    orphan = runtime.layers.root / ("0" * 32)
    orphan.mkdir(parents=True)
    with runtime.layers.building():  # (another build, in this process or any other)
        assert runtime.layers.collect(runtime.templates) == 0 and orphan.exists()
    assert runtime.layers.collect(runtime.templates) == 1 and not orphan.exists()


async def test_build_sandboxes_of_a_build_cut_short_are_killed(runtime, make_sandbox):
    from sandhold.runtime.templates.build import BUILD_KEY, kill_leftovers

    plain = await make_sandbox()
    orphan = runtime.create({"template": "base"}, {BUILD_KEY: "a-layer"})  # its build died
    assert kill_leftovers(runtime) == 1
    assert {i.id for i in runtime.list()} >= {plain.id} and orphan.id not in {
        i.id for i in runtime.list()
    }


async def test_global_installs_on_base_land_in_the_templates_own_usr_local(
    runtime, make_sandbox, uploads
):
    """The host's /usr is read-only in `base`: a template built on it gets its own /usr/local,
    where root's global installs go (pip without --user, the SDK's default) and every user's
    Python finds them."""
    site = "/usr/local/lib/python3.11/dist-packages"
    step = Step("RUN", [f"mkdir -p {site} && echo 'VALUE = 7' > {site}/globalmod.py", "root"])
    build(runtime, uploads, "built-global", [step])
    try:
        info = await make_sandbox(template="built-global")
        r = await sh(info, "python3 -c 'import globalmod; print(globalmod.VALUE)'; "
                     "ls /usr/local/bin/docker 2>&1 | grep -c 'No such'")  # fmt: skip
        assert r.text.split() == ["7", "1"], r.text  # and none of the host's /usr/local
        plain = await make_sandbox()
        assert "No module" in (await sh(plain, "python3 -c 'import globalmod' 2>&1")).text
    finally:
        runtime.templates.remove("built-global")
        runtime.layers.collect(runtime.templates)


def test_a_cancelled_or_timed_out_build_leaves_nothing(runtime, uploads, monkeypatch):
    """A build cancelled mid-step (the server stopping: Builder.cancel from another thread)
    ends at once, its step's build sandbox killed; a step past its timeout fails by name.
    Neither leaves a template, a build sandbox or the step's layer."""
    import threading

    from sandhold.runtime.templates import build as build_module

    before = set(runtime.sandboxes_dir.iterdir())
    layers = lambda: {d.name for d in runtime.layers.root.glob("[!.]*")}  # noqa: E731
    kept = layers()
    started, outcome = threading.Event(), []
    builder = Builder(runtime, uploads.__getitem__)
    steps = [Step("RUN", ["true"]), Step("RUN", ["echo started; sleep 600"]), Step("RUN", ["true"])]

    def emit(_level: str, message: str) -> None:
        if message == "started":
            started.set()

    def go() -> None:
        try:
            builder.build(BuildRequest(name="built-cancel", base="base", steps=steps), emit)
        except Exception as e:
            outcome.append(e)

    worker = threading.Thread(target=go)
    worker.start()
    assert started.wait(120), "the step never started"
    builder.cancel()
    worker.join(120)
    assert not worker.is_alive() and len(outcome) == 1
    assert isinstance(outcome[0], TemplateBuildFailed) and "build cancelled" in str(outcome[0])
    assert not runtime.templates.exists("built-cancel")
    assert set(runtime.sandboxes_dir.iterdir()) == before
    assert len(layers() - kept) == 1  # the first step's, as cache; not the one cut short

    monkeypatch.setattr(build_module, "STEP_TIMEOUT_S", 1.0)
    with pytest.raises(TemplateBuildFailed, match=r"timed out\): started"):
        build(runtime, uploads, "built-timeout", [Step("RUN", ["echo started; sleep 600"])])
    assert not runtime.templates.exists("built-timeout")
    assert set(runtime.sandboxes_dir.iterdir()) == before
    runtime.layers.collect(runtime.templates)
