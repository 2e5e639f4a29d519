"""Templates: read-only root filesystems plus defaults (user, workdir, env).

Two kinds:

* ``host`` (the shipped ``base``): a small skeleton root of our own (``/etc`` curated from the
  host, ``/home/user``, ``/root``) with the host's ``/usr`` bound read-only. Built in well under a
  second, so a fresh CI machine needs no image download.
* ``rootfs``: a complete root filesystem (``debootstrap`` or any directory, e.g. an exported
  container image), used as the lower layer of the sandbox's overlay.

Everything in a template is owned by the *mapped* ids (host uid ``uid_base + n`` for sandbox uid
``n``), so sandbox root owns its root filesystem while being nobody on the host.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sandhold.errors import HostUnsupported, InvalidRequest, TemplateNotFound
from sandhold.runtime import safefs, staging
from sandhold.runtime.launcher import root_mount_points
from sandhold.runtime.spec import NAME_RE
from sandhold.runtime.templates import host_etc, oci, rootfs_owners

log = logging.getLogger(__name__)

SANDBOX_USER_UID = rootfs_owners.SANDBOX_USER_UID
# What root may do in a build step (install packages, chown what it copies), as in a container
# build, inside its user namespace only: agent/libc.py CAPS names them.
BUILD_CAPS = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SYS_CHROOT",
    "CAP_SETFCAP",
]
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_BIN = "/opt/sandhold/bin"  # commands of `base`'s own (after the host's, on its PATH)
SUDO_CLIENT = Path(__file__).parents[1] / "sudo_client.py"  # sandhold.runtime

# Where the store's work is staged (staging.py): a template's, the one it replaced, debootstrap's,
# an image's pull (from_image.py), a manifest fetch's (oci.py: its auth file too), a transfer
# to or from the fleet's store (service/fleet_templates.py).
BUILD, OLD, DEBOOTSTRAP, PULL = ".build-", ".old-", ".debootstrap-", ".pull-"
FLEET = ".fleet-"
STAGING = (BUILD, OLD, DEBOOTSTRAP, PULL, FLEET, oci.WORK)

# Templates that are built on first use: name -> "module:function(store, name) -> Template".
BUILTIN_TEMPLATES = {
    "code-interpreter-v1": "sandhold.interpreter.template:build_code_interpreter_template",
    "mcp-gateway": "sandhold.mcp_gateway.template:build_mcp_gateway_template",  # E2B's MCP
}


@dataclass
class Template:
    name: str
    kind: str  # "host" | "rootfs"
    rootfs: Path
    user: str = "user"
    workdir: str = "/home/user"
    env: dict[str, str] = field(default_factory=dict)
    ro_binds: list[tuple[str, str]] = field(default_factory=list)  # host path -> sandbox path
    # Long-running processes the agent starts at boot and restarts when they exit, e.g. the
    # code interpreter: {"name", "argv", "env", "user", "cwd", "port"}.
    services: list[dict[str, object]] = field(default_factory=list)
    created_at: float = 0.0
    disk_mb: int | None = None  # default disk budget of its sandboxes (settings' when unset)
    # Its sandboxes start from a checkpoint of one that has started its services (warm.py).
    warm: bool = False
    # Built from steps (build.py): read-only layers over ``rootfs``, the topmost first
    # (absolute paths of directories in the layer store, layers.py).
    layers: list[str] = field(default_factory=list)
    cpu: float | None = None  # default CPUs of its sandboxes (settings' when unset)
    memory_mb: int | None = None  # default memory of its sandboxes (settings' when unset)
    # E2B's view of a user-built template: whose it is (None: built in, everyone's), whether
    # other teams may use it, its template id and name, this build's id and tags.
    owner: str | None = None
    public: bool = True
    template_id: str | None = None
    alias: str | None = None
    build_id: str | None = None
    tags: list[str] = field(default_factory=list)
    # An image's template (from_image.py): the teams that proved they may pull the image,
    # who alone see it and, unless ``public``, use it; None: not an image's.
    teams: list[str] | None = None

    # Capabilities its root processes keep in their user namespace: build sandboxes' BUILD_CAPS;
    # code-interpreter-v1's (and what is built on it) file ones, for E2B's root kernels.
    root_caps: list[str] = field(default_factory=list)
    # Its root has no Python of ours (an image's, oci.py): the agent runs on the host's, bound
    # read-only at launcher.KIT_USR.
    agent_kit: bool = False
    # Directories under a read-only bind of the host's (``/usr/local`` of a template built on
    # `base`) that its sandboxes write, kept in their root (``.sandhold-rw/<dir>``) like any file.
    rw_dirs: list[str] = field(default_factory=list)
    # When its record last changed (a build, tags, public): the fleet's newest wins.
    updated_at: float = 0.0
    # Its place in the fleet's shared store (service/template_share.py), None if it was
    # never there: {"stub": its files not fetched yet, "layers": ids, "rootfs_of": the template
    # whose root it stands on | "root": its own root's object, "uid_base": the maker's}.
    fleet: dict[str, Any] | None = None

    @property
    def stub(self) -> bool:
        """Known from the fleet's store, its files not on this host yet."""
        return bool(self.fleet and self.fleet.get("stub"))

    def lowers(self) -> list[Path]:
        """The overlay's lower directories, the topmost first."""
        return [Path(p) for p in self.layers] + [self.rootfs]

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["rootfs"] = str(self.rootfs)
        return d

    @classmethod
    def from_json(cls, d: dict[str, object]) -> Template:
        d = dict(d)
        d["rootfs"] = Path(str(d["rootfs"]))
        d["ro_binds"] = [tuple(b) for b in d.get("ro_binds", [])]  # type: ignore[attr-defined]
        return cls(**d)  # type: ignore[arg-type]


