"""The snapshot store's copy in S3 (or an S3-compatible store), so that every server given the
same bucket, prefix and secrets keys lists and starts the snapshots any of them took.

Under ``snapshot_s3_prefix`` a snapshot is ``meta/<snap-id>`` (its snapshot.json and the list of
its files with their sizes) and ``data/<snap-id>/disk.img``, ``data/<snap-id>/checkpoint/...``.
The data objects are written first and the metadata last, so a snapshot is listed only once
all of it is there; a delete removes the metadata first.

Every object, the metadata too, is sealed with the secrets key ring (sealing.py), so no image
is ever held in memory whole, and only a file's data extents are stored.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from sandhold.egress.secrets import KeyRing, ring_of
from sandhold.errors import CheckpointFailed, SecretKeyError, Unavailable
from sandhold.runtime.checkpoint.sealing import broken, seal_bytes, seal_file, unseal

if TYPE_CHECKING:
    from sandhold.config import Settings

log = logging.getLogger(__name__)

PART = 16 << 20  # multipart upload part (S3's least is 5 MiB)
MAX_META = 4 << 20
META_FILE = "snapshot.json"  # in the local directory (snapshots.META)
# What a snapshot's directory holds besides its META (a fleet's template data: its own).
TOP_LEVEL = frozenset({"disk.img", "checkpoint"})


class S3Remote:
    """The snapshots of one bucket and prefix; thread-safe (the service calls it from its
    worker threads)."""

    def __init__(self, settings: Settings, top_level: frozenset[str] = TOP_LEVEL) -> None:
        import boto3
        from botocore.config import Config

        self.settings = settings
        self.top_level = top_level
        self.bucket = str(settings.snapshot_s3_bucket)
        self.prefix = settings.snapshot_s3_prefix
        self.url = f"s3://{self.bucket}/{self.prefix}"
        endpoint = settings.snapshot_s3_endpoint_url
        config = Config(
            retries={"max_attempts": 3, "mode": "standard"},
            connect_timeout=10,
            read_timeout=120,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            s3={"addressing_style": "path"} if endpoint else None,
        )
        self.client: Any = boto3.session.Session().client(
            "s3", endpoint_url=endpoint, region_name=settings.snapshot_s3_region, config=config
        )
        self._metas: dict[str, tuple[str, dict[str, Any]]] = {}  # key -> (etag, metadata)
        self._lock = threading.Lock()

    @functools.cached_property
    def ring(self) -> KeyRing:
        return ring_of(self.settings)

    def _meta_key(self, snapshot_id: str) -> str:
        return f"meta/{snapshot_id}"

    def _data_key(self, snapshot_id: str, rel: str) -> str:
        return f"data/{snapshot_id}/{rel}"

    @contextlib.contextmanager
    def _s3(self, what: str) -> Iterator[None]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except (BotoCoreError, ClientError) as e:
            raise Unavailable(f"the S3 snapshot store ({self.url}) failed to {what}: {e}") from None

    def _damaged(self, snapshot_id: str, name: str, why: str) -> CheckpointFailed:
        return CheckpointFailed(
            f"snapshot {snapshot_id}: {self.url}{name} does not open ({why}): the object is "
            "damaged or was tampered with; nothing of it was used"
        )

    def _foreign_key(self, snapshot_id: str, name: str, e: SecretKeyError) -> CheckpointFailed:
        return CheckpointFailed(
            f"snapshot {snapshot_id}: {self.url}{name} was sealed with a key this server's "
            f"secrets key ring does not have ({e}); every server sharing a snapshot store "
            "needs the same secrets_keys"
        )

    # -- writing --------------------------------------------------------------------------------
    def put(self, meta: dict[str, Any], staging: Path) -> None:
        """Upload the snapshot in ``staging`` (``meta`` is its snapshot.json): its files, then
        its metadata. On any failure whatever was uploaded is removed again."""
        snapshot_id = str(meta["id"])
        files = _files(staging)
        done: list[str] = []
        try:
            for rel in files:
                name = self._data_key(snapshot_id, rel)
                done.append(name)
                with contextlib.closing(seal_file(self.ring, name, staging / rel)) as records:
                    self._upload(name, records)
            name = self._meta_key(snapshot_id)
            body = json.dumps({"snapshot": meta, "files": files}).encode()
            if len(body) > MAX_META:
                raise CheckpointFailed(f"snapshot {snapshot_id}: its metadata is too large")
            with self._s3(f"upload {name}"):
                self.client.put_object(
                    Bucket=self.bucket,
                    Key=self.prefix + name,
                    Body=seal_bytes(self.ring, name, body),
                )
        except BaseException:
            self._remove([self._meta_key(snapshot_id), *done])  # a put may land and still fail
            raise

    def _upload(self, name: str, records: Iterator[bytes]) -> None:
        key, buf, upload_id = self.prefix + name, bytearray(), None
        parts: list[dict[str, Any]] = []
        with self._s3(f"upload {name}"):
            try:
                for record in records:
                    buf += record
                    if len(buf) >= PART:
                        if upload_id is None:
                            upload_id = self.client.create_multipart_upload(
                                Bucket=self.bucket, Key=key
                            )["UploadId"]
                        parts.append(self._part(key, upload_id, len(parts) + 1, bytes(buf)))
                        buf = bytearray()
                if upload_id is None:
                    self.client.put_object(Bucket=self.bucket, Key=key, Body=bytes(buf))
                    return
                if buf:
                    parts.append(self._part(key, upload_id, len(parts) + 1, bytes(buf)))
                self.client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                )
            except BaseException:
                if upload_id is not None:
                    with contextlib.suppress(Exception):
                        self.client.abort_multipart_upload(
                            Bucket=self.bucket, Key=key, UploadId=upload_id
                        )
                raise

    def _part(self, key: str, upload_id: str, number: int, body: bytes) -> dict[str, Any]:
        r = self.client.upload_part(
            Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
        )
        return {"PartNumber": number, "ETag": r["ETag"]}

    def _remove(self, names: list[str]) -> None:
        for i in range(0, len(names), 1000):
            batch = [{"Key": self.prefix + n} for n in names[i : i + 1000]]
            with contextlib.suppress(Exception):
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch})

    def delete(self, snapshot_id: str) -> bool:
        """Remove the snapshot's metadata (it is gone for every server at once), then its
        data; whether it was there."""
        name = self._meta_key(snapshot_id)
        with self._s3(f"delete {name}"):
            found = self._head(name) is not None
            self.client.delete_object(Bucket=self.bucket, Key=self.prefix + name)
            data = self._keys(f"data/{snapshot_id}/")
            for i in range(0, len(data), 1000):
                batch = [{"Key": self.prefix + n} for n in data[i : i + 1000]]
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch})
        with self._lock:
            self._metas.pop(name, None)
        return found or bool(data)

    # -- reading --------------------------------------------------------------------------------
    def _listing(self, under: str) -> dict[str, str]:
        """The objects under ``under``: name -> ETag."""
        out = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix + under
        ):
            out.update(
                {
                    o["Key"].removeprefix(self.prefix): str(o["ETag"])
                    for o in page.get("Contents", [])
                }
            )
        return out

    def _keys(self, under: str) -> list[str]:
        return list(self._listing(under))

    def _head(self, name: str) -> str | None:
        from botocore.exceptions import ClientError

        try:
            return str(self.client.head_object(Bucket=self.bucket, Key=self.prefix + name)["ETag"])
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def exists(self, snapshot_id: str) -> bool:
        with self._s3(f"look up {snapshot_id}"):
            return self._head(self._meta_key(snapshot_id)) is not None

    def _meta(self, snapshot_id: str) -> dict[str, Any] | None:
        """The metadata object (``snapshot``, ``files``), or None if there is none."""
        name = self._meta_key(snapshot_id)
        with self._s3(f"read {name}"):
            try:
                obj = self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)
            except self.client.exceptions.NoSuchKey:
                return None
            etag, body = str(obj["ETag"]), obj["Body"]
            buf = bytearray()

            def collect(offset: int, data: bytes) -> None:
                if offset != len(buf) or offset + len(data) > MAX_META:
                    raise broken("its metadata is malformed")
                buf.extend(data)

            try:
                try:
                    size = unseal(self.ring, name, body.read, collect)
                finally:
                    body.close()
                meta = json.loads(bytes(buf)) if size == len(buf) else None
                if (
                    not isinstance(meta, dict)
                    or not isinstance(meta.get("snapshot"), dict)
                    or meta["snapshot"].get("id") != snapshot_id
                    or not isinstance(meta.get("files"), dict)
                ):
                    raise broken("its metadata is malformed")
            except CheckpointFailed as e:
                raise self._damaged(snapshot_id, name, e.message) from None
            except SecretKeyError as e:
                raise self._foreign_key(snapshot_id, name, e) from None
            except ValueError:
                raise self._damaged(snapshot_id, name, "its metadata is not JSON") from None
        with self._lock:
            self._metas[name] = (etag, meta)
        return meta

    def get(self, snapshot_id: str) -> dict[str, Any] | None:
        """The snapshot.json of ``snapshot_id`` in the store, or None."""
        meta = self._meta(snapshot_id)
        return None if meta is None else self._here(meta)

    def _here(self, meta: dict[str, Any]) -> dict[str, Any]:
        """A snapshot.json as kept in this store (wherever it was uploaded to first: a store
        copied to another bucket or prefix still opens, names being relative to the prefix)."""
        return {**meta["snapshot"], "remote": self.url}

    def list(self) -> dict[str, dict[str, Any]]:
        """Every snapshot.json in the store that opens, by id (one that does not is left out:
        a damaged object fails where it is used, not every listing)."""
        with self._s3("list the snapshots"):
            listing = self._listing("meta/")
        out = {}
        for name, etag in listing.items():
            snapshot_id = name.removeprefix("meta/")
            with self._lock:
                cached = self._metas.get(name)
            if cached is not None and cached[0] == etag:  # metadata is never rewritten in place
                out[snapshot_id] = self._here(cached[1])
                continue
            try:
                snap = self.get(snapshot_id)
            except CheckpointFailed as e:
                log.warning("snapshot store: %s left out of the listing: %s", snapshot_id, e)
                continue
            if snap is not None:
                out[snapshot_id] = snap
        return out

    def fetch(self, snapshot_id: str, into: Path) -> dict[str, Any]:
        """Download and open the snapshot into the (empty, private) directory ``into``: its
        files and its snapshot.json. Raises CheckpointFailed for an object that does not open
        or is missing (``into`` is then the caller's to remove)."""
        meta = self._meta(snapshot_id)
        if meta is None:
            raise CheckpointFailed(f"snapshot {snapshot_id} is no longer in {self.url}")
        for rel, want in meta["files"].items():
            parts = PurePosixPath(rel).parts
            if (
                not parts
                or parts[0] not in self.top_level
                or ".." in parts
                or rel.startswith("/")
                or not isinstance(want, int)
            ):
                raise self._damaged(snapshot_id, self._meta_key(snapshot_id), f"file {rel!r}")
            self._fetch_file(snapshot_id, rel, into / rel, want)
        (into / META_FILE).write_text(json.dumps(self._here(meta)))
        return self._here(meta)

    def _fetch_file(self, snapshot_id: str, rel: str, dest: Path, want: int) -> None:
        name = self._data_key(snapshot_id, rel)
        dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            with self._s3(f"download {name}"):
                try:
                    obj = self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)
                except self.client.exceptions.NoSuchKey:
                    raise broken("the object is missing") from None
                body = obj["Body"]
                try:

                    def write(offset: int, data: bytes) -> None:
                        if offset + len(data) > want:
                            raise broken("a record lies past the file's end")
                        os.pwrite(fd, data, offset)

                    size = unseal(self.ring, name, body.read, write)
                finally:
                    body.close()
            if size != want:
                raise broken(f"it holds {size} bytes, its snapshot says {want}")
            os.ftruncate(fd, size)
        except CheckpointFailed as e:
            raise self._damaged(snapshot_id, name, e.message) from None
        except SecretKeyError as e:
            raise self._foreign_key(snapshot_id, name, e) from None
        finally:
            os.close(fd)


