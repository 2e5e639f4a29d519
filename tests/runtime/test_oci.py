"""OCI image pulls (runtime/templates/oci.py) against a real registry on loopback: Debian's
docker-registry serving TLS (a CA made here) with htpasswd credentials, holding images this test
builds itself (layer tars, config, manifest: an OCI layout pushed with skopeo). Traffic goes to
127.0.0.1 only."""

from __future__ import annotations

import base64
import ctypes
import ctypes.util
import datetime
import gzip
import hashlib
import http.client
import io
import ipaddress
import json
import os
import secrets
import shutil
import socket
import ssl
import stat
import subprocess
import tarfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sandhold.errors import InvalidRequest, TemplateBuildFailed
from sandhold.runtime.templates import oci

try:
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:  # Python < 3.14
    from backports import zstd

REGISTRY_BIN = Path("/usr/bin/docker-registry")
USER, PASSWORD = "alice", "s3cret-" + secrets.token_hex(8)
ARCH = oci.host_arch()

if not oci.tool_status()[0] or not REGISTRY_BIN.exists():
    pytest.skip("skopeo, umoci or docker-registry missing: run scripts/install.sh",
                allow_module_level=True)  # fmt: skip


# --- a registry on loopback -------------------------------------------------------------------


def _bcrypt(password: str) -> str:
    """A bcrypt hash (the registry accepts no other) from the system's libcrypt."""
    lib = ctypes.CDLL(ctypes.util.find_library("crypt"))
    lib.crypt_gensalt.restype = lib.crypt.restype = ctypes.c_char_p
    salt = lib.crypt_gensalt(b"$2y$", 5, None, 0)
    hashed: bytes = lib.crypt(password.encode(), salt)
    assert hashed.startswith(b"$2y$05$"), hashed
    return hashed.decode()


def _self_signed(d: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandhold test registry")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    (d / "cert.pem").write_bytes(cert.public_bytes(pem))
    (d / "key.pem").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))  # fmt: skip
    return d / "cert.pem", d / "key.pem"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Registry:
    host: str  # 127.0.0.1:PORT
    port: int
    ca: Path
    proc: subprocess.Popen[bytes]
    root: Path
    tls: bool = True

    def skopeo(self, *args: str, prefix: str = "") -> bytes:
        """skopeo as the test's own client (``prefix``: ``dest-`` for a copy to the registry)."""
        tls = f"--{prefix}cert-dir={self.ca.parent}" if self.tls else f"--{prefix}tls-verify=false"
        auth = f"--{prefix}authfile={self.root / 'auth.json'}"
        return subprocess.run(["skopeo", args[0], tls, auth, *args[1:]], check=True,
                              capture_output=True, timeout=120).stdout  # fmt: skip

    def push(self, layout: Path, repo_tag: str, *opts: str) -> str:
        """Push the layout's ``latest``; returns the digest the registry holds it under."""
        self.skopeo("copy", *opts, f"--digestfile={self.root / 'digest'}", f"oci:{layout}:latest",
                    f"docker://{self.host}/{repo_tag}", prefix="dest-")  # fmt: skip
        return (self.root / "digest").read_text().strip()


def _get_v2(reg: Registry) -> int | None:
    ctx = ssl.create_default_context(cafile=str(reg.ca))
    conn = (http.client.HTTPSConnection(reg.host, context=ctx, timeout=2) if reg.tls
            else http.client.HTTPConnection(reg.host, timeout=2))  # fmt: skip
    try:
        conn.request("GET", "/v2/")
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


