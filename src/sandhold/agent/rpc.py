"""What RPC methods work with, whatever the wire: messages (proto3 JSON as dicts), reading
their fields, and ``RpcError``, the failure a method raises with its Connect code.

Kept apart from ``connect`` (the protocol over HTTP) so the services and helpers that only
read messages and raise errors do not depend on the transport.
"""

from __future__ import annotations

import base64
from typing import Any

Message = dict[str, Any]


class RpcError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def to_json(self) -> Message:
        return {"code": self.code, "message": self.message}


def get(msg: Message | None, name: str, default: Any = None) -> Any:
    """A field by its proto name (``include_entry``) or JSON name (``includeEntry``)."""
    if not msg:
        return default
    if name in msg:
        return msg[name]
    head, *rest = name.split("_")
    camel = head + "".join(p.title() for p in rest)
    return msg.get(camel, default)


def get_str(msg: Message | None, name: str) -> str:
    value = get(msg, name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RpcError("invalid_argument", f"field {name} must be a string")
    return value


def get_int(msg: Message | None, name: str) -> int:
    value = get(msg, name)
    if value is None:
        return 0
    try:
        return int(value)  # int64 arrives as a string, int32 as a number
    except (TypeError, ValueError):
        raise RpcError("invalid_argument", f"field {name} must be an integer") from None


def get_bool(msg: Message | None, name: str) -> bool:
    return bool(get(msg, name, False))


def get_enum(msg: Message | None, name: str, values: dict[str, int]) -> int:
    """Enums come as names or numbers."""
    value = get(msg, name)
    if value is None:
        return 0
    if isinstance(value, str):
        if value in values:
            return values[value]
        try:
            return int(value)
        except ValueError:
            raise RpcError("invalid_argument", f"unknown {name} value {value!r}") from None
    if isinstance(value, int):
        return value
    raise RpcError("invalid_argument", f"field {name} must be an enum")


def get_bytes(msg: Message | None, name: str) -> bytes:
    value = get(msg, name)
    if not value:
        return b""
    try:
        # proto3 JSON accepts standard and URL-safe base64, padded or not.
        s = value.replace("-", "+").replace("_", "/")
        return base64.b64decode(s + "=" * (-len(s) % 4))
    except (ValueError, AttributeError):
        raise RpcError("invalid_argument", f"field {name} must be base64") from None


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
