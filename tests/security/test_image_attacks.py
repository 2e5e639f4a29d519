"""Attacks through image pulls (issue 27, breaches 4 and 5 and the server-side request forgery),
through the official SDK against a real server with two teams and a real registry on loopback
(Debian's docker-registry, TLS and htpasswd, tests/runtime/test_oci.py):

* a private image one team pulled with credentials is not another team's, with no or wrong
  credentials (its build fails, its listing lacks it, a create by its name is "not found");
  with valid credentials of its own it is;
* a decompression bomb (0.5 MiB of gzip, 512 MiB of zeros) and paths deeper than the bound
  (by name, or through a symlink) are refused, leaving the data dir as it was;
* ``from_image`` naming a registry the operator did not allow is refused before any connection,
  and allowed registries that are not registries (a closed port, a port speaking something
  else) read the same.

Traffic goes to 127.0.0.1 only."""

from __future__ import annotations

import hashlib
import json
import os
import re
import select
import socket
import subprocess
import tarfile
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, Template
from e2b.exceptions import BuildException, SandboxException

from sandhold.errors import TemplateBuildFailed
from sandhold.runtime.templates import oci
from tests.e2b.test_template_images import tiny_root
from tests.runtime.test_oci import (
    PASSWORD,
    USER,
    Layout,
    Registry,
    entry,
    leftovers,
    push_image,
)
from tests.support.e2b_server import KEY_A, KEY_B, Server, new_server

BUDGET_MB = 64  # the server's template_build_disk_mb (the least it takes)
BANNER = b"SSH-2.0-OpenSSH_9.2p1\r\n"


class Listener:
    """A plain TCP port on loopback: ``banner`` answers each connection (then closes it); with
    ``accepting=False`` nothing accepts, so a connection would wait in the backlog."""

    def __init__(self, banner: bytes | None, accepting: bool = True) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.banner = banner
        self.accepted = 0
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True) if accepting else None
        if self.thread is not None:
            self.thread.start()

    def _serve(self) -> None:
        while not self.stop:
            if not select.select([self.sock], [], [], 0.1)[0]:
                continue
            conn, _ = self.sock.accept()
            self.accepted += 1
            with conn:
                if self.banner:
                    conn.sendall(self.banner)

    def pending(self) -> bool:
        """Whether a connection waits in the backlog (never accepted)."""
        return bool(select.select([self.sock], [], [], 0)[0])

    def close(self) -> None:
        self.stop = True
        if self.thread is not None:
            self.thread.join()
        self.sock.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def impostors() -> Iterator[dict[str, int]]:
    """Allowed "registries" that are none: a closed port, one that speaks another protocol, one
    that hangs up at once."""
    talker, mute = Listener(BANNER), Listener(None)
    yield {"closed": _closed_port(), "other protocol": talker.port, "hang-up": mute.port}
    talker.close()
    mute.close()


@pytest.fixture(scope="module")
def named_trap() -> Iterator[Listener]:
    """A port the operator allowed by host name (``localhost:PORT``), which resolves to
    loopback: nothing may connect to it."""
    trap = Listener(None, accepting=False)
    yield trap
    trap.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, registry: Registry,
           impostors: dict[str, int], named_trap: Listener) -> Iterator[Server]:  # fmt: skip
    allowed = [registry.host, *(f"127.0.0.1:{p}" for p in impostors.values()),
               f"localhost:{named_trap.port}"]  # fmt: skip
    srv = new_server(tmp_path_factory.mktemp("image-attacks"), template_build_allow_out="[]",
                     template_image_ca_file=str(registry.ca),
                     template_image_registries=json.dumps(allowed),
                     template_build_disk_mb=str(BUDGET_MB))  # fmt: skip
    srv.start()
    yield srv
    srv.destroy()


def _listed(server: Server, key: str) -> set[str]:
    with httpx.Client(base_url=server.url, headers={"X-API-KEY": key}) as api:
        return {t["templateID"] for t in api.get("/templates").json()}