@contextmanager
def running_registry(root: Path, *, tls: bool = True) -> Iterator[Registry]:
    """A registry on 127.0.0.1: with TLS and htpasswd, or (``tls=False``) plain HTTP, no auth."""
    root.mkdir(parents=True, exist_ok=True)
    certs = root / "certs"
    certs.mkdir()
    cert, key = _self_signed(certs)
    shutil.copyfile(cert, certs / "ca.crt")
    (root / "htpasswd").write_text(f"{USER}:{_bcrypt(PASSWORD)}\n")
    port = _free_port()
    auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    (root / "auth.json").write_text(json.dumps({"auths": {f"127.0.0.1:{port}": {"auth": auth}}}))
    config: dict[str, Any] = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": secrets.token_hex(16),
                 "tls": {"certificate": str(cert), "key": str(key)}},
        "auth": {"htpasswd": {"realm": "sandhold-test", "path": str(root / "htpasswd")}},
    }  # fmt: skip
    if not tls:
        del config["http"]["tls"], config["auth"]
    (root / "config.yml").write_text(json.dumps(config))  # JSON is YAML
    with open(root / "registry.log", "wb") as log:
        proc = subprocess.Popen([str(REGISTRY_BIN), "serve", str(root / "config.yml")],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log)  # fmt: skip
    reg = Registry(f"127.0.0.1:{port}", port, certs / "ca.crt", proc, root, tls)
    try:
        deadline = time.monotonic() + 20
        while (status := _get_v2(reg)) is None:
            assert proc.poll() is None, (root / "registry.log").read_text()
            assert time.monotonic() < deadline, "the registry never answered"
            time.sleep(0.05)
        assert status == (401 if tls else 200), status  # it answers (and wants credentials)
        yield reg
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    root = tmp_path_factory.mktemp("registry")
    with running_registry(root) as reg:
        yield reg
    assert reg.proc.returncode is not None and not _listening(reg.port)
    shutil.rmtree(root)


# --- images built here ------------------------------------------------------------------------


def entry(name: str, kind: str = "file", data: bytes = b"", *, mode: int | None = None,
          uid: int = 0, gid: int = 0, link: str = "", dev: tuple[int, int] = (0, 0)
          ) -> tuple[tarfile.TarInfo, bytes]:  # fmt: skip
    t = tarfile.TarInfo(name)
    t.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
              "hardlink": tarfile.LNKTYPE, "blockdev": tarfile.BLKTYPE,
              "chardev": tarfile.CHRTYPE}[kind]  # fmt: skip
    t.mode = mode if mode is not None else (0o755 if kind == "dir" else 0o644)
    t.uid, t.gid, t.mtime = uid, gid, 1_700_000_000
    t.linkname = link
    t.devmajor, t.devminor = dev
    t.size = len(data) if kind == "file" else 0
    return t, data


def _tar(entries: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for info, data in entries:
            tf.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


class Layout:
    """An OCI image layout on disk (oci-layout, index.json, blobs/sha256/...)."""

    def __init__(self, d: Path) -> None:
        self.d = d
        (d / "blobs/sha256").mkdir(parents=True)
        (d / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')

    def blob(self, data: bytes, media_type: str, **extra: object) -> dict[str, object]:
        digest = hashlib.sha256(data).hexdigest()
        (self.d / "blobs/sha256" / digest).write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data), **extra}

    def image(self, layers: list[list[tuple[tarfile.TarInfo, bytes]]], config: dict[str, object],
              *, arch: str = ARCH, compression: str = "gzip") -> dict[str, object]:  # fmt: skip
        descs, diff_ids = [], []
        for entries in layers:
            tar = _tar(entries)
            diff_ids.append("sha256:" + hashlib.sha256(tar).hexdigest())
            packed = zstd.compress(tar) if compression == "zstd" else gzip.compress(tar, mtime=0)
            descs.append(self.blob(packed, f"application/vnd.oci.image.layer.v1.tar+{compression}"))
        cfg = {"architecture": arch, "os": "linux", "config": config,
               "rootfs": {"type": "layers", "diff_ids": diff_ids}}  # fmt: skip
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": self.blob(json.dumps(cfg).encode(),
                                        "application/vnd.oci.image.config.v1+json"),
                    "layers": descs}  # fmt: skip
        return self.blob(json.dumps(manifest).encode(), str(manifest["mediaType"]),
                         platform={"architecture": arch, "os": "linux"})  # fmt: skip

    def tag(self, desc: dict[str, object]) -> str:
        """Make ``desc`` the layout's ``latest``; returns its digest."""
        desc = {**desc, "annotations": {"org.opencontainers.image.ref.name": "latest"}}
        (self.d / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [desc]}))
        return str(desc["digest"])

    def index(self, images: list[dict[str, object]]) -> dict[str, object]:
        kind = "application/vnd.oci.image.index.v1+json"
        data = {"schemaVersion": 2, "mediaType": kind, "manifests": images}
        return self.blob(json.dumps(data).encode(), kind)


