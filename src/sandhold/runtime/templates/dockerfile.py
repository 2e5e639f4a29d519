"""A Dockerfile subset read into a template build's steps (build.py), for ``sandhold template
build -f Dockerfile NAME``: one stage ``FROM <template of the store>``, RUN (shell or exec
form), COPY / ADD of the build context's files (``--chown``, ``--chmod``, globs; a local tar is
copied, not extracted), ENV, ARG (``--build-arg`` overrides; substituted, as Docker does, in
FROM, COPY, ADD, ENV, ARG, WORKDIR and USER, and in each RUN's environment), WORKDIR, USER, and
CMD / ENTRYPOINT (the start command, one shell command line). LABEL and EXPOSE are ignored with
a warning; anything else is refused with its line number.

A COPY's sources stay inside the context (no absolute path, no ``..`` out, no symlink resolving
out). Its files go into a gzipped tar relative to the context, named by its files hash: sha256
of the instruction and each file's path, type, mode and contents (not its times), so a changed
file rebuilds from that step and an unchanged one keeps the cache. ``Dockerfile.archives``
(hash -> archive) is what the Builder's ``upload`` looks up.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import posixpath
import re
import shlex
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandhold.errors import InvalidRequest
from sandhold.runtime.spec import ENV_KEY_RE
from sandhold.runtime.templates import oci
from sandhold.runtime.templates.build import Step

if TYPE_CHECKING:
    from sandhold.runtime.templates.store import TemplateStore

SUPPORTED = ("FROM", "RUN", "COPY", "ADD", "ENV", "ARG", "WORKDIR", "USER", "CMD", "ENTRYPOINT")
IGNORED = {
    "LABEL": "templates have no labels",
    "EXPOSE": "every port a sandbox listens on is reachable",
}
_VAR = re.compile(
    r"\$(?:\{(?P<b>[A-Za-z_]\w*)(?::(?P<op>[-+])(?P<w>[^}]*))?\}"
    r"|(?P<n>[A-Za-z_]\w*))"
)
_FLAG = re.compile(r"--([A-Za-z-]+)(?:=(\S*))?\s*")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")  # a user or group
_URL = re.compile(r"^([a-z][a-z0-9+.-]*://|git@)", re.I)


@dataclass
class Dockerfile:
    base: str  # the template it is built on ("" when ``meta["image"]`` names an image)
    steps: list[Step]
    start_cmd: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # "image"; "args": the ARGs' values
    archives: dict[str, Path] = field(default_factory=dict)  # a COPY's files hash -> tar.gz
    warnings: list[str] = field(default_factory=list)


def parse(
    text: str,
    context: Path,
    tmp: Path,
    store: TemplateStore,
    build_args: dict[str, str] | None = None,
) -> Dockerfile:
    """Read ``text``: COPY sources relative to ``context``, archives written in ``tmp``, FROM
    looked up in ``store``. Raises ``InvalidRequest`` naming the line and what is wrong."""
    if not context.is_dir():
        raise InvalidRequest(f"the build context {context} is not a directory")
    p = _Parser(context, tmp, store, dict(build_args or {}))
    for n, line in _lines(text):
        try:
            p.instruction(line)
        except InvalidRequest as e:
            raise InvalidRequest(f"line {n}: {e.message}") from None
    if p.out is None:
        raise InvalidRequest("the Dockerfile has no FROM")
    if unused := sorted(set(p.build_args) - p.declared):
        p.out.warnings.append(f"build args no ARG declares: {', '.join(unused)}")
    p.out.start_cmd = p.start_cmd()
    p.out.meta["args"] = dict(p.args)
    return p.out


def _lines(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction): continuations joined, comments and blanks gone."""
    out: list[tuple[int, str]] = []
    buf: list[str] = []
    start = 0
    for n, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        if not out and not buf and (m := re.match(r"#\s*escape\s*=\s*(\S)", s)) and m[1] != "\\":
            raise InvalidRequest(f"line {n}: only '\\' is supported as the escape character")
        if not s or s.startswith("#"):
            continue  # inside a continuation too, as Docker does
        start = start if buf else n
        buf.append(re.sub(r"\\[ \t]*$", "", raw))
        if buf[-1] == raw:
            out.append((start, "".join(buf).strip()))
            buf = []
    return [*out, (start, "".join(buf).strip())] if buf else out