def _images(server: Server) -> dict[str, str]:
    try:
        return dict(json.loads((server.data_dir / "templates/.images.json").read_text()))
    except FileNotFoundError:
        return {}


def _build_error(tpl: Template, name: str, server: Server, key: str = KEY_A) -> str:
    with pytest.raises((BuildException, SandboxException)) as e:
        Template.build(tpl, name, **server.sdk(key))
    return str(e.value)


def _du(path: Path) -> int:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def _staging(server: Server) -> list[str]:
    found = subprocess.run(["find", str(server.data_dir), "-xdev", "-name", ".oci-pull-*",
                            "-o", "-name", ".pull-*"], capture_output=True, text=True)  # fmt: skip
    return found.stdout.split()


# --- breach 4: a private image leaks to another team -------------------------------------------


def test_a_private_image_is_only_for_teams_that_prove_access(
    server: Server, registry: Registry, tmp_path: Path
) -> None:
    root = [*tiny_root(), entry("etc/secret", data=b"team a's image\n"),
            entry("disk", "blockdev", mode=0o666, dev=(8, 0))]  # fmt: skip
    push_image(registry, tmp_path, "private/app:1", [root])
    ref = f"{registry.host}/private/app:1"
    logs: list[str] = []
    Template.build(Template().from_image(ref, username=USER, password=PASSWORD), "a-app",
                   on_build_logs=lambda e: logs.append(e.message), **server.sdk(KEY_A))  # fmt: skip
    image = _images(server)[ref]
    assert image.startswith("img-") and image in _listed(server, KEY_A)
    dropped = [line for line in logs if "dropped 1 device node" in line and "disk" in line]

    # Team B, without credentials or with wrong ones: the build fails as the registry answers.
    for creds in ({}, {"username": USER, "password": "wrong-" + PASSWORD}):
        msg = _build_error(Template().from_image(ref, **creds), "b-steal", server, KEY_B)
        assert "unauthorized" in msg and PASSWORD not in msg
    assert not {t for t in _listed(server, KEY_B) if t.startswith("img-")}
    # ... and by its name it is "not found", as another team's private build is.
    a_build = next(t.name for t in server.runtime().templates.list() if t.owner == "team-a")
    errors = []
    for name in (image, a_build):
        with pytest.raises(SandboxException) as e:
            Sandbox.create(name, **server.sdk(KEY_B))
        errors.append((type(e.value), str(e.value).replace(name, "NAME")))
    assert errors[0] == errors[1] and "not found" in errors[0][1], errors
    msg = _build_error(Template().from_template(image), "b-base", server, KEY_B)
    assert "unknown base template" in msg
    with httpx.Client(base_url=server.url, headers={"X-API-KEY": KEY_B}) as api:
        assert api.get(f"/templates/aliases/{image}").status_code == 404

    # With valid credentials of its own, B proves access: the same template, now listed for B.
    logs.clear()
    Template.build(Template().from_image(ref, username=USER, password=PASSWORD), "b-app",
                   on_build_logs=lambda e: logs.append(e.message), **server.sdk(KEY_B))  # fmt: skip
    assert any(line.endswith(f"template {image}") for line in logs), logs
    assert image in _listed(server, KEY_B)
    sbx = Sandbox.create("b-app", **server.sdk(KEY_B))
    try:
        assert sbx.commands.run("cat /etc/secret", user="root").stdout == "team a's image\n"
    finally:
        sbx.kill()
    assert dropped, "A's build log names the device node its image lost"


# --- breach 5: bounded pulls -------------------------------------------------------------------


def _bomb_layer(size: int) -> tuple[bytes, str]:
    """A gzip layer holding one file of ``size`` zero bytes, made as a stream; with its
    diff id."""
    info = tarfile.TarInfo("bomb")
    info.size, info.mode, info.mtime = size, 0o644, 1_700_000_000
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # (gzip framing)
    diff, out = hashlib.sha256(), []
    zeros = bytes(1 << 20)
    chunks = [info.tobuf(tarfile.PAX_FORMAT)] + [zeros] * (size >> 20) + [bytes(1024)]
    for chunk in chunks:
        diff.update(chunk)
        out.append(packer.compress(chunk))
    out.append(packer.flush())
    return b"".join(out), "sha256:" + diff.hexdigest()


