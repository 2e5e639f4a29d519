"""Templates in the fleet's shared store (docs/fleet.md): a team's template built on one host is
usable on every host that shares the store.

In the store (``snapshot_s3_prefix``), every object sealed with the secrets key ring as a
snapshot's (snapshot_remote.py):

- ``fleet-templates/``: one record per template (its store name): the template's record with
  its files named, not placed: the ids of its layers, and either the template whose root it
  stands on (``rootfs_of``: ``base``, ``code-interpreter-v1``, another shared one) or its own
  root's object (an image's template), and the maker's ``uid_base``.
- ``fleet-template-data/``: ``layer-<id>`` (``layer.tar``) and ``root-<name>-<ms>``
  (``rootfs.tar``): GNU tar archives with numeric owners, xattrs (overlayfs' opaque marks) and
  devices (its whiteouts). A layer's id is its build cache key, so a layer is uploaded once.
  ``warm-<name>-<key>``: a template's warm start checkpoint (runtime/checkpoint/warm.py) as its
  maker made it, taken by a host whose key for it is the same (the same CRIU build, agent and
  ``uid_base``); any other host makes its own.

A host learns a record as a **stub**: the record alone, with ``fleet["stub"]``; the first
``get`` of it fetches its files (``fetch``), under the template's lock, and records it whole.
Its files are trusted as the host's own disk: only hosts holding the key ring wrote them, from
their own template store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandhold.errors import SandholdError, TemplateNotFound, Unavailable
from sandhold.runtime import disk, safefs, staging
from sandhold.runtime.checkpoint import process_tree, warm
from sandhold.runtime.checkpoint.snapshot_remote import META_FILE, S3Remote
from sandhold.runtime.spec import NAME_RE
from sandhold.runtime.templates.layers import NEW
from sandhold.runtime.templates.store import FLEET, Template, flocked
from sandhold.runtime.uids import ID_RANGE

if TYPE_CHECKING:
    from sandhold.config import Settings
    from sandhold.runtime.templates.layers import LayerStore
    from sandhold.runtime.templates.store import TemplateStore

log = logging.getLogger(__name__)

RECORDS, DATA = "fleet-templates/", "fleet-template-data/"
LAYER, ROOT = "layer.tar", "rootfs.tar"
WARM_FILES = frozenset({disk.IMAGE, process_tree.IMAGES, warm.META})
LOCKS = ".fleet-locks"
MAX_DEPTH = 8  # templates standing on shared templates, fetched in turn
ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")  # a layer's, a root's, a checkpoint's key
TAR_OPTIONS = ["--numeric-owner", "--xattrs", "--xattrs-include=*", "--sparse"]


def shared(t: Template) -> bool:
    """A template the fleet shares: a team's build or a team's image (``base``, the built-in
    and operator templates are made on every host)."""
    return t.owner is not None or t.teams is not None


class SharedTemplates:
    def __init__(
        self,
        settings: Settings,
        templates: TemplateStore,
        layers: LayerStore,
        warm_starts: warm.WarmStarts,
    ) -> None:
        def remote(prefix: str) -> S3Remote:
            s = settings.model_copy(
                update={"snapshot_s3_prefix": settings.snapshot_s3_prefix + prefix}
            )
            return S3Remote(s, top_level=frozenset({LAYER, ROOT}) | WARM_FILES)

        self.records = remote(RECORDS)
        self.data = remote(DATA)
        self.templates = templates
        self.layers = layers
        self.warm = warm_starts

    def listing(self) -> dict[str, dict[str, Any]]:
        """Every template record in the store, by store name (one whose names would not make
        paths here is left out, logged: sealed records are ours, but a name is a path)."""
        out = {}
        for name, r in self.records.list().items():
            if _well_formed(name.removeprefix("tpl-"), r):
                out[name.removeprefix("tpl-")] = r
            else:
                log.warning("template record %s in the store left out: malformed", name)
        return out

    def _lock(self, name: str) -> contextlib.AbstractContextManager[bool]:
        """A template's lock, across processes: one fetch of it at a time."""
        locks = self.templates.root / LOCKS
        locks.mkdir(mode=0o700, exist_ok=True)
        return flocked(locks / name)

    # -- from this host to the store -------------------------------------------------------------
    def publish(self, t: Template) -> Template:
        """Put ``t``'s files (those not in the store yet) and its record in the store; returns
        ``t`` as recorded here afterwards (with its ``fleet`` part)."""
        assert t.fleet is None or not t.stub, "a stub has no files of this host's to publish"
        place = self._place(t)
        for layer_id in place["layers"]:
            self._put_dir(f"layer-{layer_id}", LAYER, Path(self.layers.path(layer_id)))
        if place.get("root"):
            self._put_dir(place["root"], ROOT, t.rootfs)
        record = {**t.to_json(), "rootfs": "", "layers": [], "fleet": None}
        empty = staging.make(self.templates.root, FLEET)  # a record has no files
        try:
            self.records.put({"id": f"tpl-{t.name}", "template": record, "place": place}, empty)
        finally:
            safefs.remove_quietly(empty)
        t.fleet = place
        self.templates.update(t, touch=False)
        return t

    def publish_warm(self, t: Template, checkpoint: Path) -> Template:
        """Put ``t``'s warm start checkpoint (made here) in the store, and say so in its record."""
        assert t.fleet is not None, "its files first"
        object_id = f"warm-{t.name}-{checkpoint.name}"
        if not self.data.exists(object_id):
            self.data.put({"id": object_id}, checkpoint)
        t.fleet = {**t.fleet, "warm": checkpoint.name}
        t.updated_at = time.time()
        return self.publish(t)

    def _place(self, t: Template) -> dict[str, Any]:
        if t.fleet is not None:  # published (or fetched) before: its files are in the store
            return {k: v for k, v in t.fleet.items() if k != "stub"}
        place: dict[str, Any] = {"uid_base": self.templates.uid_base}
        place["layers"] = [Path(p).name for p in t.layers]
        for p in t.layers:
            if Path(p).parent != self.layers.root:
                raise Unavailable(f"template {t.name}: layer {p} is not in the layer store")
        if t.rootfs == self.templates.root / t.name / "rootfs":
            place["root"] = f"root-{t.name}-{int(t.created_at * 1000)}"
        elif t.rootfs.parent.parent == self.templates.root:
            place["rootfs_of"] = t.rootfs.parent.name
        else:
            raise Unavailable(f"template {t.name}: its root {t.rootfs} is no template's")
        return place

    def _put_dir(self, object_id: str, archive: str, directory: Path) -> None:
        if self.data.exists(object_id):
            return
        work = staging.make(self.templates.root, FLEET)
        try:
            _tar(["--create", "--file", str(work / archive), "--directory", str(directory), "."])
            self.data.put({"id": object_id}, work)
        finally:
            safefs.remove_quietly(work)

    def forget(self, name: str, fleet: dict[str, Any] | None) -> None:
        """The template's record out of the store, then its own root (layers stay: others may
        stand on them)."""
        self.records.delete(f"tpl-{name}")
        if fleet and fleet.get("root"):
            self.data.delete(str(fleet["root"]))

    # -- from the store to this host -------------------------------------------------------------
    def learn(self, record: dict[str, Any], local: Template | None) -> None:
        """Record the store's newer ``record`` of a template here: a stub, or, for one whose
        files this host has, its new record over its own files."""
        t = Template.from_json(record["template"])
        t.fleet = {**record["place"], "stub": True}
        t.rootfs = self.templates.root / t.name / "rootfs"
        t.layers = [self.layers.path(i) for i in record["place"]["layers"]]
        with self._lock(t.name):
            if local is not None and not local.stub:
                t.rootfs, t.layers = local.rootfs, local.layers
                t.fleet = {**record["place"], "stub": False}
                self.templates.update(t, touch=False)
            else:
                self.templates.add(t, made=False)

    def fetch(self, stub: Template, depth: int = 0) -> Template:
        """The stub's files from the store, recorded whole (``TemplateStore.get`` of a stub)."""
        if depth > MAX_DEPTH:
            raise TemplateNotFound(f"template {stub.name}: stands on too many shared templates")
        with self._lock(stub.name):
            now = self.templates.get_record(stub.name)
            if now is None or not now.stub:  # fetched meanwhile, or gone
                return self.templates.get(stub.name)
            t0 = time.monotonic()
            assert now.fleet is not None
            place = now.fleet
            if place.get("rootfs_of"):
                base = self.templates.get_record(place["rootfs_of"])
                if base is not None and base.stub:
                    base = self.fetch(base, depth + 1)
                else:
                    base = self.templates.get(place["rootfs_of"])
                now.rootfs = base.rootfs
            with self.layers.building():  # no collection meanwhile takes a layer it counts on
                for layer_id in place["layers"]:
                    self._layer(layer_id, int(place["uid_base"]))
                work = self.templates.staging_dir(now.name)
                try:
                    if place.get("root"):
                        self._get_dir(str(place["root"]), ROOT, work / "rootfs", place)
                    now.fleet = {**place, "stub": False}
                    got = self.templates.add_staged(
                        now, work, rootfs=bool(place.get("root")), made=False
                    )
                except BaseException:
                    safefs.remove_quietly(work)
                    raise
        if got.warm:
            try:
                self.warm.take(got)  # its first sandbox here starts warm too
            except SandholdError as e:
                log.warning("template %s boots cold here: %s", got.name, e)
        log.info("template %s fetched from the store in %.1f s", now.name, time.monotonic() - t0)
        return got

    def fetch_warm(self, t: Template, target: Path) -> bool:
        """The maker's warm start checkpoint of ``t`` into ``target`` (WarmStarts.fetch), if the
        store has one under this host's key."""
        key = (t.fleet or {}).get("warm")
        if key != target.name:
            return False  # none, or made for another CRIU build, agent or uid_base
        work = staging.make(target.parent, ".new-")  # (what a warm build's sweep removes)
        try:
            self.data.fetch(f"warm-{t.name}-{key}", work)
            (work / META_FILE).unlink()
            for image in (work / process_tree.IMAGES).iterdir():  # as its maker keeps them
                if not image.name.startswith("userns-"):
                    image.chmod(0o444)
            work.rename(target)
        except SandholdError as e:
            log.warning("template %s: its maker's warm start checkpoint not taken: %s", t.name, e)
            safefs.remove_quietly(work)
            return False
        log.info("template %s starts warm from its maker's checkpoint", t.name)
        return True

    def _layer(self, layer_id: str, uid_base: int) -> None:
        if self.layers.exists(layer_id):
            return
        work = staging.make(self.layers.root, NEW)
        try:
            self._get_dir(f"layer-{layer_id}", LAYER, work / "layer", {"uid_base": uid_base})
            with contextlib.suppress(OSError):  # (one fetched meanwhile is the same layer)
                (work / "layer").rename(self.layers.root / layer_id)
        finally:
            safefs.remove_quietly(work)

    def _get_dir(self, object_id: str, archive: str, into: Path, place: dict[str, Any]) -> None:
        download = staging.make(self.templates.root, FLEET)
        try:
            self.data.fetch(object_id, download)
            into.mkdir(mode=0o755)
            _tar(["--extract", "--file", str(download / archive), "--directory", str(into)])
        finally:
            safefs.remove_quietly(download)
        if int(place["uid_base"]) != self.templates.uid_base:
            _rebase(into, int(place["uid_base"]), self.templates.uid_base)


