"""Hostile images and build steps against the host, through the official SDK: a real registry on
loopback holds images whose links point at canary directories of the host; building templates of
them and starting sandboxes must leave every canary as it was (files, owners, modes), keep the
server healthy and leave no staging directory behind. Also: a step that nests directories 1,500
deep builds, and nothing privileged (setuid bits, file capabilities, device nodes, host ids) from
an image reaches the template's root."""

from __future__ import annotations

import json
import os
import secrets
import stat
import struct
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, Template
from e2b.exceptions import BuildException

from sandhold.errors import InvalidRequest
from sandhold.runtime import mounts
from sandhold.runtime.runtime import Runtime
from sandhold.runtime.templates.build import Builder, BuildRequest, Step
from tests.e2b.test_template_images import tiny_root
from tests.runtime.test_oci import PASSWORD, USER, Registry, entry, push_image
from tests.support.e2b_server import Server, new_server

Entry = tuple[tarfile.TarInfo, bytes]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Iterator[Server]:
    srv = new_server(
        tmp_path_factory.mktemp("links"),
        template_build_allow_out="[]",
        template_image_ca_file=str(registry.ca),
        template_image_registries=json.dumps([registry.host]),
    )
    srv.start()
    yield srv
    srv.destroy()


@pytest.fixture
def canary() -> Iterator[Path]:
    """A host directory anyone may write (what bwrap, unprivileged, could be sent to), with the
    files a user setup would touch."""
    d = Path("/var/tmp") / f"sandhold-canary-{secrets.token_hex(4)}"
    d.mkdir(mode=0o755)
    d.chmod(0o1777)
    (d / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (d / "group").write_text("root:x:0:\n")
    (d / "keep").mkdir(mode=0o700)
    yield d
    for p in sorted(d.rglob("*"), key=lambda p: -len(p.parts)):
        p.rmdir() if p.is_dir() and not p.is_symlink() else p.unlink()
    d.rmdir()


def snapshot(d: Path) -> dict[str, tuple[int, int, int, bytes | None]]:
    """Every entry under ``d`` (and ``d``): mode, owner, group, content."""
    out = {}
    for p in [d, *d.rglob("*")]:
        st = p.lstat()
        data = p.read_bytes() if stat.S_ISREG(st.st_mode) else None
        out[str(p.relative_to(d))] = (st.st_mode, st.st_uid, st.st_gid, data)
    return out


def staging(server: Server) -> list[str]:
    """Directories a build works in that must not outlive it."""
    templates = server.data_dir / "templates"
    kinds = (".build-*", ".pull-*", ".old-*", ".layers/.new-*")
    return sorted(str(p.relative_to(templates)) for k in kinds for p in templates.glob(k))


def healthy(server: Server) -> bool:
    return httpx.get(f"{server.url}/health", timeout=10).status_code in (200, 204)


def image_with(registry: Registry, tmp: Path, entries: list[Entry]) -> str:
    repo = f"attack/{secrets.token_hex(4)}:1"
    push_image(registry, tmp, repo, [entries], {"Env": ["PATH=/usr/bin:/bin"]})
    return f"{registry.host}/{repo}"


def image_root(server: Server, ref: str) -> Path:
    """The root filesystem on disk of the template that image ``ref`` was imported as."""
    refs = json.loads((server.data_dir / "templates/.images.json").read_text())
    names = [name for key, name in refs.items() if ref in key]
    assert len(names) == 1, refs
    return server.data_dir / "templates" / names[0] / "rootfs"


def build(server: Server, ref: str, name: str, *steps: str) -> str:
    """Build a template of image ``ref`` (with ``steps`` as root); its name."""
    tpl = Template().from_image(ref, username=USER, password=PASSWORD)
    for cmd in steps:
        tpl = tpl.run_cmd(cmd, user="root")
    Template.build(tpl, name, **server.sdk())
    return name


def moved(entries: list[Entry], prefix: str, to: str) -> list[Entry]:
    """``entries`` with those under ``prefix`` moved under ``to``."""
    out = []
    for info, data in entries:
        if info.name == prefix or info.name.startswith(prefix + "/"):
            info.name = to + info.name[len(prefix) :]
        out.append((info, data))
    return out


def test_an_images_etc_and_home_links_never_reach_the_host(
    server: Server, registry: Registry, canary: Path, tmp_path: Path
) -> None:
    before = snapshot(canary)
    links = [
        entry("etc", "symlink", link=str(canary)),
        entry("home", "symlink", link=f"{canary}/keep"),
    ]
    root = [e for e in tiny_root() if not e[0].name.startswith("etc")]

    # The links lead nowhere inside the image: refused, by name.
    ref = image_with(registry, tmp_path, root + links)
    with pytest.raises(BuildException, match="dangling symlink"):
        build(server, ref, "links-nowhere")
    assert snapshot(canary) == before

    # The image has what they lead to: its own files are set up, the host's are not.
    inside = canary.relative_to("/").as_posix()
    own = moved([e for e in tiny_root() if e[0].name.startswith("etc")], "etc", inside)
    dirs = [entry(f"{inside}/", "dir"), entry(f"{inside}/keep/", "dir")]
    ref = image_with(registry, tmp_path, root + dirs + own + links)
    name = build(server, ref, "links-inside")
    sbx = Sandbox.create(name, **server.sdk())
    try:
        r = sbx.commands.run("cat /etc/passwd; test -d /home/user && echo home", user="root")
        assert "user:x:1000:1000" in r.stdout and "home\n" in r.stdout
    finally:
        sbx.kill()
    assert snapshot(canary) == before
    assert healthy(server) and staging(server) == []


@pytest.mark.parametrize("link", [".sandhold", "opt/sandhold"])
def test_an_images_mount_point_links_never_reach_the_host(
    server: Server, registry: Registry, canary: Path, tmp_path: Path, link: str
) -> None:
    """bwrap makes its mount points itself, following links: ``/.sandhold/usr`` (the host's
    Python for an image's agent) and ``/opt/sandhold/lib`` (the agent) made through a link to
    ``/oldroot/<dir>`` would be made in the host's ``<dir>``."""
    before = snapshot(canary)
    entries = [*tiny_root(), entry(link, "symlink", link=f"/oldroot{canary}")]
    if link.startswith("opt/"):
        entries.append(entry("opt/", "dir"))
    with pytest.raises(BuildException, match="symlink"):
        build(server, image_with(registry, tmp_path, entries), f"mp-{link.strip('./')[:3]}")
    assert snapshot(canary) == before
    assert healthy(server) and staging(server) == []


def test_a_layers_mount_point_link_never_reaches_the_host(server: Server, canary: Path) -> None:
    """A step of a template on ``base`` swaps the directory bound at /usr/local for a link to
    the host; sandboxes of that template refuse to start rather than bind the host's."""
    before = snapshot(canary)
    plant = f"mv /.sandhold-rw /.moved && ln -s /oldroot{canary} /.sandhold-rw"
    tpl = Template().from_base_image().run_cmd(plant, user="root")
    Template.build(tpl, "rw-link", **server.sdk())
    with pytest.raises(Exception, match="symlink"):
        Sandbox.create("rw-link", **server.sdk())
    assert snapshot(canary) == before
    assert healthy(server) and staging(server) == []


def test_a_workspace_link_planted_by_a_step_never_reaches_the_host(
    runtime: Runtime, canary: Path
) -> None:
    """bwrap binds a sandbox's workspace at /workspace, making it through a link: a step that
    left ``/workspace`` a link to ``/oldroot/<dir>/made`` would have it made on the host at each
    start of a sandbox of that template with a workspace. The start is refused instead."""
    before = snapshot(canary)
    plant = f"rmdir /workspace && ln -s /oldroot{canary}/made /workspace"
    Builder(runtime, {}.__getitem__).build(
        BuildRequest("ws-link", "base", [Step("RUN", [plant, "root"])]), lambda _l, _m: None
    )
    try:
        sandboxes = {i.id for i in runtime.list()}
        mounted = mounts.mounts_under(runtime.settings.data_dir / "sandboxes")
        with pytest.raises(InvalidRequest, match="workspace in the sandbox's root is a symlink"):
            runtime.create({"template": "ws-link", "workspace_id": "ws-link-1"})
        assert {i.id for i in runtime.list()} == sandboxes
        assert mounts.mounts_under(runtime.settings.data_dir / "sandboxes") == mounted
        assert snapshot(canary) == before
    finally:
        runtime.templates.remove("ws-link")


def test_a_step_nesting_1500_directories_builds(server: Server) -> None:
    deep = "/".join(["d"] * 1500)
    tpl = (
        Template()
        .from_base_image()
        .run_cmd(f"mkdir -p /home/user/{deep} && touch /home/user/{deep}/bottom")
    )
    Template.build(tpl, "deep", **server.sdk())
    sbx = Sandbox.create("deep", **server.sdk())
    try:
        assert sbx.commands.run(f"test -f /home/user/{deep}/bottom && echo ok").stdout == "ok\n"
    finally:
        sbx.kill()
    assert healthy(server) and staging(server) == []
    # (and a later build still works: nothing left in the layer store breaks it)
    Template.build(Template().from_base_image().run_cmd("true"), "after-deep", **server.sdk())


def capability(cap: int) -> str:
    """A file capability xattr (vfs_cap_data v2, effective) granting ``cap``, as a pax value."""
    raw = struct.pack("<5I", 0x02000001, 1 << cap, 0, 0, 0)
    return raw.decode("utf-8", "surrogateescape")


def test_nothing_privileged_from_an_image_reaches_its_template(
    server: Server, registry: Registry, tmp_path: Path
) -> None:
    setuid = entry("usr/bin/escalate", data=b"\x7fELF", mode=0o4755)
    hostid = entry("usr/bin/hostid", data=b"#!/bin/sh\n", mode=0o6755, uid=70000, gid=70000)
    capped = entry("usr/bin/capped", data=b"#!/bin/sh\n", mode=0o755)
    capped[0].pax_headers = {"SCHILY.xattr.security.capability": capability(13)}  # NET_RAW
    devices = [
        entry("dev/", "dir"),
        entry("dev/mem", "chardev", dev=(1, 1)),
        entry("srv/disk", "blockdev", dev=(8, 0)),
    ]
    ref = image_with(registry, tmp_path, [*tiny_root(), setuid, hostid, capped, *devices])
    name = build(server, ref, "privileged")

    root = image_root(server, ref)
    for rel in ("usr/bin/escalate", "usr/bin/hostid", "usr/bin/capped"):
        st = (root / rel).lstat()
        assert not st.st_mode & 0o6000, rel
        assert not os.listxattr(root / rel, follow_symlinks=False), rel
    assert (root / "usr/bin/hostid").lstat().st_uid != 70000  # (a host id: nobody's now)
    assert not (root / "dev/mem").exists() and not (root / "srv/disk").exists()
    sbx = Sandbox.create(name, **server.sdk())
    try:
        r = sbx.commands.run("test -u /usr/bin/escalate || test -g /usr/bin/hostid || echo none")
        assert r.stdout == "none\n"
    finally:
        sbx.kill()