def _push_layers(reg: Registry, tmp: Path, repo_tag: str, layers: list[tuple[bytes, str]]) -> None:
    lay = Layout(tmp / f"layout-{repo_tag.replace('/', '-').replace(':', '-')}")
    descs = [lay.blob(data, "application/vnd.oci.image.layer.v1.tar+gzip") for data, _ in layers]
    cfg = {"architecture": oci.host_arch(), "os": "linux", "config": {},
           "rootfs": {"type": "layers", "diff_ids": [d for _, d in layers]}}  # fmt: skip
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": lay.blob(json.dumps(cfg).encode(),
                                   "application/vnd.oci.image.config.v1+json"),
                "layers": descs}  # fmt: skip
    lay.tag(lay.blob(json.dumps(manifest).encode(), str(manifest["mediaType"])))
    reg.push(lay.d, repo_tag)


def test_a_decompression_bomb_is_refused_and_leaves_nothing(
    server: Server, registry: Registry, tmp_path: Path
) -> None:
    bomb, diff_id = _bomb_layer(512 << 20)
    assert len(bomb) < 600 << 10  # half a MiB on the wire
    _push_layers(registry, tmp_path, "evil/bomb:1", [(bomb, diff_id)])
    ref = f"{registry.host}/evil/bomb:1"
    before, images = _du(server.data_dir), _images(server)
    msg = _build_error(Template().from_image(ref, username=USER, password=PASSWORD), "bomb",
                       server)  # fmt: skip
    assert f"image {ref} unpacks to more than {BUDGET_MB} MiB (template_build_disk_mb)" in msg
    assert _du(server.data_dir) - before < 1 << 20  # (the build's log and record, no more)
    assert _staging(server) == [] and _images(server) == images


DEPTH = 256  # template_unpack_max_depth's default


def _deep(n: int, prefix: str = "") -> list:
    return [entry(prefix + "d/" * i, "dir") for i in range(1, n + 1)]


@pytest.mark.parametrize("how", ["by-name", "through-a-symlink"])
def test_paths_deeper_than_the_bound_are_refused(
    server: Server, registry: Registry, tmp_path: Path, how: str
) -> None:
    if how == "by-name":
        layers = [[*_deep(DEPTH + 40), entry("d/" * (DEPTH + 40) + "f", data=b"x")]]
    else:  # every name is shallow enough; the tree is not
        half = DEPTH // 2 + 20
        link = entry("l", "symlink", link="d/" * half)
        layers = [_deep(half), [link], [*_deep(half, "l/"), entry("l/" + "d/" * half + "f")]]
    push_image(registry, tmp_path, f"evil/deep-{how}:1", layers)
    ref = f"{registry.host}/evil/deep-{how}:1"
    before, images = _du(server.data_dir), _images(server)
    msg = _build_error(Template().from_image(ref, username=USER, password=PASSWORD),
                       f"deep-{how}", server)  # fmt: skip
    assert f"deeper than {DEPTH} directories (template_unpack_max_depth)" in msg, msg
    assert _du(server.data_dir) - before < 1 << 20
    assert _staging(server) == [] and _images(server) == images


def test_declared_sizes_and_entries_are_bounded_before_unpacking(
    registry: Registry, tmp_path: Path
) -> None:
    """oci.pull itself: layers declared larger than the budget are never copied; more entries
    than the budget's inodes are never unpacked."""
    big = [entry("blob", data=os.urandom(2 << 20))]  # (incompressible: 2 MiB declared)
    push_image(registry, tmp_path, "evil/big:1", [big])
    many = [entry(f"f{i}", data=b"") for i in range(300)]
    push_image(registry, tmp_path, "evil/many:1", [many])
    dest = tmp_path / "out" / "rootfs"
    limits = oci.Bounds(1 << 20, 200, DEPTH)
    with pytest.raises(TemplateBuildFailed, match=r"unpacks to more than 1 MiB") as e:
        oci.pull(f"{registry.host}/evil/big:1", dest, username=USER, password=PASSWORD,
                 ca_file=registry.ca, limits=limits)  # fmt: skip
    assert "(template_build_disk_mb)" in str(e.value)
    with pytest.raises(TemplateBuildFailed, match=r"more than 200 files"):
        oci.pull(f"{registry.host}/evil/many:1", dest, username=USER, password=PASSWORD,
                 ca_file=registry.ca, limits=limits)  # fmt: skip
    assert not dest.exists() and leftovers(dest.parent) == []


