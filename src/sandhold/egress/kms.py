"""The secrets key ring wrapped by a key-management service (envelope encryption), with AWS KMS's
API (``secrets_kms_key_id``; a service speaking it at ``secrets_kms_endpoint_url``): the key file
holds each data key only as the KMS's ciphertext (``kms:<base64>``), and the host asks the KMS to
unwrap them when it loads the ring (at start), and for a new one on rotation. The plaintext keys
live in memory only: a host that loses the KMS keeps sealing and opening with the ring it has
until it restarts, and then refuses to start, saying why; a key in clear never reaches the file.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from typing import Any

from sandhold.errors import SecretKeyError

PREFIX = "kms:"
KEY_BYTES = 32


class Kms:
    def __init__(self, key_id: str, endpoint_url: str | None, region: str | None) -> None:
        import boto3
        from botocore.config import Config

        self.key_id = key_id
        self.where = endpoint_url or "AWS KMS"
        config = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=10)
        self.client: Any = boto3.session.Session().client(
            "kms", endpoint_url=endpoint_url, region_name=region, config=config
        )

    @classmethod
    def of(cls, s: Any) -> Kms | None:
        """The KMS of a configuration (its ``secrets_kms_*``), None without one."""
        key_id = getattr(s, "secrets_kms_key_id", None)
        if not key_id:
            return None
        return cls(key_id, s.secrets_kms_endpoint_url, s.secrets_kms_region)

    @contextlib.contextmanager
    def _call(self, what: str) -> Iterator[None]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except (BotoCoreError, ClientError) as e:
            raise SecretKeyError(
                f"the KMS key {self.key_id} ({self.where}) could not {what}: {e}; the secrets "
                "key ring is wrapped by it, so nothing that needs it starts"
            ) from None

    def new_key(self) -> str:
        """A fresh data key, as the file keeps it (wrapped)."""
        with self._call("make a data key"):
            got = self.client.generate_data_key(KeyId=self.key_id, KeySpec="AES_256")
        return PREFIX + base64.b64encode(got["CiphertextBlob"]).decode()

    def wrap(self, key: bytes) -> str:
        """A data key the file held in clear, as it is to keep it (``secret wrap-keys``)."""
        with self._call("wrap a data key"):
            got = self.client.encrypt(KeyId=self.key_id, Plaintext=key)
        return PREFIX + base64.b64encode(got["CiphertextBlob"]).decode()

    def unwrap(self, line: str) -> bytes:
        """The data key of a wrapped line (``kms:<base64>``)."""
        try:
            blob = base64.b64decode(line.strip().removeprefix(PREFIX), validate=True)
        except ValueError:
            raise SecretKeyError("a KMS-wrapped secrets key is not valid base64") from None
        with self._call("unwrap the secrets key ring"):
            key = self.client.decrypt(KeyId=self.key_id, CiphertextBlob=blob)["Plaintext"]
        if len(key) != KEY_BYTES:
            raise SecretKeyError(f"the KMS key {self.key_id} unwrapped a key that is not 32 bytes")
        return bytes(key)


def wrapped(line: str) -> bool:
    return line.strip().startswith(PREFIX)
