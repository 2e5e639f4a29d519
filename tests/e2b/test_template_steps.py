"""Every step of the official SDK's ``Template`` builder against ``sandhold serve``, each proven
by what a sandbox of the template finds: ``set_user``, ``copy`` with its user and mode,
``run_cmd`` as a user, ``pip_install`` (global and ``--user``, of wheels the build context
holds: these builds have no network), ``npm_install`` (global, of a package tarball),
``git_clone`` (of a repository copied in), ``make_dir`` with a mode, ``make_symlink``,
``remove``, ``rename``; ``skip_cache``; ``from_dockerfile`` (the SDK parses it into steps); a
build in the background polled with ``get_build_status``; ``apt_install`` on ``base`` failing
as docs/templates.md says (its ``/usr`` is the host's, read-only), leaving no template."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox, Template
from e2b.exceptions import BuildException

from tests.support.e2b_server import Server, new_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = new_server(tmp_path_factory.mktemp("steps"), template_build_allow_out="[]")
    srv.start()
    yield srv
    srv.destroy()


def wheel(context: Path, module: str, value: str) -> str:
    """A one-module wheel in the build context; its file name."""
    name = f"{module}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(context / name, "w") as z:
        z.writestr(f"{module}.py", f"VALUE = {value!r}\n")
        info = f"{module}-1.0.dist-info"
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: "
                                    "true\nTag: py3-none-any\n")  # fmt: skip
        z.writestr(f"{info}/RECORD", "")
    return name


def npm_package(context: Path) -> str:
    """An npm package tarball (``package/`` inside, as ``npm pack`` makes) with a bin."""
    files = {
        "package/package.json": json.dumps({"name": "sandhold-hello", "version": "1.0.0",
                                            "bin": {"sandhold-hello": "cli.js"}}).encode(),
        "package/cli.js": b"#!/usr/bin/env node\nconsole.log('hello from npm');\n",
    }  # fmt: skip
    with tarfile.open(context / "hello-1.0.0.tgz", "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return "hello-1.0.0.tgz"


def git_repo(context: Path) -> str:
    """A bare repository with one commit on ``main``, in the build context."""
    work, bare = context.parent / "work", context / "src.git"
    who = {
        f"GIT_{k}_{f}": v
        for k in ("AUTHOR", "COMMITTER")
        for f, v in (("NAME", "t"), ("EMAIL", "t@t"))
    }
    env = {**who, "HOME": str(context.parent), "PATH": "/usr/bin:/bin"}
    git = lambda *a: subprocess.run(["git", *a], check=True, env=env, capture_output=True)  # noqa: E731
    git("init", "-q", "-b", "main", str(work))
    (work / "README").write_text("cloned\n")
    git("-C", str(work), "add", "README")
    git("-C", str(work), "commit", "-q", "-m", "one")
    git("clone", "-q", "--bare", str(work), str(bare))
    return "src.git"


def make_context(context: Path) -> tuple[str, str, str, str]:
    (context / "conf.txt").write_text("conf\n")
    global_whl, user_whl = wheel(context, "globalmod", "g"), wheel(context, "usermod", "u")
    return global_whl, user_whl, npm_package(context), git_repo(context)


def steps_template(context: Path, files: tuple[str, str, str, str]) -> Template:
    global_whl, user_whl, tgz, repo = files
    return (
        Template(file_context_path=str(context))
        .from_base_image()
        .set_user("root")
        .copy(["conf.txt", global_whl, user_whl, tgz], "/opt/in/")
        .copy(repo, "/opt/src.git/")
        .copy("conf.txt", "/opt/owned.txt", user="user", mode=0o640)
        .copy("conf.txt", "/opt/mine/deep/conf.txt", user="user")  # and the directories made
        .copy(["conf.txt"], "/opt/mydir/", user="user")
        .run_cmd("id -un > /opt/root-ran")
        .pip_install([f"/opt/in/{global_whl}"])  # as root, into the template's /usr/local
        .npm_install([f"/opt/in/{tgz}"], g=True)
        .set_user("user")
        .run_cmd("id -un > /home/user/user-ran")
        .run_cmd("id -un > /home/user/as-root", user="root")
        .pip_install([f"/opt/in/{user_whl}"], g=False)  # --user, as the current user
        .git_clone("file:///opt/src.git", "/opt/clone", branch="main", depth=1, user="root")
        .make_dir("/home/user/private", mode=0o700)
        .make_symlink("/opt/owned.txt", "/home/user/link")
        .run_cmd("mkdir -p /home/user/junk/deep && touch /home/user/junk/deep/x /home/user/old")
        .remove("/home/user/junk", recursive=True, force=True)
        .rename("/home/user/old", "/home/user/new")
    )


CHECK = (
    "id -un; cat /opt/root-ran /home/user/user-ran /home/user/as-root; "
    "stat -c '%U %a' /opt/owned.txt; "
    "python3 -c 'import globalmod, usermod; print(globalmod.VALUE + usermod.VALUE)'; "
    "sandhold-hello; cat /opt/clone/README; cat /opt/clone/.git/HEAD; "
    "stat -c %a /home/user/private; readlink /home/user/link; cat /home/user/link; "
    "ls /home/user/junk 2>&1 | grep -c 'No such'; ls /home/user/old /home/user/new 2>&1 | sort; "
    "cd /opt && stat -c %U . mine mine/deep mine/deep/conf.txt mydir mydir/conf.txt"
)


def test_every_step_of_the_builder(server: Server, tmp_path: Path) -> None:
    context = tmp_path / "ctx"
    context.mkdir()
    files = make_context(context)
    logs: list[str] = []
    Template.build(steps_template(context, files), "steps", on_build_logs=lambda e:
                   logs.append(e.message), **server.sdk())  # fmt: skip
    sbx = Sandbox.create("steps", **server.sdk())
    try:
        r = sbx.commands.run(CHECK)
        out = r.stdout.strip().split("\n")
        assert out[:5] == ["user", "root", "user", "root", "user 640"], (r.stdout, r.stderr)
        assert out[5:8] == ["gu", "hello from npm", "cloned"], (r.stdout, r.stderr)
        assert out[8:12] == ["ref: refs/heads/main", "700", "/opt/owned.txt", "conf"], r.stdout
        assert out[12:14] == ["1", "/home/user/new"] and "No such file" in out[14], r.stdout
        assert out[15:] == ["root"] + ["user"] * 5, r.stdout  # what COPY made is the owner's
    finally:
        sbx.kill()
    # skip_cache(): the steps before it come from the cache, it and the ones after run again.
    again: list[str] = []
    Template.build(steps_template(context, files).skip_cache().run_cmd("touch /home/user/last"),
                   "steps", on_build_logs=lambda e: again.append(e.message),
                   **server.sdk())  # fmt: skip
    ran = [line for line in again if line.startswith(("CACHED [", "["))
           and line.split("] ")[1].split()[0] not in ("USER", "ENV")]  # fmt: skip
    assert all(line.startswith("CACHED") for line in ran[:-1]), ran
    assert not ran[-1].startswith("CACHED") and "touch /home/user/last" in ran[-1], ran
    whole: list[str] = []
    Template.build(Template(file_context_path=str(context)).skip_cache().from_base_image()
                   .run_cmd("true"), "forced", on_build_logs=lambda e: whole.append(e.message),
                   **server.sdk())  # fmt: skip
    Template.build(Template(file_context_path=str(context)).skip_cache().from_base_image()
                   .run_cmd("true"), "forced", on_build_logs=lambda e: whole.append(e.message),
                   **server.sdk())  # fmt: skip
    assert not any(line.startswith("CACHED") for line in whole), whole


def test_from_dockerfile_and_a_build_in_the_background(server: Server, tmp_path: Path) -> None:
    (tmp_path / "page.txt").write_text("page\n")
    dockerfile = ("FROM e2bdev/base\nENV GREETING=bonjour\nWORKDIR /home/user/site\n"
                  "COPY page.txt .\nRUN echo $GREETING > made.txt\nUSER user\n")  # fmt: skip
    tpl = Template(file_context_path=str(tmp_path)).from_dockerfile(dockerfile)
    build = Template.build_in_background(tpl, "from-df", **server.sdk())
    deadline, seen = time.monotonic() + 300, []
    status = Template.get_build_status(build, **server.sdk())
    while status.status.value in ("waiting", "building") and time.monotonic() < deadline:
        seen += [e.message for e in status.log_entries]
        time.sleep(0.2)
        status = Template.get_build_status(build, logs_offset=len(seen), **server.sdk())
    seen += [e.message for e in status.log_entries]
    assert status.status.value == "ready", (status, seen)
    assert any("RUN echo $GREETING > made.txt" in line for line in seen), seen
    sbx = Sandbox.create("from-df", **server.sdk())
    try:
        r = sbx.commands.run("pwd; id -un; echo $GREETING; cat made.txt page.txt")
        assert r.stdout.split() == ["/home/user/site", "user", "bonjour", "bonjour", "page"]
    finally:
        sbx.kill()


def test_apt_install_on_base_fails_and_leaves_nothing(server: Server) -> None:
    with pytest.raises(BuildException, match="exit code"):
        Template.build(Template().from_base_image().apt_install("cowsay"), "apt", **server.sdk())
    assert not Template.exists("apt", **server.sdk())


def test_a_build_the_server_stops_leaves_nothing(server: Server) -> None:
    """The server stopped mid-step: the build is cancelled (its build sandbox killed, so the
    server stops at once), no template is recorded, and the restarted server knows none."""
    slow = Template().from_base_image().run_cmd("echo started; sleep 600")
    build = Template.build_in_background(slow, "cut-short", **server.sdk())
    deadline, seen = time.monotonic() + 120, []
    while "started" not in seen and time.monotonic() < deadline:
        status = Template.get_build_status(build, logs_offset=len(seen), **server.sdk())
        seen += [e.message for e in status.log_entries]
        time.sleep(0.2)
    assert "started" in seen, seen
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(120) in (0, -signal.SIGTERM)  # (uvicorn raises it again at its end)
    assert "Application shutdown complete" in server.log.read_text()
    server.proc = None
    rt = server.runtime()
    assert rt.list() == []  # its build sandbox is gone
    assert not [t for t in rt.templates.list() if t.alias == "cut-short"]
    server.start()
    assert not Template.exists("cut-short", **server.sdk())
