"""``mcp-gateway --config '<json>'``: what E2B's SDK runs (as root) after a create with ``mcp``.

It checks the config and finds every server's command, writes ``GATEWAY_ACCESS_TOKEN`` (a new
one when unset) to ``/etc/mcp-gateway/.token`` (0600), then forks: the child (a session of its
own, output to ``/var/log/mcp-gateway/gateway.log``) starts the servers and serves; the parent
waits for its report and exits 0 once it serves, else prints one line per server it cannot run
(``mcp-gateway: MCP server 'x' is not available in this template ...``) and exits 1, the child
having stopped everything it started. The SDK's ``commands.run`` waits for the parent only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import traceback
import uuid
from pathlib import Path

from .config import PORT, TOKEN_PATH, ServerSpec, check, resolve

TOKEN_ENV = "GATEWAY_ACCESS_TOKEN"
LOG = Path("/var/log/mcp-gateway/gateway.log")


def _fail(lines: list[str], code: int = 1) -> int:
    for line in lines:
        print(f"mcp-gateway: {line}", file=sys.stderr)
    return code


def write_token(token: str, path: Path = TOKEN_PATH) -> None:
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    part = path.with_name(path.name + ".new")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    part.rename(path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mcp-gateway", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="the MCP servers, as JSON")
    parser.add_argument("--host", default="0.0.0.0", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=PORT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        raw = json.loads(args.config)
    except ValueError as e:
        return _fail([f"--config is not JSON: {e}"], 2)
    try:
        config = check(raw)
    except ValueError as e:
        return _fail([str(e)], 2)
    specs, errors = resolve(config)
    if errors:
        return _fail(errors)
    token = os.environ.get(TOKEN_ENV) or str(uuid.uuid4())
    try:
        write_token(token)
        LOG.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return _fail([f"cannot write {TOKEN_PATH}: {e.strerror or e} (run it as root)"])
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        code = 1
        try:
            code = _daemon(write_end, specs, token, args.host, args.port)
        finally:
            os._exit(code)  # never back into the parent's code
    os.close(write_end)
    with os.fdopen(read_end, "rb") as r:
        raw = r.read()
    try:
        answer = json.loads(raw)
    except ValueError:
        os.waitpid(pid, 0)
        return _fail([f"the gateway died while starting (see {LOG})"])
    if answer["errors"]:
        os.waitpid(pid, 0)
        return _fail(answer["errors"])
    n = len(specs)
    print(
        f"MCP gateway serving {answer['tools']} tools of {n} server{'s' * (n != 1)} on "
        f"port {args.port} at /mcp"
    )
    return 0


def _daemon(report_fd: int, specs: list[ServerSpec], token: str, host: str, port: int) -> int:
    from .gateway import serve

    os.setsid()
    log = os.open(LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(devnull)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    reported = False

    def report(errors: list[str], tools: int) -> None:
        nonlocal reported
        if not reported:
            reported = True
            os.write(report_fd, json.dumps({"errors": errors, "tools": tools}).encode())
            os.close(report_fd)
        for line in errors:
            print(f"mcp-gateway: {line}", file=sys.stderr)

    try:
        asyncio.run(serve(specs, token, host, port, report))
    except BaseException as e:  # the parent must hear of any end before serving
        traceback.print_exc()
        report([f"the gateway failed: {type(e).__name__}: {e}"], 0)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
