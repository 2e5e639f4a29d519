"""Templates made of OCI images (a build's ``from_image`` base): the image is pulled and unpacked
(oci.py) into a root filesystem template of the store, named by the image's digest, so an image
is imported once however many templates build on it. The image's config carries over (env,
workdir, user); its root needs no Python of ours: the agent runs on the host's (``agent_kit``).

References without a registry (``python:3``, ``team/app``) go to ``template_image_registry``
when the operator names one (a mirror of Docker Hub, say), else to skopeo's default; registries
listed in ``template_image_insecure`` are reached without TLS verification, and
``template_image_ca_file`` is trusted for the others. Only registries the operator allows are
reached (registry_access.py).

An image's template is a team's only once the team proved it may pull the image (issue 27): its
own pull succeeded, or its own manifest fetch (``skopeo inspect --raw`` with its credentials, or
none) returned the digest of a template this host holds, fetched from the same repository, so
the layers need no second download. ``Template.teams`` records who proved it; only they list and
start it. An image pulled anonymously from where the operator marked public
(``template_image_public``) is every team's (``Template.public``); a pull with credentials never
is.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandhold.errors import InvalidRequest, TemplateBuildFailed
from sandhold.runtime import safefs
from sandhold.runtime.host import Host
from sandhold.runtime.staging import make as make_staging
from sandhold.runtime.templates import oci, registry_access
from sandhold.runtime.templates.store import (
    DEFAULT_PATH,
    PULL,
    SANDBOX_USER_UID,
    Template,
    flocked,
)

log = logging.getLogger(__name__)
REFS = ".images.json"  # in the template store: reference -> template, for the next build
PREFIX = "img-"  # an image's template: img-<its digest's first 24 hex digits>


def qualified(host: Host, ref: str) -> str:
    """``ref`` with the operator's registry in front when it names none."""
    mirror = host.settings.template_image_registry
    if mirror and oci.parse_reference(ref).domain is None:
        return f"{mirror.rstrip('/')}/{ref if '/' in ref.split(':')[0] else 'library/' + ref}"
    return ref


def restricted(t: Template) -> bool:
    """Whether ``t`` is an image's template, usable only by the teams in ``t.teams`` (a record
    from before teams were kept holds none: each team proves access again)."""
    legacy = t.agent_kit and t.owner is None and t.name.startswith(PREFIX)
    return t.teams is not None or legacy


def may_use(t: Template, team: str | None) -> bool:
    """Whether ``team`` (None: the operator) may see and start ``t``."""
    if team is None or not restricted(t):
        return True
    return team in (t.teams or []) or (t.public and t.teams is not None)


def from_image(
    host: Host,
    ref: str,
    *,
    team: str | None = None,
    username: str | None = None,
    password: str | None = None,
    force: bool = False,
    log_to: Callable[[str], None] | None = None,
) -> Template:
    """The template of image ``ref`` for ``team`` (None: the operator): pulled now with these
    credentials, or the one a pull made before (unless ``force``) if the team may use it
    already or proves it may by fetching the manifest with its own credentials."""
    s = host.settings
    full = qualified(host, ref)
    r = oci.parse_reference(full)
    registry_access.check_allowed(s, r.domain)
    registry_access.check_addresses(s, r.domain)
    anonymous = username is None
    shared = registry_access.shared(s, r, anonymous)
    opts: dict[str, Any] = {
        "username": username,
        "password": password,
        "insecure": (r.domain or "") in s.template_image_insecure,
        "ca_file": s.template_image_ca_file,
    }
    store = host.templates
    with flocked(store.root / ".images.lock"):
        known = _refs(store.root)
        name = known.get(full)
        if not force and name and store.exists(name):
            t = store.get(name)
            if team is None or team in (t.teams or []) or (shared and may_use(t, team)):
                return _grant(host, t, team, shared)
        if not force:  # the team's own manifest fetch: is it an image this host holds?
            name = image_name(oci.resolve(full, store.root, **opts))
            repo = {oci.parse_reference(k).name for k, v in known.items() if v == name}
            if store.exists(name) and (r.name in repo or may_use(store.get(name), team)):
                known[full] = name  # fetched by digest from the same repository: its layers
                _write_refs(store.root, known)
                return _grant(host, store.get(name), team, shared)
        staging = make_staging(store.root, PULL)
        try:
            limits = oci.bounds(s.template_build_disk_mb, s.template_unpack_max_depth)
            refuse = s.template_image_privileged == "refuse"
            cfg = oci.pull(full, staging / "rootfs", limits=limits, **opts)
            if cfg.devices and refuse:
                raise TemplateBuildFailed(
                    f"FROM {ref}: the image has device nodes ({cfg.devices[0]}), which "
                    "template_image_privileged=refuse does not allow"
                )
            if cfg.devices and log_to is not None:
                shown = ", ".join(cfg.devices[:10]) + (" ..." if len(cfg.devices) > 10 else "")
                log_to(
                    f"FROM {ref}: dropped {len(cfg.devices)} device nodes of the image "
                    f"(a sandbox's /dev is its own): {shown}"
                )
            name = image_name(cfg.digest)
            if not store.exists(name):
                env = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", **cfg.env}
                store.build_from_rootfs(
                    name,
                    staging / "rootfs",
                    copy=False,
                    env=env,
                    workdir=cfg.workdir or "/",
                    user=_user(cfg.user, staging / "rootfs"),
                    agent_kit=True,
                    teams=[],
                    public=False,
                    refuse_privileged=refuse,
                )
                log.info("imported image %s (%s) as template %s", full, cfg.digest, name)
            known[full] = name
            _write_refs(store.root, known)
            return _grant(host, store.get(name), team, shared)
        finally:
            safefs.remove_quietly(staging)


def image_name(digest: str) -> str:
    return PREFIX + digest.split(":")[-1][:24]


def _grant(host: Host, t: Template, team: str | None, shared: bool) -> Template:
    """Record that ``team`` proved access to ``t`` (and, ``shared``, that every team may use
    it: it came anonymously from where the operator marked public)."""
    teams = sorted({*(t.teams or []), *([team] if team else [])})
    public = (t.public and t.teams is not None) or shared
    if teams != t.teams or public != t.public:
        t.teams, t.public = teams, public
        host.templates.update(t)
    return t


def _user(image_user: str, rootfs: Path) -> str:
    """The image's user by name (the agent starts processes by name): a numeric one by its
    name in the image's ``/etc/passwd`` (uid 1000 is ``user``, which every template has);
    none, or a uid the image does not name: root."""
    name = image_user.split(":")[0]
    if not name.isdigit():
        return name or "root"
    uid = int(name)
    try:  # as the sandbox sees it: the image's etc/passwd may be a link to anywhere
        with safefs.Root(rootfs) as root:
            lines = root.read_text("etc/passwd").splitlines()
    except (OSError, InvalidRequest):
        lines = []
    for line in lines:
        fields = line.split(":")
        if len(fields) > 2 and fields[2] == str(uid) and fields[0]:
            return fields[0]
    if uid == SANDBOX_USER_UID:
        return "user"  # templates.py adds it
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