RUN_SH = b"#!/bin/sh\necho hello\n"
LAYER1 = [
    entry("etc/", "dir", mode=0o755),
    entry("etc/hostname", data=b"img\n"),
    entry("etc/alt", "symlink", link="/etc/hostname"),  # absolute: meaningful inside only
    entry("app/", "dir", mode=0o755, uid=1000, gid=1000),
    entry("app/run.sh", data=RUN_SH, mode=0o750, uid=1000, gid=1000),
    entry("app/run", "symlink", link="run.sh", uid=1000, gid=1000),
    entry("app/run.hard", "hardlink", link="app/run.sh"),
    entry("data/", "dir", mode=0o700, uid=1000, gid=1000),
    entry("data/a", data=b"a"),
    entry("data/sub/", "dir"),
    entry("data/sub/c", data=b"c"),
    entry("keep/", "dir"),
    entry("keep/x", data=b"x"),
    entry("gone.txt", data=b"bye"),
]
LAYER2 = [
    entry(".wh.gone.txt"),
    entry("data/", "dir", mode=0o750, uid=1000, gid=1000),
    entry("data/.wh..wh..opq"),
    entry("data/new", data=b"new", mode=0o600, uid=1000, gid=1000),
    entry("keep/y", data=b"y"),
    entry("new.txt", data=b"layer 2\n", mode=0o640, uid=0, gid=1000),
]
CONFIG: dict[str, object] = {
    "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=a=b"], "WorkingDir": "/app",
    "User": "1000:1000", "Entrypoint": ["/bin/sh", "-c"], "Cmd": ["/app/run.sh"],
}  # fmt: skip
# path -> (kind, mode, uid, gid, content or link target)
EXPECTED = {
    "etc": ("dir", 0o755, 0, 0, None),
    "etc/hostname": ("file", 0o644, 0, 0, b"img\n"),
    "etc/alt": ("symlink", None, 0, 0, "/etc/hostname"),
    "app": ("dir", 0o755, 1000, 1000, None),
    "app/run.sh": ("file", 0o750, 1000, 1000, RUN_SH),
    "app/run": ("symlink", None, 1000, 1000, "run.sh"),
    "app/run.hard": ("file", 0o750, 1000, 1000, RUN_SH),
    "data": ("dir", 0o750, 1000, 1000, None),
    "data/new": ("file", 0o600, 1000, 1000, b"new"),
    "keep": ("dir", 0o755, 0, 0, None),
    "keep/x": ("file", 0o644, 0, 0, b"x"),
    "keep/y": ("file", 0o644, 0, 0, b"y"),
    "new.txt": ("file", 0o640, 0, 1000, b"layer 2\n"),
}


def tree(root: Path) -> dict[str, tuple[str, int | None, int, int, bytes | str | None]]:
    out: dict[str, tuple[str, int | None, int, int, bytes | str | None]] = {}
    for dirpath, dirs, files in os.walk(root):
        for p in (Path(dirpath, name) for name in (*dirs, *files)):
            st = p.lstat()
            m = st.st_mode
            kind, mode, data = (("symlink", None, os.readlink(p)) if stat.S_ISLNK(m)
                                else ("dir", stat.S_IMODE(m), None) if stat.S_ISDIR(m)
                                else ("file", stat.S_IMODE(m), p.read_bytes()) if stat.S_ISREG(m)
                                else ("other", m, None))  # fmt: skip
            out[str(p.relative_to(root))] = (kind, mode, st.st_uid, st.st_gid, data)
    return out