def words(text: str, vars: dict[str, str], split: bool = True) -> list[str]:
    """Docker's word processing: quotes removed, ``\\`` escapes, ``$NAME``, ``${NAME}``,
    ``${NAME:-word}``, ``${NAME:+word}`` substituted (not within single quotes), split on
    unquoted whitespace (one word when not ``split``)."""
    out: list[str] = []
    cur: list[str] = []
    have, quote, i = False, "", 0
    while i < len(text):
        c, nxt = text[i], text[i + 1 : i + 2]
        i += 1
        if split and not quote and c.isspace():
            if have:
                out.append("".join(cur))
            cur, have = [], False
            continue
        have = True
        if c == "\\" and nxt and (not quote or (quote == '"' and nxt in '"\\$')):
            cur.append(nxt)
            i += 1
        elif c in "'\"" and quote in ("", c):
            quote = "" if quote else c
        elif c == "$" and quote != "'" and (m := _VAR.match(text, i - 1)):
            val = vars.get(m["b"] or m["n"], "")
            cur.append({"-": val or m["w"], "+": m["w"] if val else ""}.get(m["op"], val))
            i = m.end()
        else:
            cur.append(c)
    if quote:
        raise InvalidRequest(f"unterminated {quote} in {text!r}")
    return [*out, "".join(cur)] if have else out


def _word(text: str, vars: dict[str, str]) -> str:
    return (words(text, vars, split=False) or [""])[0]


def _exec_form(rest: str) -> list[str] | None:
    """The JSON form's words; None for the shell form (also what Docker makes of bad JSON)."""
    try:
        v = json.loads(rest) if rest.startswith("[") else None
    except ValueError:
        return None
    return v if isinstance(v, list) and all(isinstance(a, str) for a in v) else None


