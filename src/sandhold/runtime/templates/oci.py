"""OCI images from a registry, unpacked into a root filesystem directory (template builds).

``pull`` fetches the manifest with ``skopeo inspect --raw`` (a manifest list or OCI index is
resolved here to the host's ``linux/<arch>`` image), copies exactly that digest with ``skopeo
copy`` into an OCI layout in a temporary directory next to the destination (layers recompressed
to gzip where needed, since umoci reads only tar and tar+gzip), and applies the layers in order
with ``umoci raw unpack``: whiteouts and opaque directories, numeric owners and modes from the
tars, every path resolved inside the root (umoci's secure join: ``..``, absolute names and
symlinks lead nowhere outside it). Device nodes are dropped afterwards (a sandbox's ``/dev`` is
its own; one in a lower layer would be a door to the host's disks) and named in the result. The
root appears at ``dest`` only when complete; the temporary layout is always removed.

Pulls are bounded (``Bounds``: the build's disk budget, its files, path depth): the manifest's
declared layer sizes before ``skopeo copy``, then every layer's tar read as a stream before
``umoci raw unpack`` (layer_scan.py), then the unpacked tree's depth (symlinks can chain paths).

Registry errors name the registry's answer (unauthorized, not found, an untrusted certificate,
plain HTTP) and say nothing else: refused, filtered, reset or another protocol all read
"registry unreachable", so a pull is no port scanner (the details go to the server's log).

Credentials go to skopeo in an auth file (0600, in the temporary directory), never on its
command line; without them the pull is anonymous (``--no-creds``): the host's own logins are
never lent to a caller.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandhold.errors import HostUnsupported, InvalidRequest, TemplateBuildFailed
from sandhold.runtime import safefs, staging
from sandhold.runtime.templates.layer_scan import Bounds, deepest, drop_devices, over, scan

log = logging.getLogger(__name__)

TOOLS = ("skopeo", "umoci")
WORK = ".oci-pull-"  # a pull's temporary directory (staging.py: swept once its maker is gone)
LAYOUT = "layout"  # the OCI layout's directory in the temporary directory
LAYOUT_TAG = "image"
BULLETS = " \t\u2022\u2a2f"  # umoci starts its lines with these
_ARCH = {
    "x86_64": "amd64",
    "aarch64": "arm64",
    "armv7l": "arm",
    "armv6l": "arm",
    "i686": "386",
    "i386": "386",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}
_LISTS = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
# The reference grammar of the distribution project (docker/distribution reference/regexp.go).
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = re.compile(rf"{_LABEL}(?:\.{_LABEL})*(?::[0-9]{{1,5}})?")
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
MiB = 1 << 20
INODE_RATIO = 16 << 10  # ext4's bytes per inode: a budget's worth of files
DEFAULT_BOUNDS = Bounds(10240 * MiB, 10240 * MiB // INODE_RATIO, 256)  # the settings' defaults


def bounds(disk_mb: int, max_depth: int) -> Bounds:
    """A pull's bounds from ``template_build_disk_mb`` and ``template_unpack_max_depth``."""
    return Bounds(disk_mb * MiB, disk_mb * MiB // INODE_RATIO, max_depth)


@dataclass
class ImageConfig:
    """What the image's config says a container of it runs with."""

    env: dict[str, str] = field(default_factory=dict)
    workdir: str = ""
    user: str = ""
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    digest: str = ""  # the registry's digest of the (platform's) image manifest
    devices: list[str] = field(default_factory=list)  # device nodes of its layers, dropped


@dataclass(frozen=True)
class Reference:
    domain: str | None  # None: the registry skopeo assumes for an unqualified name
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        return f"{self.domain}/{self.path}" if self.domain else self.path

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        digest = f"@{self.digest}" if self.digest else ""
        return f"{self.name}{tag}{digest}"


def parse_reference(ref: str) -> Reference:
    """``[host[:port]/]path[:tag][@sha256:hex]`` (a ``docker://`` prefix is allowed)."""
    text = ref.removeprefix("docker://")
    bad = InvalidRequest(f"image reference {ref!r} does not parse (want host[:port]/name[:tag])")
    if not text or len(text) > 512 or not text.isascii() or text != text.strip():
        raise bad
    name, _, digest = text.partition("@")
    if digest and not _DIGEST.fullmatch(digest):
        raise bad
    tag = None
    slash = name.rfind("/")
    if ":" in name[slash + 1 :]:
        name, tag = name.rsplit(":", 1)
        if not _TAG.fullmatch(tag):
            raise bad
    first, sep, rest = name.partition("/")
    domain = None
    if sep and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        if not _DOMAIN.fullmatch(first):
            raise bad
        domain, name = first, rest
    if len(name) > 255 or not all(_COMPONENT.fullmatch(c) for c in name.split("/")):
        raise bad
    return Reference(domain, name, tag, digest or None)


def host_arch() -> str:
    machine = platform.machine()
    return _ARCH.get(machine, machine)


def tool_status() -> tuple[bool, str]:
    """Whether the tools ``pull`` needs are installed, and what to install if not."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return False, f"missing {' and '.join(missing)} (apt-get install {' '.join(missing)})"
    return True, "skopeo and umoci are installed"


class _Puller:
    def __init__(self, ref: Reference, work: Path, deadline: float, secret: str | None) -> None:
        self.ref = str(ref)
        self.host = ref.domain
        self.work = work
        self.deadline = deadline
        self.secret = secret

    def redact(self, text: str) -> str:
        return text.replace(self.secret, "***") if self.secret and len(self.secret) > 3 else text

    def run(self, what: str, argv: list[str], registry: bool = True) -> bytes:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TemplateBuildFailed(f"pulling {self.ref}: timed out before {what}")
        env = {**os.environ, "TMPDIR": str(self.work)}
        try:
            r = subprocess.run(
                argv,
                cwd=self.work,
                env=env,
                capture_output=True,
                timeout=left,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise TemplateBuildFailed(f"pulling {self.ref}: timed out during {what}") from None
        if r.returncode != 0:
            err = r.stderr.decode(errors="replace")
            msg = self.explain(err) if registry else self.last_line(err)
            raise TemplateBuildFailed(f"pulling {self.ref}: {what} failed: {msg}")
        return r.stdout

    def last_line(self, stderr: str) -> str:
        lines = [ln.strip(BULLETS) for ln in stderr.strip().splitlines() if ln.strip(BULLETS)]
        line = self.redact(lines[-1] if lines else "no message")
        line = re.sub(r'^time="[^"]*" level=\w+ msg="(.*)"$', r"\1", line).replace('\\"', '"')
        return re.sub(r'^Error parsing image name "[^"]*": ', "", line)[-400:]

    def explain(self, stderr: str) -> str:
        """The registry's answer in a few words (with skopeo's last line), or, for anything
        else (refused, filtered, reset, another protocol), the same words whatever it was."""
        detail = self.last_line(stderr)
        low = stderr.lower()
        kinds = (
            (
                "unauthorized",
                (
                    "unauthorized",
                    "authentication required",
                    "denied",
                    "invalid username/password",
                    " 401",
                ),
            ),
            ("not found", ("manifest unknown", "name unknown", " 404")),
            ("TLS certificate not trusted (give ca_file, or insecure=True)", ("x509:",)),
            (
                "the registry speaks plain HTTP (insecure=True allows it)",
                ("http response to https client",),
            ),
        )
        for kind, needles in kinds:
            if any(n in low for n in needles):
                return f"{kind}: {detail}"
        log.warning("pulling %s: %s", self.ref, detail)  # the operator's to read
        return unreachable(self.host)


def unreachable(host: str | None) -> str:
    """What a team is told when no registry answered: one text for every cause."""
    return f"registry unreachable: nothing answered as a registry at {host or DEFAULT_NAME}"


DEFAULT_NAME = "skopeo's default registry"


def _auth_args(
    r: Reference,
    work: Path,
    username: str | None,
    password: str | None,
    insecure: bool,
    ca_file: Path | None,
) -> list[str]:
    """skopeo's source options (without their ``src-`` prefix, which ``copy`` adds)."""
    args = [f"--tls-verify={'false' if insecure else 'true'}"]
    if ca_file is not None:
        certs = work / "certs"
        certs.mkdir(mode=0o700)
        shutil.copyfile(ca_file, certs / "ca.crt")
        args.append(f"--cert-dir={certs}")
    if username is None or password is None:
        return [*args, "--no-creds"]
    auth = base64.b64encode(f"{username}:{password}".encode()).decode()
    authfile = work / "auth.json"
    fd = os.open(authfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"auths": {r.domain: {"auth": auth}}}, f)
    return [*args, f"--authfile={authfile}"]