def test_a_size_hidden_behind_a_second_pax_header_is_counted(
    registry: Registry, tmp_path: Path
) -> None:
    """Go's tar reader (umoci's) keeps only the last pax header before an entry: a first one
    saying ``size=0`` must not hide the 2 MiB the entry's own header announces."""
    pax = tarfile.TarInfo._create_pax_generic_header  # type: ignore[attr-defined]
    info = tarfile.TarInfo("big")
    info.size, info.mode, info.mtime = 2 << 20, 0o644, 1_700_000_000
    tar = (pax({"size": "0"}, tarfile.XHDTYPE, "utf-8") + pax({"path": "big"}, tarfile.XHDTYPE,
           "utf-8") + info.tobuf(tarfile.USTAR_FORMAT) + bytes(2 << 20) + bytes(1024))  # fmt: skip
    layer = zlib.compressobj(9, zlib.DEFLATED, 31)
    data = layer.compress(tar) + layer.flush()
    _push_layers(
        registry, tmp_path, "evil/two-pax:1", [(data, "sha256:" + hashlib.sha256(tar).hexdigest())]
    )
    dest = tmp_path / "out" / "rootfs"
    with pytest.raises(TemplateBuildFailed, match=r"unpacks to more than 1 MiB"):
        oci.pull(f"{registry.host}/evil/two-pax:1", dest, username=USER, password=PASSWORD,
                 ca_file=registry.ca, limits=oci.Bounds(1 << 20, 200, DEPTH))  # fmt: skip
    assert not dest.exists() and leftovers(dest.parent) == []


# --- the server-side request forgery -----------------------------------------------------------


def test_a_registry_not_allowed_is_refused_before_any_connection(
    server: Server, registry: Registry
) -> None:
    trap = Listener(None, accepting=False)  # (a connection would wait in its backlog)
    try:
        for key, creds in ((KEY_A, {}), (KEY_B, {"username": USER, "password": PASSWORD})):
            for host in (f"127.0.0.1:{trap.port}", f"localhost:{trap.port}"):
                tpl = Template().from_image(f"{host}/internal/svc:1", **creds)
                msg = _build_error(tpl, "ssrf", server, key)
                assert f"registry {host} is not one this server pulls images from" in msg
                assert registry.host in msg  # (the allowed ones are named)
        assert not trap.pending()  # nothing ever connected
    finally:
        trap.close()


def test_what_is_no_registry_reads_the_same_whatever_it_is(
    server: Server, impostors: dict[str, int]
) -> None:
    texts = {}
    for kind, port in impostors.items():
        msg = _build_error(Template().from_image(f"127.0.0.1:{port}/x/y:1"), "probe", server)
        texts[kind] = re.sub(rf"\b{port}\b", "PORT", msg)
    assert len(set(texts.values())) == 1, texts
    assert "registry unreachable" in texts["closed"]
    assert not re.search(r"refused|reset|EOF|timeout|handshake|first record", texts["closed"])


def test_an_allowed_name_that_resolves_to_an_internal_address_is_refused(
    server: Server, named_trap: Listener
) -> None:
    """A registry the operator named by host name must resolve outside the internal ranges
    (template_image_open_cidrs opens one): loopback here, never connected to."""
    host = f"localhost:{named_trap.port}"
    msg = _build_error(Template().from_image(f"{host}/internal/svc:1"), "named", server, KEY_B)
    assert re.search(rf"registry {host} resolves to (127\.0\.0\.1|::1), an ", msg), msg
    assert not named_trap.pending()