class _Parser:
    def __init__(
        self, context: Path, tmp: Path, store: TemplateStore, build_args: dict[str, str]
    ) -> None:
        self.context, self.real_ctx = context, os.path.realpath(context)
        self.tmp, self.store, self.build_args = tmp, store, build_args
        self.out: Dockerfile | None = None
        self.args: dict[str, str] = {}  # the ARGs in scope that have a value
        self.global_args: dict[str, str] = {}  # those declared before FROM
        self.declared: set[str] = set()
        self.env: dict[str, str] = {}  # the image's so far
        self.cmd: str | list[str] | None = None  # the last CMD (exec form: a list)
        self.entrypoint: str | list[str] | None = None

    def vars(self) -> dict[str, str]:
        return {**self.args, **self.env}  # an ENV overrides an ARG of the same name

    def instruction(self, line: str) -> None:
        name, rest = [*re.split(r"\s+", line, maxsplit=1), ""][:2]
        name = name.upper()
        if name in IGNORED:
            return self.warn(f"{name} ignored: {IGNORED[name]}")
        if name not in SUPPORTED:
            raise InvalidRequest(
                f"{name} is not supported (supported: {', '.join(SUPPORTED)}; "
                f"{', '.join(IGNORED)} are ignored)"
            )
        flags: dict[str, str] = {}
        while name in ("FROM", "RUN", "COPY", "ADD") and (f := _FLAG.match(rest)):
            flags[f[1].lower()], rest = f[2] or "", rest[f.end() :]
        for flag in flags:
            if flag == "from":
                raise InvalidRequest(f"{name} --from: multi-stage builds are not supported")
            if flag not in ("chown", "chmod") or name not in ("COPY", "ADD"):
                raise InvalidRequest(f"{name} --{flag} is not supported")
        if name in ("RUN", "COPY", "ADD") and re.search(r"<<-?(['\"]?)[A-Za-z_]\w*\1(\s|$)", rest):
            raise InvalidRequest(f"{name} with a heredoc (<<EOF) is not supported")
        if name not in ("ARG", "FROM") and self.out is None:
            raise InvalidRequest(f"{name} before FROM")
        getattr(self, f"i_{name.lower()}")(rest, flags)

    def warn(self, message: str) -> None:
        if self.out is not None:
            self.out.warnings.append(message)

    def step(self, type_: str, args: list[str], files_hash: str | None = None) -> None:
        assert self.out is not None
        self.out.steps.append(Step(type_, args, files_hash))

    def i_arg(self, rest: str, flags: dict[str, str]) -> None:
        scope = self.args if self.out is not None else self.global_args
        for w in words(rest, self.vars() if self.out else self.global_args) or [""]:
            key, eq, default = w.partition("=")
            if not ENV_KEY_RE.match(key):
                raise InvalidRequest(f"ARG {w!r}: not a valid name")
            self.declared.add(key)
            value = self.build_args.get(key, default if eq else self.global_args.get(key))
            if value is not None:
                scope[key] = value

    def i_from(self, rest: str, flags: dict[str, str]) -> None:
        if self.out is not None:
            raise InvalidRequest("a second FROM: multi-stage builds are not supported")
        ws = words(rest, self.global_args)
        if len(ws) == 3 and ws[1].lower() == "as":
            raise InvalidRequest(f"FROM {ws[0]} AS {ws[2]}: multi-stage builds are not supported")
        if len(ws) != 1:
            raise InvalidRequest(f"FROM {rest!r}: expected one template name")
        if self.store.exists(ref := ws[0]):
            self.out = Dockerfile(ref, [])
            self.env = dict(self.store.get(ref).env)
            return
        try:
            oci.parse_reference(ref)  # an image, pulled by the build (from_image.py)
        except InvalidRequest:
            raise InvalidRequest(
                f"FROM {ref}: neither a template of this host nor an image reference"
            ) from None
        self.out = Dockerfile("", [], meta={"image": ref})

    def i_run(self, rest: str, flags: dict[str, str]) -> None:
        argv = _exec_form(rest)
        cmd = shlex.join(argv) if argv is not None else rest
        if not cmd.strip():
            raise InvalidRequest("RUN needs a command")
        if scoped := {k: v for k, v in self.args.items() if k not in self.env}:
            cmd = f"export {' '.join(f'{k}={shlex.quote(v)}' for k, v in scoped.items())}; {cmd}"
        self.step("RUN", [cmd])

    def i_env(self, rest: str, flags: dict[str, str]) -> None:
        key, value = [*re.split(r"\s+", rest, maxsplit=1), ""][:2]
        if "=" not in key:  # the old form, ``ENV name the value``
            pairs = [_word(key, {}), _word(value, self.vars())]
        else:
            pairs = []
            for w in words(rest, self.vars()):
                k, eq, v = w.partition("=")
                if not eq:
                    raise InvalidRequest(f"ENV {w!r}: expected name=value")
                pairs += [k, v]
        for k in pairs[::2]:
            if not ENV_KEY_RE.match(k):
                raise InvalidRequest(f"ENV {k!r}: not a valid variable name")
        self.env.update(zip(pairs[::2], pairs[1::2], strict=True))
        self.step("ENV", pairs)

    def i_workdir(self, rest: str, flags: dict[str, str]) -> None:
        if not (path := _word(rest, self.vars()).strip()):
            raise InvalidRequest("WORKDIR needs a path")
        self.step("WORKDIR", [path])

    def i_user(self, rest: str, flags: dict[str, str]) -> None:
        if not _NAME.match(user := _word(rest, self.vars()).strip()):
            raise InvalidRequest(f"USER {user!r}: expected a user name (without a group)")
        self.step("USER", [user])

    def i_cmd(self, rest: str, flags: dict[str, str], what: str = "CMD") -> None:
        argv = _exec_form(rest)
        if argv is None and not rest:
            raise InvalidRequest(f"{what} needs a command")
        setattr(self, what.lower(), argv if argv is not None else rest)

    def i_entrypoint(self, rest: str, flags: dict[str, str]) -> None:
        self.i_cmd(rest, flags, "ENTRYPOINT")

    def start_cmd(self) -> str | None:
        """Docker's rules: a shell-form ENTRYPOINT runs alone; an exec-form one gets CMD's
        words (a shell-form CMD as ``/bin/sh -c``); without ENTRYPOINT, CMD."""
        ep, cmd = self.entrypoint, self.cmd
        if isinstance(ep, str):
            if cmd is not None:
                self.warn("CMD ignored: a shell-form ENTRYPOINT takes no CMD")
            return ep
        if ep is not None:
            tail = [] if cmd is None else cmd if isinstance(cmd, list) else ["/bin/sh", "-c", cmd]
            return shlex.join([*ep, *tail]) or None
        return (shlex.join(cmd) or None) if isinstance(cmd, list) else cmd

    def i_add(self, rest: str, flags: dict[str, str]) -> None:
        for s in (_exec_form(rest) or words(rest, self.vars()))[:-1]:
            if _URL.match(s):
                raise InvalidRequest(f"ADD {s}: a URL is not supported (download it in a RUN)")
        self.i_copy(rest, flags, "ADD")

    def i_copy(self, rest: str, flags: dict[str, str], what: str = "COPY") -> None:
        argv, vars = _exec_form(rest), self.vars()
        args = [_word(a, vars) for a in argv] if argv is not None else words(rest, vars)
        if len(args) < 2:
            raise InvalidRequest(f"{what} needs a source and a destination")
        srcs, dest = args[:-1], args[-1]
        if len(srcs) > 1 and not dest.endswith("/"):
            raise InvalidRequest(f"{what} of several sources: the destination must end with /")
        owner, _, group = flags.get("chown", "").partition(":")
        if "chown" in flags and not all(_NAME.match(n) for n in (owner, group or owner)):
            raise InvalidRequest(f"{what} --chown={flags['chown']}: expected user[:group]")
        if (mode := flags.get("chmod", "")) and not re.fullmatch(r"[0-7]{3,4}", mode):
            raise InvalidRequest(f"{what} --chmod={mode}: expected an octal mode such as 0755")
        patterns, matched, entries = self.sources(what, srcs)
        files_hash = _files_hash([what, patterns, dest, owner, group, mode], entries)
        archive = self.tmp / f"{files_hash}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            for rel, real in sorted(entries.items()):
                if rel != ".":
                    tar.add(real, arcname=rel, recursive=False, filter=_anonymous)
        assert self.out is not None
        self.out.archives[files_hash] = archive
        # no --chown: root's, as in Docker; an E2B COPY without a user is the current user's
        self.step("COPY", [" ".join(patterns), dest, owner or "root", mode], files_hash)
        if group and group != owner:  # the COPY step gives the user's own group
            self.step("RUN", [_chgrp(group, dest, matched, entries), "root"])

    def sources(self, what: str, srcs: list[str]) -> tuple[list[str], list[str], dict[str, str]]:
        """The normalised patterns, what they match (relative to the context) and the files
        to archive: path in the archive -> file (a matched symlink followed, as Docker does;
        those below a matched directory kept as they are)."""
        patterns, matched, entries = [], [], {}
        for src in srcs:
            pattern = posixpath.normpath(src)
            if src.startswith("/") or pattern == ".." or pattern.startswith("../"):
                raise InvalidRequest(f"{what} {src}: outside the build context")
            if re.search(r"\s", pattern):
                raise InvalidRequest(f"{what} {src!r}: a source with whitespace is not supported")
            found = sorted(glob.glob(pattern, root_dir=self.context, include_hidden=True))
            if not found:
                raise InvalidRequest(f"{what} {src}: no such file in the build context")
            patterns.append(pattern)
            for m in map(posixpath.normpath, found):
                real = entries[m] = os.path.realpath(self.context / m)
                if real != self.real_ctx and not real.startswith(self.real_ctx + os.sep):
                    raise InvalidRequest(f"{what} {m}: resolves outside the build context")
                if not os.path.exists(real):
                    raise InvalidRequest(f"{what} {m}: a broken symlink")
                matched.append(m)
                for dirpath, dirnames, filenames in os.walk(real):
                    for n in (*dirnames, *filenames):
                        full = os.path.join(dirpath, n)
                        if stat.S_IFMT(os.lstat(full).st_mode) in _KEPT:
                            entries[posixpath.normpath(f"{m}/{os.path.relpath(full, real)}")] = full
        return patterns, matched, entries