def _pick_platform(p: _Puller, index: dict[str, Any], arch: str) -> str:
    have = []
    for m in index.get("manifests") or []:
        plat = m.get("platform") or {}
        os_, a = plat.get("os", ""), plat.get("architecture", "")
        have.append(f"{os_}/{a}" + (f"/{plat['variant']}" if plat.get("variant") else ""))
        if os_ == "linux" and a == arch and _DIGEST.fullmatch(str(m.get("digest", ""))):
            return str(m["digest"])
    raise TemplateBuildFailed(
        f"pulling {p.ref}: it has no linux/{arch} image (it has: {', '.join(have) or 'none'})"
    )


def _blob(layout: Path, digest: object) -> dict[str, Any]:
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise TemplateBuildFailed(f"the OCI layout names a blob {digest!r}")
    data = json.loads((layout / "blobs/sha256" / digest.split(":", 1)[1]).read_bytes())
    if not isinstance(data, dict):
        raise TemplateBuildFailed(f"blob {digest} is no JSON object")
    return data


def _read_config(p: _Puller, layout: Path, digest: str, arch: str) -> ImageConfig:
    try:
        index = json.loads((layout / "index.json").read_text())
        manifest = _blob(layout, index["manifests"][0]["digest"])
        config = _blob(layout, (manifest.get("config") or {}).get("digest"))
    except (OSError, ValueError, LookupError, TypeError, AttributeError) as e:
        raise TemplateBuildFailed(f"pulling {p.ref}: the copied image is unreadable: {e}") from e
    got = (config.get("os", "linux"), config.get("architecture", arch))
    if got != ("linux", arch):
        raise TemplateBuildFailed(
            f"pulling {p.ref}: it is a {got[0]}/{got[1]} image; this host runs linux/{arch}"
        )
    c = config.get("config") or {}
    env = {}
    for item in c.get("Env") or []:
        k, _, v = str(item).partition("=")
        if k:
            env[k] = v
    return ImageConfig(
        env=env,
        workdir=str(c.get("WorkingDir") or ""),
        user=str(c.get("User") or ""),
        entrypoint=[str(a) for a in c.get("Entrypoint") or []],
        cmd=[str(a) for a in c.get("Cmd") or []],
        digest=digest,
    )


