"""The deliverables store: files an agent publishes outlive the session's sandbox and workspace.

A local directory by default; any S3-compatible object store by configuration (boto3). Each
deliverable gets an id (its row in the store) and a stable URL: the gateway's own
``/v1/deliverables/{id}`` for local storage, the object's URL for S3.
"""

from __future__ import annotations

import abc
import asyncio
import os
from pathlib import Path
from typing import Any

from sandhold.config import Settings
from sandhold.errors import NotFound


class DeliverableStore(abc.ABC):
    kind: str

    @abc.abstractmethod
    async def put(self, key: str, data: bytes, content_type: str) -> str:
        """Store ``data`` under ``key``; returns the deliverable's URL."""

    @abc.abstractmethod
    async def get(self, key: str) -> bytes: ...


class LocalDeliverables(DeliverableStore):
    kind = "local"

    def __init__(self, root: Path, public_url: str | None) -> None:
        self.root = root
        self.public_url = (public_url or "").rstrip("/")
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise NotFound(f"deliverable {key!r} does not exist")
        return path

    async def put(self, key: str, data: bytes, content_type: str) -> str:
        path = self._path(key)

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".part")
            tmp.write_bytes(data)
            os.replace(tmp, path)

        await asyncio.to_thread(write)
        deliverable_id = key.rsplit("/", 1)[-1].split("-", 1)[0]
        return f"{self.public_url}/v1/deliverables/{deliverable_id}"

    async def get(self, key: str) -> bytes:
        try:
            return await asyncio.to_thread(self._path(key).read_bytes)
        except FileNotFoundError:
            raise NotFound(f"deliverable {key!r} is missing from the store") from None


class S3Deliverables(DeliverableStore):
    kind = "s3"

    def __init__(self, settings: Settings) -> None:
        import boto3

        self.bucket = settings.gateway_s3_bucket
        self.prefix = settings.gateway_s3_prefix
        self.endpoint = settings.gateway_s3_endpoint_url
        self.client: Any = boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=settings.gateway_s3_region
        )

    async def put(self, key: str, data: bytes, content_type: str) -> str:
        full = self.prefix + key
        await asyncio.to_thread(
            self.client.put_object,
            Bucket=self.bucket,
            Key=full,
            Body=data,
            ContentType=content_type,
        )
        base = (self.endpoint or f"https://{self.bucket}.s3.amazonaws.com").rstrip("/")
        return f"{base}/{self.bucket}/{full}" if self.endpoint else f"{base}/{full}"

    async def get(self, key: str) -> bytes:
        def read() -> bytes:
            try:
                obj = self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)
            except self.client.exceptions.NoSuchKey:
                raise NotFound(f"deliverable {key!r} is missing from the store") from None
            return bytes(obj["Body"].read())

        return await asyncio.to_thread(read)


def make_deliverables(settings: Settings) -> DeliverableStore:
    if settings.gateway_deliverables == "s3":
        return S3Deliverables(settings)
    return LocalDeliverables(settings.gateway_deliverables_path, settings.gateway_public_url)
