"""`sandhold template build -f Dockerfile NAME`: a Dockerfile (runtime/templates/dockerfile.py)
built with the template builder (runtime/templates/build.py), its progress shown live, its log
kept for `sandhold template logs`. Templates built here are the operator's: no owner, public."""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.status import Status
from rich.text import Text

from sandhold.cli.common import console, err
from sandhold.errors import Conflict, InvalidRequest, SandholdError

if TYPE_CHECKING:
    from sandhold.runtime.runtime import Runtime
    from sandhold.runtime.templates.store import Template

_LABEL = re.compile(r"^(CACHED )?\[\d+/\d+\] (\S+)")


class _Elapsed:
    """A running step's line: its label and the time it has taken so far (re-rendered by the
    spinner at each refresh)."""

    def __init__(self, label: str) -> None:
        self.label, self.t0 = label, time.monotonic()

    def seconds(self) -> float:
        return time.monotonic() - self.t0

    def __rich__(self) -> Text:
        return Text.assemble(self.label, (f"  {self.seconds():.1f} s", "cyan"))


class Progress:
    """A BuildLog's ``then``: one line per step (its label, CACHED, or its time once done),
    a running step's output dimmed under it, a spinner line while it runs."""

    def __init__(self, out: Console) -> None:
        self.out = out
        self.status: Status | None = None
        self.running: _Elapsed | None = None

    def __call__(self, level: str, message: str) -> None:
        m = _LABEL.match(message)
        if m and m[1]:
            self.print(Text.assemble(message[len(m[1]) :], ("  CACHED", "blue")))
        elif m and m[2] in ("ENV", "USER"):  # no build sandbox: nothing runs
            self.print(Text(message))
        elif m:
            self.stop()
            self.running = _Elapsed(message)
            self.status = self.out.status(self.running, spinner="dots")
            self.status.start()
        elif message.startswith("done in ") and self.running is not None:
            label, seconds = self.running.label, self.running.seconds()
            self.stop()
            self.print(Text.assemble(label, (f"  done {seconds:.1f} s", "green")))
        else:
            self.print(Text(message, style="red" if level == "error" else "dim"))

    def print(self, text: Text) -> None:
        self.out.print(text, soft_wrap=True)  # one line each, whatever the width

    def stop(self) -> None:
        if self.status is not None:
            self.status.stop()
        self.status = self.running = None


def build_args(given: list[str]) -> dict[str, str]:
    """``NAME=VALUE`` pairs; ``NAME`` alone takes this environment's value (as Docker does)."""
    out: dict[str, str] = {}
    for a in given:
        name, eq, value = a.partition("=")
        if not name or (not eq and name not in os.environ):
            raise InvalidRequest(f"--build-arg {a!r}: expected NAME=VALUE")
        out[name] = value if eq else os.environ[name]
    return out


def check_name(rt: Runtime, name: str, base: Template | None = None) -> None:
    """Refuse a name the CLI must not (re)build: a built-in, a team's build, a template whose
    own root filesystem another template (or this build) stands on."""
    from sandhold.runtime.spec import NAME_RE, NAME_RULE
    from sandhold.runtime.templates.store import BUILTIN_TEMPLATES

    if not NAME_RE.match(name):
        raise InvalidRequest(f"template name {name!r} is not valid: {NAME_RULE}")
    if name == "base" or name in BUILTIN_TEMPLATES:
        raise Conflict(f"template {name!r} is built in; choose another name")
    if not rt.templates.exists(name):
        return
    old = rt.templates.get(name)
    if old.owner is not None:
        raise Conflict(
            f"template {name!r} is a team's build (through the server); choose another name"
        )
    if not owns_rootfs(rt, old):  # one built on it keeps its layers: they are its too
        return
    users = sorted(
        {*dependents(rt, old), *([base.name] if base and base.rootfs == old.rootfs else [])}
    )
    if users:
        raise Conflict(
            f"template {name!r} has its own root filesystem, which "
            f"{', '.join(users)} stand(s) on; choose another name"
        )


def owns_rootfs(rt: Runtime, t: Template) -> bool:
    return Path(t.rootfs).parent == rt.templates.root / t.name


def dependents(rt: Runtime, t: Template) -> list[str]:
    """The templates built on ``t``: on its own root filesystem, or on all of its layers
    and more (a template with exactly ``t``'s layers, say an identical build, is not)."""
    out = []
    for o in rt.templates.list():
        if o.name == t.name or o.rootfs != t.rootfs:
            continue
        n = len(t.layers)
        if owns_rootfs(rt, t) or (n and len(o.layers) > n and o.layers[-n:] == t.layers):
            out.append(o.name)
    return out


def build_dockerfile(
    rt: Runtime,
    name: str,
    file: Path,
    context: Path | None,
    args: list[str],
    no_cache: bool,
    cpu: float | None,
    memory_mb: int | None,
    ready_cmd: str | None,
) -> Template:
    from sandhold.runtime.templates import dockerfile
    from sandhold.runtime.templates.build import Builder, BuildLog, BuildRequest

    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"cannot read the Dockerfile {file}: {e}") from None
    for what, v in (("--cpu", cpu), ("--memory-mb", memory_mb)):
        if v is not None and v <= 0:
            raise InvalidRequest(f"{what} must be positive")
    check_name(rt, name)
    ctx = (context or file.parent).resolve()
    with tempfile.TemporaryDirectory(prefix="sandhold-build-") as tmp:
        df = dockerfile.parse(text, ctx, Path(tmp), rt.templates, build_args(args))
        base = _image_base(rt, df.meta["image"]) if df.meta.get("image") else df.base
        check_name(rt, name, rt.templates.get(base))
        if ready_cmd and not df.start_cmd:
            raise InvalidRequest(
                "--ready-cmd goes with a start command: the Dockerfile has no CMD or ENTRYPOINT"
            )
        for w in df.warnings:
            err.print(f"[yellow]warning[/yellow]: {escape(w)}")
        progress = Progress(console)
        log = BuildLog(rt.host, name, then=progress)
        log("info", f"building {name} from {file} (context {ctx}), on {base}")
        req = BuildRequest(
            name=name,
            base=base,
            steps=df.steps,
            start_cmd=df.start_cmd,
            ready_cmd=ready_cmd,
            force=no_cache,
            cpu=cpu,
            memory_mb=memory_mb,
            meta={"owner": None, "public": True},
        )
        try:
            t0 = time.monotonic()
            tpl = Builder(rt, df.archives.__getitem__).build(req, log)
            log.then = None  # the command says so itself
            log("info", f"built {name}: {len(tpl.layers)} layers in {time.monotonic() - t0:.1f} s")
            return tpl
        except SandholdError as e:
            log("error", f"build failed: {e.message}")
            raise
        except KeyboardInterrupt:
            log("error", "build cancelled")
            raise
        finally:
            progress.stop()
            log.close()


def _image_base(rt: Runtime, ref: str) -> str:
    """The template of image ``ref``: pulled once per digest (runtime/templates/from_image.py)."""
    from sandhold.runtime.templates.from_image import from_image

    return from_image(rt.host, ref).name