def _well_formed(name: str, record: dict[str, Any]) -> bool:
    try:
        place, template = record["place"], record["template"]
        names = [name, template["name"], *([place["rootfs_of"]] if "rootfs_of" in place else [])]
        ids = [*place["layers"], *([place["warm"]] if "warm" in place else [])]
        return (
            template["name"] == name
            and all(isinstance(n, str) and NAME_RE.match(n) for n in names)
            and all(isinstance(i, str) and ID.match(i) for i in ids)
            and (place.get("root") is None or bool(ID.match(str(place["root"]))))
            and isinstance(place["uid_base"], int)
        )
    except (KeyError, TypeError):
        return False


def _tar(args: list[str]) -> None:
    r = subprocess.run(["tar", *TAR_OPTIONS, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise Unavailable(f"tar {args[0]} failed: {r.stderr.strip()[-500:]}")


def _rebase(root: Path, old: int, new: int) -> None:
    """Owners of the maker's canonical range (``old``) to this host's (``new``)."""

    def moved(i: int) -> int:
        return new + (i - old) if old <= i < old + ID_RANGE else i

    def chown(dir_fd: int | None, name: str, st: os.stat_result) -> None:
        uid, gid = moved(st.st_uid), moved(st.st_gid)
        if (uid, gid) != (st.st_uid, st.st_gid):
            os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)

    chown(None, str(root), os.lstat(root))
    safefs.walk(root, chown)