def push_image(reg: Registry, tmp: Path, repo_tag: str,
               layers: list[list[tuple[tarfile.TarInfo, bytes]]],
               config: dict[str, object] | None = None, **kw: str) -> str:  # fmt: skip
    lay = Layout(tmp / f"layout-{secrets.token_hex(4)}")
    digest = lay.tag(lay.image(layers, config or {}, **kw))
    reg.push(lay.d, repo_tag)
    return digest


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".oci-pull-"))


def pull(reg: Registry, repo_tag: str, dest: Path, **kw: object) -> oci.ImageConfig:
    args: dict[str, object] = {"username": USER, "password": PASSWORD, "ca_file": reg.ca, **kw}
    return oci.pull(f"{reg.host}/{repo_tag}", dest, **args)  # type: ignore[arg-type]


# --- the tests --------------------------------------------------------------------------------


def test_pull_applies_layers_whiteouts_and_opaque_dirs(registry: Registry, tmp_path: Path) -> None:
    digest = push_image(registry, tmp_path, "test/app:1", [LAYER1, LAYER2], CONFIG)
    dest = tmp_path / "out" / "rootfs"
    cfg = pull(registry, "test/app:1", dest)
    assert tree(dest) == EXPECTED  # gone.txt whited out, data/ replaced, owners/modes kept
    assert (dest / "app/run.sh").stat().st_ino == (dest / "app/run.hard").stat().st_ino
    assert cfg == oci.ImageConfig(
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "GREETING": "a=b"}, workdir="/app",
        user="1000:1000", entrypoint=["/bin/sh", "-c"], cmd=["/app/run.sh"], digest=digest,
    )  # fmt: skip
    assert os.listdir(dest.parent) == ["rootfs"]  # the temporary OCI layout is gone