@contextmanager
def flocked(path: Path, how: int = fcntl.LOCK_EX) -> Iterator[bool]:
    """``path``'s flock (the file made if missing), held while the context lasts; yields
    False instead when ``how`` has LOCK_NB and someone else holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, how)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def debian_archive(sources_dir: Path = Path("/etc/apt")) -> str:
    """The Debian archive this machine installs from (its apt sources' first ``deb`` URI),
    so no mirror's name is written here."""
    for f in sorted((sources_dir / "sources.list.d").glob("*.sources")):
        for stanza in f.read_text().split("\n\n"):
            fields = dict(
                line.split(":", 1)
                for line in stanza.splitlines()
                if ":" in line and not line.startswith("#")
            )
            if "deb" in fields.get("Types", "").split() and fields.get("URIs", "").strip():
                uri = fields["URIs"].split()[0]
                if "security" not in uri:
                    return uri
    listed = sources_dir / "sources.list"
    if listed.exists():
        for line in listed.read_text().splitlines():
            parts = line.split()
            if parts[:1] == ["deb"]:
                parts = [p for p in parts[1:] if not p.startswith("[")]
                if parts and "security" not in parts[0]:
                    return parts[0]
    raise HostUnsupported("no Debian archive in this machine's apt sources (/etc/apt)")


def _passwd(uid_home: dict[str, tuple[int, str]]) -> str:
    lines = []
    for name, (uid, home) in uid_home.items():
        lines.append(f"{name}:x:{uid}:{uid}:{name}:{home}:/bin/bash")
    lines.append("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin")
    return "\n".join(lines) + "\n"


def _group() -> str:
    return "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n"


class TemplateStore:
    def __init__(self, root: Path, uid_base: int) -> None:
        self.root = root
        self.uid_base = uid_base
        # Fetches a stub's files (a fleet host's, service/template_share.py); None: no store.
        self.fetch: Callable[[Template], Template] | None = None
        self.root.mkdir(parents=True, exist_ok=True)
        staging.sweep(self.root, STAGING)  # what work cut short by a crash left

    def _dir(self, name: str) -> Path:
        return self.root / name

    def list(self) -> list[Template]:
        out = []
        for d in sorted(self.root.iterdir()):
            meta = d / "template.json"
            if meta.exists():
                out.append(Template.from_json(json.loads(meta.read_text())))
        return out

    def exists(self, name: str) -> bool:
        """Whether ``get`` finds (or builds) ``name``, without building it."""
        return name == "base" or name in BUILTIN_TEMPLATES or self.built(name)

    def built(self, name: str) -> bool:
        """Whether ``name`` is on disk now (``get`` of a built-in one may build it first)."""
        return bool(NAME_RE.match(name)) and (self._dir(name) / "template.json").exists()

    def get(self, name: str) -> Template:
        if not NAME_RE.match(name):
            raise InvalidRequest(f"template name {name!r} is not valid")
        meta = self._dir(name) / "template.json"
        if not meta.exists():
            if name == "base":
                with self._build_lock():
                    if not meta.exists():
                        return self.build_base()
            elif name in BUILTIN_TEMPLATES:
                return self.build_builtin(name)
            else:
                # a team's own builds are not named: they are no one else's business
                shared = {t.name for t in self.list() if t.owner is None}
                known = ", ".join(sorted(shared | set(BUILTIN_TEMPLATES)))
                raise TemplateNotFound(f"template {name!r} does not exist (known: {known})")
        tpl = Template.from_json(json.loads(meta.read_text()))
        if tpl.stub:
            if self.fetch is None:
                raise TemplateNotFound(
                    f"template {name!r} is in the fleet's store, which this host cannot reach"
                )
            return self.fetch(tpl)
        return tpl

    def get_record(self, name: str) -> Template | None:
        """The template's record as it is on disk (a stub stays one), None if there is none."""
        meta = self._dir(name) / "template.json"
        if not NAME_RE.match(name) or not meta.exists():
            return None
        return Template.from_json(json.loads(meta.read_text()))

    def build_builtin(self, name: str) -> Template:
        """Build one of the templates Sandhold ships (the builder skips an up-to-date one)."""
        import importlib

        module, func = BUILTIN_TEMPLATES[name].split(":")
        builder = getattr(importlib.import_module(module), func)
        return builder(self, name)  # type: ignore[no-any-return]

    @contextmanager
    def _build_lock(self) -> Iterator[None]:
        with flocked(self.root / ".build.lock"):
            yield

    def swap_in(self, staged: Path, name: str) -> None:
        """Move a complete template directory into place in one rename (the one it replaces
        goes after), so a half-built template is never visible under its name."""
        final = self._dir(name)
        if final.exists():
            trash = staging.make(self.root, OLD)
            final.rename(trash / "t")
            staged.rename(final)
            safefs.remove_quietly(trash)
        else:
            staged.rename(final)

    def _commit(
        self, tpl: Template, staging: Path, rootfs: bool = True, made: bool = True
    ) -> Template:
        """Record ``tpl`` from its staging directory; ``rootfs``: its root is in there;
        ``made``: it is new (not a copy of one made elsewhere)."""
        if rootfs:
            tpl.rootfs = self._dir(tpl.name) / "rootfs"
        if made:
            tpl.created_at = tpl.updated_at = time.time()
        (staging / "template.json").write_text(json.dumps(tpl.to_json(), indent=2))
        self.swap_in(staging, tpl.name)
        return tpl

    def add(self, tpl: Template, made: bool = True) -> Template:
        """Record a template whose root is another's (a built one: build.py; a copy of one
        made elsewhere, ``made=False``), replacing one of the same name."""
        staging = self.staging_dir(tpl.name)
        return self.add_staged(tpl, staging, rootfs=False, made=made)

    def add_staged(
        self, tpl: Template, staging: Path, rootfs: bool = True, made: bool = True
    ) -> Template:
        """Record ``tpl`` from a staging directory of ``staging_dir()`` (``rootfs``: its root
        is in there); the directory is gone either way."""
        try:
            return self._commit(tpl, staging, rootfs, made)
        except BaseException:
            safefs.remove_quietly(staging)
            raise

    def update(self, tpl: Template, touch: bool = True) -> None:
        """Rewrite a template's record in place (its tags: service/builds.py); ``touch``: a
        change of this host's (not one learnt from the fleet's store)."""
        if touch:
            tpl.updated_at = time.time()
        meta = self._dir(tpl.name) / "template.json"
        part = meta.with_name(".template.json.new")
        part.write_text(json.dumps(tpl.to_json(), indent=2))
        part.rename(meta)

    def staging_dir(self, name: str) -> Path:
        if not NAME_RE.match(name):
            raise InvalidRequest(f"template name {name!r} is not valid")
        return staging.make(self.root, BUILD)

    def build_base(self, name: str = "base") -> Template:
        """The host-backed template: our skeleton root plus the host's /usr, read-only."""
        staging = self.staging_dir(name)
        try:
            rootfs = staging / "rootfs"
            for d in (
                "etc",
                "usr",
                "proc",
                "dev",
                "tmp",
                "run",
                "workspace",
                "opt",
                "var/tmp",
                "var/lib",
                "var/cache",
                "var/log",
                "mnt",
                "srv",
                "media",
            ):
                (rootfs / d).mkdir(parents=True, exist_ok=True)
            os.chmod(rootfs / "var/tmp", 0o1777)
            for link in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
                host = Path("/") / link
                if host.is_symlink():
                    (rootfs / link).symlink_to(os.readlink(host))
            host_etc.copy(rootfs / "etc")
            _builtin_uid_in_profile(rootfs / "etc/profile")
            (rootfs / "etc/passwd").write_text(
                _passwd({"root": (0, "/root"), "user": (SANDBOX_USER_UID, "/home/user")})
            )
            (rootfs / "etc/group").write_text(_group())
            (rootfs / "etc/hostname").write_text("sandbox\n")
            (rootfs / "etc/hosts").write_text("127.0.0.1\tlocalhost sandbox\n::1\tlocalhost\n")
            (rootfs / "etc/resolv.conf").write_text("# no network by default\n")
            # E2B's base has a `python` command; the host's /usr may not (python-is-python3).
            (rootfs / BASE_BIN.lstrip("/")).mkdir(parents=True)
            (rootfs / BASE_BIN.lstrip("/") / "python").symlink_to("/usr/bin/python3")
            # and passwordless sudo (setuid is void here: the agent runs it, sudo_client.py)
            sudo = rootfs / BASE_BIN.lstrip("/") / "sudo"
            sudo.write_text("#!/usr/bin/python3 -I\n" + SUDO_CLIENT.read_text())
            sudo.chmod(0o755)
            # login shells, the SDK's `commands.run`, take PATH from /etc/profile
            (rootfs / "etc/profile.d").mkdir(exist_ok=True)
            (rootfs / "etc/profile.d/sandhold.sh").write_text(
                f'case ":$PATH:" in *:{BASE_BIN}:*) ;; *) PATH="$PATH:{BASE_BIN}" ;; esac\n'
            )
            rootfs_owners.add_users(rootfs)
            rootfs_owners.shift_ownership(rootfs, self.uid_base)
            tpl = Template(
                name=name,
                kind="host",
                rootfs=rootfs,
                env={"PATH": f"{DEFAULT_PATH}:{BASE_BIN}", "LANG": "C.UTF-8"},
                ro_binds=[("/usr", "/usr")],
            )
            return self._commit(tpl, staging)
        except BaseException:
            safefs.remove_quietly(staging)
            raise

    def build_from_rootfs(
        self,
        name: str,
        source: Path,
        *,
        copy: bool = True,
        refuse_privileged: bool = False,
        **fields: object,
    ) -> Template:
        """Import a complete root filesystem directory (copied; the source is left untouched);
        ``fields`` set the Template's (an image's env, workdir, user, ``agent_kit``). What no
        sandbox may have (devices, setuid bits, file capabilities) is dropped, or the root
        refused with ``refuse_privileged``; so is one whose runtime mount points are links."""
        if not NAME_RE.match(name):
            raise InvalidRequest(f"template name {name!r} is not valid")
        if not fields.get("agent_kit"):
            with safefs.Root(source) as root:  # as the sandbox will see it: links in the root
                if root.kind("usr/bin") != stat.S_IFDIR:
                    raise InvalidRequest(
                        f"{source} does not look like a root filesystem (no usr/bin)"
                    )
                if root.kind("usr/bin/python3") != stat.S_IFREG:
                    raise InvalidRequest(
                        f"{source} has no /usr/bin/python3, which the in-sandbox agent needs"
                    )
        staging = self.staging_dir(name)
        try:
            rootfs = staging / "rootfs"
            if copy:
                subprocess.run(["cp", "-a", "--", str(source), str(rootfs)], check=True)
            else:
                source.rename(rootfs)
            rootfs_owners.add_users(rootfs)
            for point in root_mount_points(bool(fields.get("agent_kit"))):
                safefs.make_dirs(rootfs, point, 0o755, 0)  # bwrap would follow links there
            rootfs_owners.shift_ownership(rootfs, self.uid_base, refuse_privileged)
            tpl = Template(
                name=name,
                kind="rootfs",
                rootfs=rootfs,
                env={"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"},
            )
            for k, v in fields.items():
                setattr(tpl, k, v)
            return self._commit(tpl, staging)
        except BaseException:
            safefs.remove_quietly(staging)
            raise

    def build_debootstrap(
        self,
        name: str,
        suite: str = "bookworm",
        mirror: str | None = None,
        include: tuple[str, ...] = ("python3", "ca-certificates", "procps", "less", "curl"),
    ) -> Template:
        if shutil.which("debootstrap") is None:
            raise HostUnsupported("debootstrap is not installed (apt-get install debootstrap)")
        mirror = mirror or debian_archive()
        work = staging.make(self.root, DEBOOTSTRAP)
        try:
            target = work / "rootfs"
            cmd = [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(include)}",
                suite,
                str(target),
                mirror,
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
                raise InvalidRequest(f"debootstrap failed ({proc.returncode}): {' | '.join(tail)}")
            for d in ("var/cache/apt/archives",):
                safefs.remove_quietly(target / d)
                (target / d).mkdir(parents=True, exist_ok=True)
            return self.build_from_rootfs(name, target, copy=False)
        finally:
            safefs.remove_quietly(work)

    def remove(self, name: str) -> None:
        d = self._dir(name)
        if not (d / "template.json").exists():
            raise TemplateNotFound(f"template {name!r} does not exist")
        safefs.remove_tree(d)


def _builtin_uid_in_profile(profile: Path) -> None:
    """Debian's /etc/profile runs ``id`` (a fork and exec, ~1.3 ms) in every login shell, and
    every ``commands.run`` of the SDK is one (``bash -l -c``): bash's own ``$EUID`` says the
    same; other shells, which have none, still run ``id``."""
    if profile.is_file() and not profile.is_symlink():
        text = profile.read_text()
        profile.write_text(text.replace('"$(id -u)"', '"${EUID:-$(id -u)}"'))
