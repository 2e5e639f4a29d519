"""What a tool call ran and printed, as the timeline keeps it for the console (``events.texts``):
its input (the command, the code, or the path a file tool named) and its stdout and stderr
(an interpreter's error with its traceback goes with stderr), each cut to
``gateway_timeline_text_bytes`` of UTF-8. A cut field's full size is in ``cut``. File contents
are never kept: a file tool's input is its path. 0 keeps nothing (the column stays NULL).

These are model-made texts: the console shows them as text only, never as markup.
"""

from __future__ import annotations

from typing import Any

from sandhold.gateway.tool_args import Args, RunCode, RunCommand


def texts(args: Args, result: dict[str, Any], most: int) -> dict[str, Any] | None:
    if most <= 0:
        return None
    kept: dict[str, str] = {}
    if isinstance(args, RunCommand):
        kept["input"] = args.command
    elif isinstance(args, RunCode):
        kept["input"] = args.code
    elif isinstance(path := getattr(args, "path", None), str):
        kept["input"] = path
    for stream in ("stdout", "stderr"):
        if isinstance(value := result.get(stream), str) and value:
            kept[stream] = value
    error = result.get("error")
    if isinstance(error, dict):  # the interpreter's {name, value, traceback}
        told = error.get("traceback") or f"{error.get('name', '')}: {error.get('value', '')}"
        kept["stderr"] = kept.get("stderr", "") + str(told)
    elif isinstance(error, str) and error:
        kept["stderr"] = kept.get("stderr", "") + error
    out: dict[str, Any] = {}
    cut: dict[str, int] = {}
    for name, value in kept.items():
        data = value.encode(errors="replace")
        if len(data) > most:
            cut[name] = len(data)
            value = data[:most].decode(errors="ignore")  # never half a character
        out[name] = value
    if cut:
        out["cut"] = cut
    return out or None