def test_credentials_never_reach_argv_and_the_authfile_is_private(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    push_image(registry, tmp_path, "test/private:1", [LAYER1])
    seen: list[tuple[list[str], int]] = []
    real_run = subprocess.run

    def spy(argv: list[str], **kw: object) -> subprocess.CompletedProcess[bytes]:
        authfiles = [a.split("=", 1)[1] for a in argv if "authfile=" in a]
        seen.append((argv, stat.S_IMODE(os.stat(authfiles[0]).st_mode) if authfiles else -1))
        return real_run(argv, **kw)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(oci.subprocess, "run", spy)
    pull(registry, "test/private:1", tmp_path / "rootfs")
    assert [a[1] for a, _ in seen] == ["inspect", "copy", "raw"]
    assert all(PASSWORD not in " ".join(argv) for argv, _ in seen)
    assert [mode for _, mode in seen[:2]] == [0o600, 0o600]


def test_a_docker_format_image_is_converted(registry: Registry, tmp_path: Path) -> None:
    lay = Layout(tmp_path / "layout")
    lay.tag(lay.image([LAYER1, LAYER2], CONFIG))
    digest = registry.push(lay.d, "test/docker:1", "--format=v2s2")  # Docker's manifest and types
    raw = registry.skopeo("inspect", "--raw", f"docker://{registry.host}/test/docker:1")
    assert json.loads(raw)["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
    cfg = pull(registry, "test/docker:1", tmp_path / "rootfs")
    assert tree(tmp_path / "rootfs") == EXPECTED
    assert cfg.digest == digest and cfg.cmd == ["/app/run.sh"] and cfg.user == "1000:1000"
    by_digest = pull(registry, f"test/docker@{digest}", tmp_path / "again")
    assert by_digest == cfg and tree(tmp_path / "again") == EXPECTED


def test_tls_verification_and_plain_http(registry: Registry, tmp_path: Path) -> None:
    push_image(registry, tmp_path, "test/tls:1", [LAYER1, LAYER2])
    with pytest.raises(TemplateBuildFailed, match="TLS certificate not trusted") as e:
        pull(registry, "test/tls:1", tmp_path / "a", ca_file=None)  # self-signed, unknown
    assert "test/tls:1" in str(e.value) and not (tmp_path / "a").exists()
    pull(registry, "test/tls:1", tmp_path / "b", ca_file=None, insecure=True)
    assert tree(tmp_path / "b") == EXPECTED
    with running_registry(tmp_path / "reg", tls=False) as plain:
        push_image(plain, tmp_path, "test/plain:1", [LAYER1, LAYER2])
        with pytest.raises(TemplateBuildFailed, match="plain HTTP"):
            oci.pull(f"{plain.host}/test/plain:1", tmp_path / "c")
        oci.pull(f"{plain.host}/test/plain:1", tmp_path / "d", insecure=True)
        assert tree(tmp_path / "d") == EXPECTED and not (tmp_path / "c").exists()
    assert plain.proc.returncode is not None and not _listening(plain.port)


def test_bad_credentials_or_missing_images_fail_clearly(registry: Registry, tmp_path: Path) -> None:
    push_image(registry, tmp_path, "test/auth:1", [LAYER1])
    dest = tmp_path / "rootfs"
    cases: list[tuple[str, dict[str, str | None], str]] = [
        ("test/auth:1", {"password": "wrong-" + PASSWORD}, "unauthorized"),
        ("test/auth:1", {"username": None, "password": None}, "unauthorized"),
        ("test/absent:1", {}, "not found"),
        ("test/auth:2", {}, "not found"),
    ]
    for name, kw, answer in cases:
        with pytest.raises(TemplateBuildFailed, match=answer) as e:
            pull(registry, name, dest, **kw)
        assert f"{registry.host}/{name}" in str(e.value) and PASSWORD not in str(e.value)
    assert not dest.exists() and leftovers(tmp_path) == []


def test_an_index_resolves_to_the_hosts_platform(registry: Registry, tmp_path: Path) -> None:
    lay = Layout(tmp_path / "multi")
    other = "s390x" if ARCH != "s390x" else "amd64"
    ours = lay.image([LAYER1, LAYER2], CONFIG)
    theirs = lay.image([[entry("wrong", data=b"wrong arch")]], {}, arch=other)
    lay.tag(lay.index([theirs, ours]))
    registry.push(lay.d, "test/multi:1", "--multi-arch=all")
    cfg = pull(registry, "test/multi:1", tmp_path / "rootfs")
    assert tree(tmp_path / "rootfs") == EXPECTED and cfg.digest == ours["digest"]

    only = Layout(tmp_path / "foreign")
    only.tag(only.index([only.image([[entry("x", data=b"x")]], {}, arch=other)]))
    registry.push(only.d, "test/foreign:1", "--multi-arch=all")
    with pytest.raises(TemplateBuildFailed, match=f"no linux/{ARCH} image .*linux/{other}"):
        pull(registry, "test/foreign:1", tmp_path / "foreign-root")
    assert not (tmp_path / "foreign-root").exists() and leftovers(tmp_path) == []


def test_zstd_layers_and_device_nodes(registry: Registry, tmp_path: Path) -> None:
    layer = [*LAYER1, entry("disk", "blockdev", mode=0o666, dev=(8, 0)),
             entry("etc/null", "chardev", mode=0o666, dev=(1, 3))]  # fmt: skip
    push_image(registry, tmp_path, "test/zstd:1", [layer, LAYER2], CONFIG, compression="zstd")
    pull(registry, "test/zstd:1", tmp_path / "rootfs")
    assert tree(tmp_path / "rootfs") == EXPECTED  # a sandbox's /dev is its own


OUTSIDE = "outside"  # a directory next to dest that no layer may touch
ESCAPES = {
    "dotdot": lambda out: [[entry("../escaped", data=b"x"), entry("../../escaped", data=b"x")]],
    "absolute-name": lambda out: [[entry(f"{out}/escaped", data=b"x")]],
    "symlink-dir": lambda out: [[entry("link", "symlink", link=out),
                                 entry("link/escaped", data=b"x")]],
    "symlink-dotdot": lambda out: [[entry("link", "symlink", link="../../" + OUTSIDE),
                                    entry("link/escaped", data=b"x")]],
    "symlink-next-layer": lambda out: [[entry("link", "symlink", link=out)],
                                       [entry("link/escaped", data=b"x")]],
    "symlink-file": lambda out: [[entry("f", "symlink", link=f"{out}/secret")],
                                 [entry("f", data=b"overwritten")]],
    "hardlink": lambda out: [[entry("stolen", "hardlink", link=f"{out}/secret")]],
    "whiteout-through-symlink": lambda out: [[entry("link", "symlink", link=out)],
                                             [entry("link/.wh.secret")]],
    "opaque-through-symlink": lambda out: [[entry("link", "symlink", link=out)],
                                           [entry("link/.wh..wh..opq")]],
}  # fmt: skip


@pytest.mark.parametrize("attack", sorted(ESCAPES))
def test_a_layer_never_writes_outside_dest(registry: Registry, tmp_path: Path, attack: str) -> None:
    outside = tmp_path / OUTSIDE
    outside.mkdir()
    (outside / "secret").write_text("host data")
    push_image(registry, tmp_path, f"test/evil-{attack}:1", ESCAPES[attack](str(outside)))
    dest = tmp_path / "work" / "rootfs"
    try:
        pull(registry, f"test/evil-{attack}:1", dest)
    except TemplateBuildFailed:
        assert not dest.exists()  # refusing the layer is fine too
    assert sorted(os.listdir(outside)) == ["secret"]
    assert (outside / "secret").read_text() == "host data"
    assert (outside / "secret").stat().st_nlink == 1
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "work/escaped").exists()
    assert not Path("/escaped").exists()
    assert leftovers(tmp_path / "work") == []


def test_bad_input_is_refused_before_any_traffic(tmp_path: Path) -> None:
    for ref in ("", "UPPER/Case:1 ", "-rf", "a//b", "a:b:c", "x@sha256:123", "x:" + "t" * 200):
        with pytest.raises(InvalidRequest, match="does not parse"):
            oci.pull(ref, tmp_path / "r")
    with pytest.raises(InvalidRequest, match="name the registry"):
        oci.pull("team/app:1", tmp_path / "r", username="u", password="p")
    with pytest.raises(InvalidRequest, match="both username and password"):
        oci.pull("127.0.0.1:1/team/app:1", tmp_path / "r", username="u")
    (tmp_path / "exists").mkdir()
    with pytest.raises(InvalidRequest, match="already exists"):
        oci.pull("127.0.0.1:1/team/app:1", tmp_path / "exists")
    parsed = oci.parse_reference("docker://127.0.0.1:5000/team/app:1")
    assert parsed == oci.Reference("127.0.0.1:5000", "team/app", "1")
    assert sorted(os.listdir(tmp_path)) == ["exists"]


def test_an_unreachable_registry_or_a_timeout_fails_clearly(tmp_path: Path) -> None:
    with running_registry(tmp_path / "reg") as reg:
        pass  # started, answered, stopped
    assert reg.proc.returncode is not None and not _listening(reg.port)
    with pytest.raises(TemplateBuildFailed, match="registry unreachable") as e:
        oci.pull(f"{reg.host}/test/app:1", tmp_path / "rootfs", ca_file=reg.ca)
    assert f"{reg.host}/test/app:1" in str(e.value)
    with pytest.raises(TemplateBuildFailed, match="timed out"):
        oci.pull(f"{reg.host}/test/app:1", tmp_path / "rootfs", timeout_s=0)
    assert not (tmp_path / "rootfs").exists() and leftovers(tmp_path) == []