def _checked(
    ref: str, username: str | None, password: str | None, ca_file: Path | None
) -> Reference:
    """``ref`` parsed, with what the caller gave checked, before any traffic."""
    r = parse_reference(ref)
    if (username is None) != (password is None):
        raise InvalidRequest("give both username and password for a registry, or neither")
    if username is not None and (r.domain is None or ":" in username or "\n" in username):
        raise InvalidRequest(
            f"with credentials, name the registry in the reference (host[:port]/name:tag), "
            f"and no ':' in the username: {ref!r}"
        )
    if ca_file is not None and not Path(ca_file).is_file():
        raise InvalidRequest(f"ca_file {ca_file} is not a file")
    ok, why = tool_status()
    if not ok:
        raise HostUnsupported(f"pulling OCI images needs skopeo and umoci: {why}")
    return r


def _json(p: _Puller, raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError:
        raise TemplateBuildFailed(f"pulling {p.ref}: the manifest is not JSON") from None
    if not isinstance(data, dict):
        raise TemplateBuildFailed(f"pulling {p.ref}: the manifest is not a JSON object")
    return data


def _manifest(p: _Puller, r: Reference, opts: list[str], arch: str) -> tuple[str, dict[str, Any]]:
    """The digest and manifest of ``r``'s linux/``arch`` image, as this caller's credentials
    fetch them; the digest is the hash of the bytes fetched (never a registry's word for it)."""
    src = f"{r.name}@{r.digest}" if r.digest else str(r)  # skopeo takes no tag with it
    raw = p.run("reading the manifest", ["skopeo", "inspect", "--raw", *opts, f"docker://{src}"])
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    if r.digest and digest != r.digest:
        raise TemplateBuildFailed(f"pulling {p.ref}: the registry's manifest is not {r.digest}")
    manifest = _json(p, raw)
    if manifest.get("schemaVersion") == 1:
        raise TemplateBuildFailed(f"pulling {p.ref}: Docker schema 1 images are not supported")
    if manifest.get("mediaType") in _LISTS or "manifests" in manifest:
        digest = _pick_platform(p, manifest, arch)
        by_digest = f"docker://{r.name}@{digest}"
        raw = p.run("reading the manifest", ["skopeo", "inspect", "--raw", *opts, by_digest])
        if "sha256:" + hashlib.sha256(raw).hexdigest() != digest:
            raise TemplateBuildFailed(f"pulling {p.ref}: the registry's manifest is not {digest}")
        manifest = _json(p, raw)
        if manifest.get("mediaType") in _LISTS or "manifests" in manifest:
            raise TemplateBuildFailed(f"pulling {p.ref}: an index inside an index")
    return digest, manifest


def _too_big(ref: str, b: Bounds, what: str) -> TemplateBuildFailed:
    return TemplateBuildFailed(f"image {ref} {over(b, what).message}")


def _declared(p: _Puller, manifest: dict[str, Any], b: Bounds) -> None:
    """The layers' sizes as the manifest declares them (compressed; skopeo holds the registry
    to them) against the budget: a pull that cannot fit is not downloaded."""
    try:
        sizes = [int(d.get("size") or 0) for d in manifest.get("layers") or []]
        sizes.append(int((manifest.get("config") or {}).get("size") or 0))
    except (TypeError, ValueError, AttributeError):
        raise TemplateBuildFailed(f"pulling {p.ref}: the manifest's sizes are no numbers") from None
    if sum(sizes) > b.bytes:
        raise _too_big(p.ref, b, "bytes")


def _layers(layout: Path) -> list[tuple[Path, str]]:
    index = json.loads((layout / "index.json").read_text())
    manifest = _blob(layout, index["manifests"][0]["digest"])
    out = []
    for d in manifest.get("layers") or []:
        digest = str(d.get("digest"))
        if not _DIGEST.fullmatch(digest):
            raise TemplateBuildFailed(f"the OCI layout names a blob {digest!r}")
        out.append((layout / "blobs/sha256" / digest.split(":", 1)[1], str(d.get("mediaType"))))
    return out


def resolve(
    ref: str,
    workdir: Path,
    *,
    username: str | None = None,
    password: str | None = None,
    insecure: bool = False,
    ca_file: Path | None = None,
    timeout_s: float = 120,
) -> str:
    """The digest of ``ref``'s image for this host, as these credentials (or none) fetch its
    manifest: proof that they may pull it. A temporary directory in ``workdir`` holds the auth
    file while it runs."""
    r = _checked(ref, username, password, ca_file)
    work = staging.make(workdir, WORK)
    p = _Puller(r, work, time.monotonic() + timeout_s, password or None)
    try:
        opts = _auth_args(r, work, username, password, insecure, ca_file)
        return _manifest(p, r, opts, host_arch())[0]
    finally:
        safefs.remove_quietly(work)


def pull(
    ref: str,
    dest: Path,
    *,
    username: str | None = None,
    password: str | None = None,
    insecure: bool = False,
    ca_file: Path | None = None,
    timeout_s: float = 600,
    limits: Bounds = DEFAULT_BOUNDS,
) -> ImageConfig:
    """Fetch image ``ref`` and unpack its layers into the new directory ``dest`` (a root
    filesystem owned by the tars' numeric ids), within ``limits``. ``insecure`` skips TLS
    verification and allows plain HTTP; ``ca_file`` is a PEM CA to trust for this registry. On
    failure ``dest`` does not exist; the temporary OCI layout never outlives the call."""
    r = _checked(ref, username, password, ca_file)
    dest = Path(dest).absolute()
    if dest.exists() or dest.is_symlink():
        raise InvalidRequest(f"{dest} already exists")
    dest.parent.mkdir(parents=True, exist_ok=True)
    arch = host_arch()
    work = staging.make(dest.parent, WORK)
    p = _Puller(r, work, time.monotonic() + timeout_s, password or None)
    try:
        opts = _auth_args(r, work, username, password, insecure, ca_file)
        digest, manifest = _manifest(p, r, opts, arch)
        _declared(p, manifest, limits)
        src_opts = [o.replace("--", "--src-", 1) for o in opts]
        p.run("copying the image", [
            "skopeo", "copy", "--quiet", "--remove-signatures", "--dest-compress-format=gzip",
            *src_opts, f"docker://{r.name}@{digest}", f"oci:{LAYOUT}:{LAYOUT_TAG}",
        ])  # fmt: skip
        config = _read_config(p, work / LAYOUT, digest, arch)
        try:
            scan(_layers(work / LAYOUT), limits)
        except TemplateBuildFailed as e:  # a bound, or what is wrong with the layers
            raise TemplateBuildFailed(f"image {p.ref} {e.message}") from None
        except (OSError, ValueError, LookupError, TypeError, AttributeError) as e:
            raise TemplateBuildFailed(f"pulling {p.ref}: {e}") from None
        rootfs = work / "rootfs"
        unpack = ["umoci", "raw", "unpack", f"--image={LAYOUT}:{LAYOUT_TAG}", str(rootfs)]
        if os.geteuid() != 0:
            unpack.insert(3, "--rootless")
        p.run("unpacking the layers", unpack, registry=False)
        if deepest(rootfs, limits.depth) > limits.depth:  # through its symlinks
            raise _too_big(p.ref, limits, "depth")
        config.devices = drop_devices(rootfs)
        rootfs.rename(dest)
        return config
    finally:
        safefs.remove_quietly(work)