_KEPT = (stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK)  # no devices, fifos, sockets


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid, info.gid, info.uname, info.gname = 0, 0, "", ""
    return info


def _files_hash(header: list[Any], entries: dict[str, str]) -> str:
    h = hashlib.sha256(json.dumps(header).encode())
    for rel, real in sorted(entries.items()):
        st = os.lstat(real)
        h.update(f"\0{rel}\0{stat.S_IFMT(st.st_mode)}\0{st.st_mode & 0o7777}\0".encode())
        if stat.S_ISLNK(st.st_mode):
            h.update(os.readlink(real).encode())
        elif stat.S_ISREG(st.st_mode):
            with open(real, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
    return h.hexdigest()


def _chgrp(group: str, dest: str, matched: list[str], entries: dict[str, str]) -> str:
    """The RUN giving ``group`` to what a COPY put in ``dest`` (build.py's COPY_SCRIPT rules)."""
    q = shlex.quote
    if len(matched) == 1 and not os.path.isdir(entries[matched[0]]) and not dest.endswith("/"):
        d, base = q(dest), q(posixpath.basename(matched[0]))
        return f'd={d}; if [ -d "$d" ]; then d="$d"/{base}; fi; chgrp -h -- {q(group)} "$d"'
    names = set()
    for m in matched:
        if not os.path.isdir(entries[m]):
            names.add(posixpath.basename(m))
            continue
        parent = "" if m == "." else m  # a directory's entries go into dest, not it
        names |= {
            posixpath.basename(r)
            for r in entries
            if r not in (m, ".") and posixpath.dirname(r) == parent
        }
    paths = " ".join(q(posixpath.join(dest, n)) for n in sorted(names))
    return f"chgrp -R -h -- {q(group)} {paths}" if paths else "true"
