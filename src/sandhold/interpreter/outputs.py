"""The NDJSON lines of ``POST /execute``, exactly as the e2b-code-interpreter SDK parses them."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

Event = dict[str, Any]

# Jupyter MIME type -> key of the SDK's Result; anything else lands in `extra`.
MIME_KEYS: dict[str, str] = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}

END_OF_EXECUTION: Event = {"type": "end_of_execution"}
KEEPALIVE: Event = {"type": "keepalive"}


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def stream(name: str, text: str, timestamp: str | None = None) -> Event:
    return {"type": name, "text": text, "timestamp": timestamp or now_iso()}


def error(name: str, value: str, traceback: str = "") -> Event:
    return {"type": "error", "name": name, "value": value, "traceback": traceback}


def number_of_executions(count: int) -> Event:
    return {"type": "number_of_executions", "execution_count": count}


def strip_quotes(text: str) -> str:
    # The reference server shows a str result as its content, not as its repr.
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1]
    return text


def result(bundle: dict[str, Any], *, is_main: bool) -> Event:
    """A ``result`` line from a MIME bundle (Jupyter's ``data`` dict)."""
    out: Event = {"type": "result"}
    extra: dict[str, Any] = {}
    for mime, value in bundle.items():
        key = MIME_KEYS.get(mime)
        if key is None:
            extra[mime] = value
        elif value is not None:
            out[key] = strip_quotes(value) if key == "text" and isinstance(value, str) else value
    if extra:
        out["extra"] = extra
    out["is_main_result"] = is_main
    return out


def json_safe(value: Any) -> Any:
    """NaN and infinities become null (strict JSON), containers are copied."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def line(event: Event) -> bytes:
    return json.dumps(json_safe(event), ensure_ascii=False).encode() + b"\n"
