"""Dockerfiles (runtime/templates/dockerfile.py, `sandhold template build -f`): the parser as pure
unit tests (every instruction, ARG substitution, continuations, exec and shell forms, the files
hash, what is refused and where), then the real CLI end to end on a data dir of its own: a build
from `base` with ARG, ENV, WORKDIR, COPY --chown, RUN, USER and CMD, a sandbox of it serving its
CMD, the cache, `template ls / logs / rm`, and a failing build leaving nothing."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandhold.config import Settings
from sandhold.errors import InvalidRequest
from sandhold.runtime import cgroup_parent, cgroups, images, mounts
from sandhold.runtime.runtime import Runtime
from sandhold.runtime.templates import dockerfile
from sandhold.runtime.templates.dockerfile import Dockerfile, parse
from sandhold.runtime.templates.store import Template
from tests.runtime.helpers import sh


class Store:
    """The parser's view of the template store: ``base`` and ``app`` exist."""

    def exists(self, name: str) -> bool:
        return name in ("base", "app")

    def get(self, name: str) -> Template:
        return Template(name, "host", Path("/nonexistent"), env={"PATH": "/usr/bin", "HOME": "/h"})


@pytest.fixture
def ctx(tmp_path: Path) -> Path:
    c = tmp_path / "ctx"
    (c / "conf" / "sub").mkdir(parents=True)
    (c / "conf" / "app.ini").write_text("[app]\n")
    (c / "conf" / "sub" / "x.txt").write_text("x")
    (c / "conf" / ".hidden").write_text("h")
    (c / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (c / "run.sh").chmod(0o755)
    (tmp_path / "out").mkdir()
    return c


def p(text: str, ctx: Path, **args: str) -> Dockerfile:
    return parse(text, ctx, ctx.parent / "out", Store(), args)  # type: ignore[arg-type]


def test_from_an_image_reference_is_an_image_base(ctx):
    assert p("FROM python:3.11-slim\nRUN true\n", ctx).meta["image"] == "python:3.11-slim"
    assert p("FROM ubuntu\n", ctx).meta["image"] == "ubuntu"  # (no such template here)


def steps(df: Dockerfile) -> list[tuple[str, list[str]]]:
    return [(s.type, s.args) for s in df.steps]


def members(df: Dockerfile, i: int) -> dict[str, tarfile.TarInfo]:
    files_hash = df.steps[i].files_hash
    assert files_hash is not None
    with tarfile.open(df.archives[files_hash]) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_every_instruction(ctx):
    df = p(
        """
# a comment, then a blank line

from base
env A=1 B="two words" \\
    C='$A'
ENV LEGACY the rest of the line
Arg V=1.0
WORKDIR /opt/$V
user root
RUN apt-get update && \\
    # a comment inside a continuation, skipped as Docker does
    echo "done"
RUN ["python3", "-c", "print('a b')"]
COPY --chown=user --chmod=0640 conf/*.ini run.sh ./
ADD conf /etc/app/
USER user
CMD ["python3", "-m", "http.server"]
""",
        ctx,
    )
    assert df.base == "base"
    assert steps(df) == [
        ("ENV", ["A", "1", "B", "two words", "C", "$A"]),  # (single quotes: no substitution)
        ("ENV", ["LEGACY", "the rest of the line"]),
        ("WORKDIR", ["/opt/1.0"]),
        ("USER", ["root"]),
        ("RUN", ['export V=1.0; apt-get update &&     echo "done"']),  # an ARG: its env
        ("RUN", ["export V=1.0; python3 -c 'print('\"'\"'a b'\"'\"')'"]),
        ("COPY", ["conf/*.ini run.sh", "./", "user", "0640"]),
        ("COPY", ["conf", "/etc/app/", "root", ""]),  # (no --chown: root's, as Docker)
        ("USER", ["user"]),
    ]
    assert df.start_cmd == "python3 -m http.server"
    assert set(members(df, 6)) == {"conf/app.ini", "run.sh"}
    tree = members(df, 7)
    assert set(tree) == {"conf", "conf/app.ini", "conf/sub", "conf/sub/x.txt", "conf/.hidden"}
    assert tree["conf/app.ini"].uid == 0 and tree["conf/app.ini"].uname == ""  # not the host's
    assert {s.files_hash for s in df.steps if s.files_hash} == set(df.archives)
    for s in df.steps:
        s.check(0)  # what the Builder takes


def test_arg_substitution_and_build_args(ctx):
    text = """ARG IMG=base
FROM $IMG
ARG IMG
ARG V=1 W
ARG X=${V:-none}-${W:-none}-${V:+set}
ENV HOME_APP=$HOME/app V=env-wins
WORKDIR ${HOME_APP}/$X
COPY conf/app.ini $HOME_APP/${V}.ini
RUN echo "$V $W" '$V'
"""
    df = p(text, ctx, W="w", UNUSED="u")
    assert df.base == "base"
    assert steps(df)[:2] == [("ENV", ["HOME_APP", "/h/app", "V", "env-wins"]),
                             ("WORKDIR", ["/h/app/1-w-set"])]  # fmt: skip
    assert steps(df)[2][1][:2] == ["conf/app.ini", "/h/app/env-wins.ini"]
    # A RUN gets the ARGs (not those an ENV overrides) as environment; its text is the shell's.
    assert steps(df)[3][1] == ["export IMG=base W=w X=1-w-set; echo \"$V $W\" '$V'"]
    assert df.meta["args"] == {"IMG": "base", "V": "1", "W": "w", "X": "1-w-set"}
    assert df.warnings == ["build args no ARG declares: UNUSED"]
    assert p("ARG IMG=base\nFROM ${IMG}\nRUN true", ctx, IMG="app").base == "app"
    assert p("FROM base\nARG NOVALUE\nRUN true", ctx).steps[0].args == ["true"]  # unset: none


@pytest.mark.parametrize(
    ("lines", "start"),
    [
        (['CMD python3 -m http.server "8000"'], 'python3 -m http.server "8000"'),
        (['CMD ["python3", "-m", "http.server"]'], "python3 -m http.server"),
        (['ENTRYPOINT ["python3", "-m"]', 'CMD ["http.server", "80 80"]'],
         "python3 -m http.server '80 80'"),
        (['ENTRYPOINT ["/bin/run"]', "CMD --port 1"], "/bin/run /bin/sh -c '--port 1'"),
        (["CMD ignored", "ENTRYPOINT exec serve --port 1"], "exec serve --port 1"),
        (["CMD first", "CMD second"], "second"),
        ([], None),
    ],
)  # fmt: skip
def test_start_command_from_cmd_and_entrypoint(ctx, lines, start):
    df = p("\n".join(["FROM base", *lines]), ctx)
    assert df.start_cmd == start
    assert df.steps == []
    if lines[:1] == ["CMD ignored"]:
        assert "CMD ignored: a shell-form ENTRYPOINT takes no CMD" in df.warnings


def test_files_hash_follows_contents_and_modes_not_times(ctx):
    text = "FROM base\nCOPY conf /c/\n"
    first = p(text, ctx).steps[0].files_hash
    os.utime(ctx / "conf" / "app.ini", (1, 1))
    assert p(text, ctx).steps[0].files_hash == first  # touched only: the cache holds
    (ctx / "conf" / "app.ini").write_text("[changed]\n")
    changed = p(text, ctx).steps[0].files_hash
    assert changed != first
    (ctx / "conf" / "app.ini").chmod(0o600)
    assert p(text, ctx).steps[0].files_hash not in (first, changed)
    assert p("FROM base\nCOPY conf /d/\n", ctx).steps[0].files_hash != first  # the instruction


def test_copy_forms(ctx, tmp_path):
    (ctx / "link").symlink_to("conf")  # inside the context: followed, as Docker does
    (ctx / "conf" / "inner").symlink_to("/etc/passwd")  # below a source: kept as a link
    with tarfile.open(ctx / "bundle.tar", "w") as tar:
        tar.add(ctx / "run.sh", arcname="run.sh")
    df = p('FROM base\nCOPY ["link", "/a/"]\nADD bundle.tar /b/\nCOPY . /all\n', ctx)
    linked = members(df, 0)
    assert linked["link"].isdir() and linked["link/inner"].issym()
    assert linked["link/inner"].linkname == "/etc/passwd"
    assert set(members(df, 1)) == {"bundle.tar"}  # a local tar is copied, not extracted
    assert {"run.sh", "conf/app.ini", "bundle.tar"} <= set(members(df, 2))
    assert "." not in members(df, 2)
    # user:group: the group is given by a step of its own (COPY gives the user's own group).
    text = ("FROM base\nCOPY --chown=user:staff conf run.sh /d/\n"
            "COPY --chown=user:staff run.sh /d/r\nCOPY --chown=1000:1000 run.sh /e")  # fmt: skip
    df = p(text, ctx)
    assert steps(df)[1] == ("RUN", ["chgrp -R -h -- staff /d/.hidden /d/app.ini /d/inner "
                                    "/d/run.sh /d/sub", "root"])  # fmt: skip
    assert steps(df)[3] == ("RUN", ['d=/d/r; if [ -d "$d" ]; then d="$d"/run.sh; fi; '
                                    'chgrp -h -- staff "$d"', "root"])  # fmt: skip
    assert steps(df)[4] == ("COPY", ["run.sh", "/e", "1000", ""])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("FROM base\nRUN true\nHEALTHCHECK CMD true", r"^line 3: HEALTHCHECK is not supported"),
        ("FROM base\n\nexpose 80\nVOLUME /v", r"^line 4: VOLUME is not supported"),
        ("FROM base\nSHELL [\"/bin/sh\"]", r"^line 2: SHELL is not supported"),
        ("FROM base\nONBUILD RUN true", r"^line 2: ONBUILD is not supported"),
        ("FROM base\nSTOPSIGNAL 9", r"^line 2: STOPSIGNAL is not supported"),
        ("FROM base\nMAINTAINER me", r"^line 2: MAINTAINER is not supported"),
        ("FROM base AS build\nRUN true", r"^line 1: FROM base AS build: multi-stage"),
        ("FROM base\nRUN true\nFROM app", r"^line 3: a second FROM: multi-stage"),
        ("FROM base\nCOPY --from=build /x /y", r"^line 2: COPY --from: multi-stage"),
        ("FROM base\nRUN --mount=type=cache,target=/c true", r"^line 2: RUN --mount is not"),
        ("FROM base\nCOPY ../outside.txt /x", r"^line 2: COPY \.\./outside\.txt: outside the"),
        ("FROM base\nCOPY conf/../../outside.txt /x", r"^line 2: COPY conf/\.\./\.\./outside"),
        ("FROM base\nCOPY /etc/passwd /x", r"^line 2: COPY /etc/passwd: outside the build"),
        ("FROM base\nCOPY escape /x", r"^line 2: COPY escape: resolves outside the build"),
        ("FROM base\nCOPY e* /x/", r"^line 2: COPY escape: resolves outside the build"),
        ("FROM base\nCOPY escdir/passwd /x", r"^line 2: COPY escdir/passwd: resolves outside"),
        ("FROM base\nADD https://example.com/f.tgz /x", r"^line 2: ADD https://example\.com"
         r"/f\.tgz: a URL is not supported"),
        ("FROM base\nADD git@github.com:a/b.git /x", r"^line 2: ADD git@github\.com:a/b\.git: a"),
        ("FROM base\nCOPY missing.txt /x", r"^line 2: COPY missing\.txt: no such file"),
        ("FROM base\nCOPY conf run.sh /x", r"^line 2: COPY of several sources: the destination"),
        ("FROM base\nCOPY --chmod=rwx run.sh /x", r"^line 2: COPY --chmod=rwx: expected an octal"),
        ("FROM base\nCOPY --chown=a:b:c run.sh /x", r"^line 2: COPY --chown=a:b:c: expected"),
        ("FROM base\nCOPY --link run.sh /x", r"^line 2: COPY --link is not supported"),
        ("FROM base\nCOPY run.sh", r"^line 2: COPY needs a source and a destination"),
        ("FROM base\nUSER user:staff", r"^line 2: USER 'user:staff': expected a user name"),
        ("FROM base\nENV 1BAD=x", r"^line 2: ENV '1BAD': not a valid variable name"),
        ("FROM base\nENV A=1 B", r"^line 2: ENV 'B': expected name=value"),
        ("FROM base\nRUN", r"^line 2: RUN needs a command"),
        ("FROM base\nRUN python3 - <<EOF\nprint(1)\nEOF", r"^line 2: RUN with a heredoc"),
        ("FROM base\nCOPY <<'EOF' /x\nhi\nEOF", r"^line 2: COPY with a heredoc"),
        ("FROM base\nENV A=\"open", r"^line 2: unterminated \""),
        ("RUN true\nFROM base", r"^line 1: RUN before FROM"),
        ("# just a comment\n", r"^the Dockerfile has no FROM$"),
        ("# escape=`\nFROM base", r"^line 1: only '\\' is supported as the escape character"),
        ("FROM Bad!Ref", r"^line 1: FROM Bad!Ref: neither a template of this host nor an image"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_with_its_line(ctx, tmp_path, text, message):
    (tmp_path / "outside.txt").write_text("secret")
    (ctx / "escape").symlink_to(tmp_path / "outside.txt")
    (ctx / "escdir").symlink_to("/etc")
    with pytest.raises(InvalidRequest, match=message):
        p(text, ctx)


def test_label_and_expose_are_ignored_with_a_warning(ctx):
    df = p("FROM base\nLABEL org.x=y\nEXPOSE 8000/tcp\nRUN true", ctx)
    assert steps(df) == [("RUN", ["true"])]
    assert [w.split(":")[0] for w in df.warnings] == ["LABEL ignored", "EXPOSE ignored"]


def test_an_image_goes_to_the_image_import_when_there_is_one(ctx, monkeypatch):
    monkeypatch.setattr(images, "template_from_image", lambda rt, ref: ref, raising=False)
    df = p("FROM python:3.11-slim\nRUN true", ctx)
    assert (df.base, df.meta["image"]) == ("", "python:3.11-slim")
    assert dockerfile.parse is parse


# -- the CLI, end to end --------------------------------------------------------------------

SANDHOLD = str(Path(sys.executable).with_name("sandhold"))

DOCKERFILE = """\
# a template of our own, built from base
FROM base
ARG GREETING=hello
ARG PORT
ENV GREETING=${GREETING} \\
    APP_PORT=$PORT
LABEL purpose=test
USER root
WORKDIR /srv/app
COPY --chown=user site/ ./
RUN echo "built with $GREETING" > built.txt && mkdir -p /var/lib/app
USER user
CMD python3 -m http.server $APP_PORT
"""


@pytest.fixture
def cli_data_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sandhold-dockerfile-", dir="/var/tmp"))
    d.chmod(0o755)
    yield d
    settings = Settings(data_dir=d)
    try:
        rt = Runtime(settings).open()
        for info in rt.list():
            rt.kill(info.id)
    finally:
        for target in mounts.mounts_under(d):
            mounts.umount(Path(target))
        cgroups.remove_parent(cgroup_parent.name(settings))
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def cli(cli_data_dir):
    env = {**os.environ, "SANDHOLD_DATA_DIR": str(cli_data_dir), "COLUMNS": "200"}

    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([SANDHOLD, "template", *args], capture_output=True, text=True,
                           env=env, timeout=240)  # fmt: skip
        assert r.returncode == 0 or not ok, (args, r.returncode, r.stdout, r.stderr)
        return r

    return run


def row(listing: str, name: str) -> list[str]:
    """A template's cells in `template ls`'s table."""
    for line in listing.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃]", line)[1:-1]]
        if cells and cells[0] == name:
            return cells
    raise AssertionError(f"{name} not listed in:\n{listing}")


async def test_the_cli_builds_a_dockerfile_and_manages_templates(cli, cli_data_dir, tmp_path):
    data_dir = cli_data_dir
    site = tmp_path / "ctx" / "site"
    (site / "sub").mkdir(parents=True)
    (site / "index.html").write_text("<h1>served</h1>\n")
    (site / "sub" / "page.txt").write_text("page\n")
    (tmp_path / "ctx" / "Dockerfile").write_text(DOCKERFILE)
    build = ["build", "-f", str(tmp_path / "ctx" / "Dockerfile"), "--build-arg",
             "GREETING=bonjour", "--build-arg", "PORT=8000",
             "--ready-cmd", "curl -sf localhost:8000 >/dev/null"]  # fmt: skip
    r = cli(*build, "app")
    assert "LABEL ignored" in r.stderr
    assert "built template app: 3 layers" in r.stdout, r.stdout  # WORKDIR, COPY, RUN
    assert "[5/6] RUN export PORT=8000; echo" in r.stdout
    assert re.search(r"\[5/6\] RUN .* done \d+\.\d s", r.stdout), r.stdout
    assert "CACHED" not in r.stdout

    rt = Runtime(Settings(data_dir=data_dir)).open()
    info = rt.create({"template": "app"})  # its ready command passed: the CMD serves
    try:
        out = await sh(info, "pwd; id -un; echo $GREETING $APP_PORT; cat built.txt; "
                       "stat -c '%U %n' index.html sub/page.txt; stat -c %U /var/lib/app; "
                       "curl -sf localhost:8000/sub/page.txt")  # fmt: skip
        assert out.text.strip().split("\n") == [
            "/srv/app", "user", "bonjour 8000", "built with bonjour", "user index.html",
            "user sub/page.txt", "root", "page",
        ], out.text  # fmt: skip
    finally:
        rt.kill(info.id)

    # Unchanged: every step from the cache. A changed file: its COPY and what follows rebuilt.
    again = cli(*build, "app").stdout
    assert again.count("CACHED") == 3, again
    (site / "index.html").write_text("<h1>changed</h1>\n")
    changed = cli(*build, "app").stdout
    assert re.search(r"WORKDIR /srv/app\s+CACHED", changed), changed
    assert re.search(r"COPY site ./ user\s+done", changed), changed

    # A template built on it, then what ls, logs and rm say of both.
    (tmp_path / "Dockerfile.more").write_text("FROM app\nRUN touch /home/user/more\n")
    cli("build", "-f", str(tmp_path / "Dockerfile.more"), "more")
    listing = cli("ls").stdout
    assert row(listing, "app")[1:5] == ["host", "3", "-", "-"]
    assert row(listing, "more")[1:3] == ["host", "4"]
    assert row(listing, "base")[1:3] == ["host", "0"]
    logs = cli("logs", "app").stdout
    assert "info: [6/6] USER user" in logs and "info: built app: 3 layers" in logs
    assert cli("logs", "app", "--level", "error").stdout == ""
    r = cli("rm", "app", ok=False)
    assert r.returncode == 73 and "is what more is built on" in r.stderr, r.stderr
    r = cli("rm", "base", ok=False)
    assert r.returncode == 73 and "built in" in r.stderr
    layers = data_dir / "templates" / ".layers"
    kept = lambda: [d for d in layers.iterdir() if not d.name.startswith(".")]  # noqa: E731
    assert len(kept()) == 3 + 1  # (the rebuild collected the first COPY's and RUN's)
    assert "1 unused layers removed" in cli("rm", "more").stdout  # its own
    cli("rm", "app")
    assert kept() == []
    assert row(cli("ls").stdout, "base")
    r = cli("logs", "app", ok=False)
    assert r.returncode == 66 and "no build log" in r.stderr
    r = cli("rm", "app", ok=False)
    assert r.returncode == 66 and "does not exist" in r.stderr


def test_the_cli_refuses_bad_builds_and_leaves_nothing(cli, cli_data_dir, tmp_path):
    data_dir = cli_data_dir
    bad = tmp_path / "Dockerfile.bad"
    bad.write_text("FROM base\nRUN true\nEXPOSE 80\nHEALTHCHECK CMD true\n")
    r = cli("build", "-f", str(bad), "bad", ok=False)
    assert r.returncode == 65 and "line 4: HEALTHCHECK is not supported" in r.stderr, r.stderr
    bad.write_text("FROM Not:An:Image\n")
    r = cli("build", "-f", str(bad), "bad", ok=False)
    assert r.returncode == 65 and "FROM Not:An:Image: neither a template" in r.stderr, r.stderr
    r = cli("build", "-f", str(bad), "base", ok=False)
    assert r.returncode == 73 and "built in" in r.stderr
    failing = tmp_path / "Dockerfile.fail"
    failing.write_text("FROM base\nUSER root\nWORKDIR /opt/w\nRUN echo partial; exit 3\n")
    r = cli("build", "-f", str(failing), "failing", ok=False)
    assert r.returncode == 70 and "exit code 3" in r.stderr and "partial" in r.stderr, r.stderr
    assert "partial" in r.stdout  # the step's output, as it ran
    assert "failing" not in cli("ls").stdout
    assert list((data_dir / "sandboxes").glob("*")) == []  # no build sandbox left
    logs = cli("logs", "failing", "--level", "error").stdout
    assert logs.count("error: build failed") == 1 and "exit code 3" in logs
    r = cli("build", "--cpu", "2", "x", ok=False)
    assert r.returncode == 2 and "go(es) with -f" in r.stderr


def test_ctrl_c_cancels_a_cli_build_and_leaves_nothing(cli_data_dir, tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM base\nRUN echo started; sleep 600\n")
    env = {**os.environ, "SANDHOLD_DATA_DIR": str(cli_data_dir), "COLUMNS": "200"}
    with subprocess.Popen([SANDHOLD, "template", "build", "-f", str(tmp_path / "Dockerfile"),
                           "slow"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None
            for line in proc.stdout:  # (the progress view prints the step's output as it runs)
                if "started" in line:
                    break
            proc.send_signal(signal.SIGINT)
            proc.wait(120)  # the step's sandbox is killed: no waiting for its sleep
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode != 0
    rt = Runtime(Settings(data_dir=cli_data_dir)).open()
    assert rt.list() == [] and not rt.templates.exists("slow")
    log = (cli_data_dir / "template-builds" / "slow.log").read_text()
    assert "build cancelled" in log
