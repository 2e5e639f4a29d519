"""OCI images from a registry, unpacked into a root filesystem directory (template builds).

``pull`` fetches the manifest with ``skopeo inspect --raw`` (a manifest list or OCI index is
resolved here to the host's ``linux/<arch>`` image), copies exactly that digest with ``skopeo
copy`` into an OCI layout in a temporary directory next to the destination (layers recompressed
to gzip where needed, since umoci reads only tar and tar+gzip), and applies the layers in order
with ``umoci raw unpack``: whiteouts and opaque directories, numeric owners and modes from the
tars, every path resolved inside the root (umoci's secure join: ``..``, absolute names and
symlinks lead nowhere outside it). Device nodes are dropped afterwards (a sandbox's ``/dev`` is
its own; one in a lower layer would be a door to the host's disks). The root appears at
``dest`` only when complete; the temporary layout is always removed.

Credentials go to skopeo in an auth file (0600, in the temporary directory), never on its
command line; without them the pull is anonymous (``--no-creds``): the host's own logins are
never lent to a caller.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandhold.errors import HostUnsupported, InvalidRequest, TemplateBuildFailed

TOOLS = ("skopeo", "umoci")
LAYOUT = "layout"  # the OCI layout's directory in the temporary directory
LAYOUT_TAG = "image"
BULLETS = " \t\u2022\u2a2f"  # umoci starts its lines with these
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "armv6l": "arm",
         "i686": "386", "i386": "386", "ppc64le": "ppc64le", "s390x": "s390x",
         "riscv64": "riscv64"}  # fmt: skip
_LISTS = ("application/vnd.oci.image.index.v1+json",
          "application/vnd.docker.distribution.manifest.list.v2+json")  # fmt: skip
# The reference grammar of the distribution project (docker/distribution reference/regexp.go).
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = re.compile(rf"{_LABEL}(?:\.{_LABEL})*(?::[0-9]{{1,5}})?")
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass
class ImageConfig:
    """What the image's config says a container of it runs with."""

    env: dict[str, str] = field(default_factory=dict)
    workdir: str = ""
    user: str = ""
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    digest: str = ""  # the registry's digest of the (platform's) image manifest


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
    def __init__(self, ref: str, work: Path, deadline: float, secret: str | None) -> None:
        self.ref = ref
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
            r = subprocess.run(argv, cwd=self.work, env=env, capture_output=True, timeout=left,
                               stdin=subprocess.DEVNULL)  # fmt: skip
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
        """The registry's answer, in a few words, then skopeo's or umoci's last line."""
        detail = self.last_line(stderr)
        low = stderr.lower()
        kinds = (
            ("unauthorized", ("unauthorized", "authentication required", "denied",
                              "invalid username/password", " 401")),
            ("not found", ("manifest unknown", "name unknown", "not found", " 404")),
            ("TLS certificate not trusted (give ca_file, or insecure=True)",
             ("x509:", "certificate")),
            ("the registry speaks plain HTTP (insecure=True allows it)",
             ("http response to https client",)),
            ("registry unreachable", ("connection refused", "no such host", "i/o timeout",
                                      "network is unreachable", "no route to host",
                                      "connection reset", "dial tcp", "unexpected eof")),
        )  # fmt: skip
        for kind, needles in kinds:
            if any(n in low for n in needles):
                return f"{kind}: {detail}"
        return detail


def _auth_args(r: Reference, work: Path, username: str | None, password: str | None,
               insecure: bool, ca_file: Path | None) -> list[str]:  # fmt: skip
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


def _drop_devices(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                os.unlink(path)


def pull(
    ref: str,
    dest: Path,
    *,
    username: str | None = None,
    password: str | None = None,
    insecure: bool = False,
    ca_file: Path | None = None,
    timeout_s: float = 600,
) -> ImageConfig:
    """Fetch image ``ref`` and unpack its layers into the new directory ``dest`` (a root
    filesystem owned by the tars' numeric ids). ``insecure`` skips TLS verification and allows
    plain HTTP; ``ca_file`` is a PEM CA to trust for this registry. On failure ``dest`` does not
    exist; the temporary OCI layout never outlives the call."""
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
    dest = Path(dest).absolute()
    if dest.exists() or dest.is_symlink():
        raise InvalidRequest(f"{dest} already exists")
    dest.parent.mkdir(parents=True, exist_ok=True)
    arch = host_arch()
    work = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".oci-pull-"))
    p = _Puller(str(r), work, time.monotonic() + timeout_s, password or None)
    try:
        opts = _auth_args(r, work, username, password, insecure, ca_file)
        src = f"{r.name}@{r.digest}" if r.digest else str(r)  # skopeo takes no tag with it
        raw = p.run("reading the manifest",
                    ["skopeo", "inspect", "--raw", *opts, f"docker://{src}"])  # fmt: skip
        digest = r.digest if r.digest else "sha256:" + hashlib.sha256(raw).hexdigest()
        try:
            manifest = json.loads(raw)
        except ValueError:
            raise TemplateBuildFailed(f"pulling {p.ref}: the manifest is not JSON") from None
        if not isinstance(manifest, dict):
            raise TemplateBuildFailed(f"pulling {p.ref}: the manifest is not a JSON object")
        if manifest.get("schemaVersion") == 1:
            raise TemplateBuildFailed(f"pulling {p.ref}: Docker schema 1 images are not supported")
        if manifest.get("mediaType") in _LISTS or "manifests" in manifest:
            digest = _pick_platform(p, manifest, arch)
        src_opts = [o.replace("--", "--src-", 1) for o in opts]
        p.run("copying the image", [
            "skopeo", "copy", "--quiet", "--remove-signatures", "--dest-compress-format=gzip",
            *src_opts, f"docker://{r.name}@{digest}", f"oci:{LAYOUT}:{LAYOUT_TAG}",
        ])  # fmt: skip
        config = _read_config(p, work / LAYOUT, digest, arch)
        rootfs = work / "rootfs"
        unpack = ["umoci", "raw", "unpack", f"--image={LAYOUT}:{LAYOUT_TAG}", str(rootfs)]
        if os.geteuid() != 0:
            unpack.insert(3, "--rootless")
        p.run("unpacking the layers", unpack, registry=False)
        _drop_devices(rootfs)
        rootfs.rename(dest)
        return config
    finally:
        shutil.rmtree(work, ignore_errors=True)
