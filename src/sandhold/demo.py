"""`make run`: start the E2B-compatible server on the embedded defaults, drive it once with the
official, unmodified `e2b` and `e2b-code-interpreter` SDKs, print what happened, keep serving."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
from rich.console import Console

from sandhold.config import get_settings

console = Console()


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with status {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code < 500:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit("the server did not become healthy")


def _step(what: str, t0: float) -> None:
    console.print(
        f"  [green]✓[/green] {what} [dim]({(time.perf_counter() - t0) * 1000:.0f} ms)[/dim]"
    )


def tour(url: str) -> None:
    from e2b import Sandbox
    from e2b_code_interpreter import Sandbox as CodeSandbox

    opts: dict[str, Any] = {
        "api_url": url,
        "sandbox_url": url,
        "api_key": os.environ.get("E2B_API_KEY", "demo"),
    }
    console.print("[bold]e2b SDK[/bold] → Sandhold")
    t = time.perf_counter()
    sbx = Sandbox.create(timeout=120, metadata={"session_id": "demo"}, **opts)
    _step(f"Sandbox.create() → {sbx.sandbox_id}", t)
    try:
        t = time.perf_counter()
        r = sbx.commands.run("echo hello from $(whoami) on $(hostname); python3 --version")
        _step(f"commands.run → {r.stdout.strip()!r}", t)
        t = time.perf_counter()
        sbx.files.write("/home/user/notes.txt", "kept across pause and resume\n")
        _step("files.write /home/user/notes.txt", t)
        t = time.perf_counter()
        sbx.pause()
        _step("pause (every process frozen, memory kept)", t)
        t = time.perf_counter()
        sbx.connect(timeout=120)
        _step(
            f"connect → resumed; notes.txt: {sbx.files.read('/home/user/notes.txt').strip()!r}", t
        )
        t = time.perf_counter()
        r = sbx.commands.run(
            "curl -sS --max-time 2 http://1.1.1.1 || echo 'no network: as intended'"
        )
        _step(f"network check → {r.stdout.strip().splitlines()[-1]!r}", t)
    finally:
        sbx.kill()
        console.print("  [green]✓[/green] killed")

    console.print(
        "[bold]e2b-code-interpreter SDK[/bold] → Sandhold (first run builds the "
        "template: about a minute)"
    )
    t = time.perf_counter()
    ci = CodeSandbox.create(timeout=300, **opts)
    _step(f"code-interpreter sandbox {ci.sandbox_id}", t)
    try:
        t = time.perf_counter()
        ci.run_code("import pandas as pd\ndf = pd.DataFrame({'x': [1, 2, 3], 'y': [2, 4, 9]})")
        ex = ci.run_code("df['y'].sum()")
        _step(f"run_code: state kept across calls, df['y'].sum() = {ex.text}", t)
        t = time.perf_counter()
        ex = ci.run_code(
            "import matplotlib.pyplot as plt\nplt.plot(df.x, df.y)\nplt.title('demo')\nplt.show()"
        )
        res = ex.results[0]
        chart = res.chart.type.value if res.chart else None
        _step(f"chart: png of {len(res.png or '')} base64 chars, structured type {chart!r}", t)
    finally:
        ci.kill()
        console.print("  [green]✓[/green] killed")


SETPRIV = "/usr/bin/setpriv"  # util-linux: execs the server with a parent-death signal


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(serve: bool = True) -> None:
    settings = get_settings()
    url = f"http://{settings.server_host}:{settings.server_port}"
    console.print(f"starting [bold]sandhold serve[/bold] on {url} (data in {settings.data_dir})")
    # The server stops with the demo, whatever stops it: SIGTERM and SIGHUP end the demo as
    # Ctrl-C does (through the ``finally`` below), and a demo killed outright takes the server
    # with it (its parent-death signal). Sandboxes stay, as with any server stop.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupted)
    proc = subprocess.Popen(
        [SETPRIV, "--pdeathsig", "TERM", "--", sys.executable, "-m", "sandhold.cli", "serve"]
    )
    try:
        _wait_healthy(url, proc)
        tour(url)
        if not serve:
            return
        console.print(
            f"\n[bold]Sandhold is serving on {url}[/bold]. Point the official SDK at it:\n"
            f"  export E2B_API_URL={url} E2B_SANDBOX_URL={url} E2B_API_KEY=anything\n"
            "Ctrl-C stops the server; running and paused sandboxes stay and are picked up again."
        )
        proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