def _files(staging: Path) -> dict[str, int]:
    """The snapshot's files (relative paths -> sizes), its metadata aside."""
    out = {}
    for dirpath, dirs, files in os.walk(staging):
        dirs.sort()
        for f in sorted(files):
            path = Path(dirpath, f)
            rel = path.relative_to(staging).as_posix()
            if rel == META_FILE:
                continue
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointFailed(f"snapshot file {rel} is not a regular file")
            out[rel] = st.st_size
    return out


_REMOTES: dict[tuple[object, ...], S3Remote] = {}
_REMOTES_LOCK = threading.Lock()


def remote_for(settings: Settings) -> S3Remote | None:
    """The store's S3 copy of these settings, or None when no bucket is set; one per
    configuration (a client and a key ring are not made for every call)."""
    if not settings.snapshot_s3_bucket:
        return None
    key = (
        settings.snapshot_s3_bucket,
        settings.snapshot_s3_prefix,
        settings.snapshot_s3_endpoint_url,
        settings.snapshot_s3_region,
        tuple(settings.secrets_keys),
        settings.secrets_key_file,
        settings.data_dir,
    )
    with _REMOTES_LOCK:
        remote = _REMOTES.get(key)
        if remote is None:
            remote = _REMOTES[key] = S3Remote(settings)
        return remote
