"""`sandhold top --once` against a live gateway with real sessions (local provider) and against a
live `sandhold serve`: the frame shows the tenant's usage, sandboxes and failures; a scenario
written as rich markup is printed as written, never interpreted."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

from tests.support.e2b_server import KEY_A, Server
from tests.support.gateway_server import ADMIN_KEY, OTHER_KEY, TENANT_KEY, Gateway

SCENARIO = "[bold red]x[/]"


def top(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
    env.update(COLUMNS="240", NO_COLOR="1", TERM="dumb")  # one line per row
    return subprocess.run([sys.executable, "-m", "sandhold.cli", "top", "--once", *args],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip


def cells(out: str, columns: int, *needles: str) -> list[str]:
    """The cells of the one row with every needle of the tables with that many columns."""
    rows = [[c.strip() for c in line.strip().strip("│").split("│")]
            for line in out.splitlines() if all(n in line for n in needles)]  # fmt: skip
    rows = [r for r in rows if len(r) == columns]
    assert len(rows) == 1, (needles, out)
    return rows[0]


def test_top_once_against_a_gateway(make_gateway: Callable[..., Gateway]) -> None:
    gw = make_gateway("local")
    with gw.client() as c:
        for body, status in (({"command": "true"}, 200), ({"command": "true"}, 200),
                             ({"path": "missing.txt"}, 400)):  # fmt: skip
            tool = "read_file" if "path" in body else "run_command"
            r = c.post(f"/v1/sessions/top-1/tools/{tool}", json=body,
                       headers={"X-Sandhold-Scenario": SCENARIO})  # fmt: skip
            assert r.status_code == status, r.text
    with gw.client(OTHER_KEY) as c:
        r = c.post("/v1/sessions/other-1/tools/run_command", json={"command": "true"})
        assert r.status_code == 200, r.text

    run = top("--gateway", gw.url, "--key", ADMIN_KEY)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    # Usage: tenant, scenario (literally), sessions, tool calls, p50, p95, failures, sandbox-h.
    usage = cells(out, 8, "acme", SCENARIO)
    assert usage[0] == "acme" and usage[1] == SCENARIO, usage
    assert usage[2:4] == ["1", "3"] and usage[6] == "1", usage
    assert cells(out, 8, "globex", "│ -")[2:4] == ["1", "1"]
    # The live sandboxes: each session's, running.
    assert cells(out, 8, "acme", "top-1", "running")
    assert "Live sandboxes (2)" in out
    # The failure (the missing file) with its scenario, printed as written.
    failure = cells(out, 7, "top-1", "tool_call")
    assert SCENARIO in failure and "read_file" in failure, failure

    # A tenant's key: its own only.
    mine = top("--gateway", gw.url, "--key", TENANT_KEY)
    assert mine.returncode == 0, mine.stderr
    assert "acme" in mine.stdout and "globex" not in mine.stdout and "other-1" not in mine.stdout

    bad = top("--gateway", gw.url, "--key", "not-a-key-of-anyone")
    assert bad.returncode != 0 and "unauthorized" in bad.stderr, bad.stderr


def test_top_once_against_a_server(e2b_server: Server) -> None:
    run = top("--server", e2b_server.url, "--key", KEY_A)
    assert run.returncode == 0, run.stderr
    assert "Live sandboxes (" in run.stdout and "team" in run.stdout
    assert top("--key", KEY_A).returncode != 0  # neither --gateway nor --server
