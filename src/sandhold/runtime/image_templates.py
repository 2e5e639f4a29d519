"""Templates made of OCI images (a build's ``from_image`` base): the image is pulled and unpacked
(oci.py) into a root filesystem template of the store, named by the image's digest, so an image
is imported once however many templates build on it. The image's config carries over (env,
workdir, user); its root needs no Python of ours: the agent runs on the host's (``agent_kit``).

References without a registry (``python:3``, ``team/app``) go to ``template_image_registry``
when the operator names one (a mirror of Docker Hub, say), else to skopeo's default; registries
listed in ``template_image_insecure`` are reached without TLS verification, and
``template_image_ca_file`` is trusted for the others.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from sandhold.runtime import oci
from sandhold.runtime.templates import DEFAULT_PATH, SANDBOX_USER_UID, Template, flocked

if TYPE_CHECKING:
    from sandhold.runtime.runtime import Runtime

log = logging.getLogger(__name__)
REFS = ".images.json"  # in the template store: reference -> template, for the next build


def qualified(rt: Runtime, ref: str) -> str:
    """``ref`` with the operator's registry in front when it names none."""
    mirror = rt.settings.template_image_registry
    if mirror and oci.parse_reference(ref).domain is None:
        return f"{mirror.rstrip('/')}/{ref if '/' in ref.split(':')[0] else 'library/' + ref}"
    return ref


def from_image(rt: Runtime, ref: str, *, username: str | None = None,
               password: str | None = None, force: bool = False) -> Template:  # fmt: skip
    """The template of image ``ref`` (pulled now, or the one a build of it made before unless
    ``force``)."""
    full = qualified(rt, ref)
    store = rt.templates
    with flocked(store.root / ".images.lock"):
        known = _refs(store.root)
        if not force and (name := known.get(full)) and store.exists(name):
            return store.get(name)
        staging = Path(tempfile.mkdtemp(dir=store.root, prefix=".pull-"))
        try:
            s = rt.settings
            domain = oci.parse_reference(full).domain or ""
            cfg = oci.pull(full, staging / "rootfs", username=username, password=password,
                           insecure=domain in s.template_image_insecure,
                           ca_file=s.template_image_ca_file)  # fmt: skip
            name = "img-" + cfg.digest.split(":")[-1][:24]
            if not store.exists(name):
                env = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", **cfg.env}
                store.build_from_rootfs(name, staging / "rootfs", copy=False, env=env,
                                        workdir=cfg.workdir or "/",
                                        user=_user(cfg.user, staging / "rootfs"),
                                        agent_kit=True)  # fmt: skip
                log.info("imported image %s (%s) as template %s", full, cfg.digest, name)
            known[full] = name
            _write_refs(store.root, known)
            return store.get(name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _user(image_user: str, rootfs: Path) -> str:
    """The image's user by name (the agent starts processes by name): a numeric one by its
    name in the image's ``/etc/passwd`` (uid 1000 is ``user``, which every template has);
    none, or a uid the image does not name: root."""
    name = image_user.split(":")[0]
    if not name.isdigit():
        return name or "root"
    uid = int(name)
    try:
        lines = (rootfs / "etc/passwd").read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split(":")
        if len(fields) > 2 and fields[2] == str(uid) and fields[0]:
            return fields[0]
    if uid == SANDBOX_USER_UID:
        return "user"  # (templates.py adds it)
    if uid:
        log.warning("image user %s is not in its /etc/passwd: its processes run as root", name)
    return "root"


def _refs(root: Path) -> dict[str, str]:
    try:
        data = json.loads((root / REFS).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _write_refs(root: Path, refs: dict[str, str]) -> None:
    part = root / f".{REFS}.new"
    part.write_text(json.dumps(refs, indent=2))
    part.rename(root / REFS)
