"""The compatibility matrix (docs/e2b.md, "Compatibility across SDK releases"): the project's own
SDK tours (py_tour.py, js_tour.mjs) run against one live `sandhold serve` under several released
SDKs, the pinned ones and older; the table in docs/e2b.md must be what this run produced.

``SANDHOLD_WRITE_MATRIX=1`` writes the table into docs/e2b.md instead of comparing
(``scripts/compat-matrix.sh``). Each SDK is installed once per machine under ``CACHE``: a venv
per Python release, an npm directory per JavaScript one, from the machine's own indexes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.e2b_server import KEY_A, Server, e2b_env, new_server

HERE = Path(__file__).parent
DOC = HERE.parents[1] / "docs" / "e2b.md"
CACHE = Path(os.environ.get("SANDHOLD_TEST_CACHE", "/var/tmp/sandhold-cache")) / "compat"
PYTHON = ["2.63.0", "2.59.0", "2.55.1", "2.50.0", "2.46.4"]  # the pinned one first
JAVASCRIPT = ["2.51.0", "2.50.0", "2.49.1", "2.46.1"]
PINNED = {"python 2.63.0", "js 2.51.0"}
START, END = "<!-- matrix:start -->", "<!-- matrix:end -->"
TOUR_TIMEOUT_S = 600


def python_sdk(version: str) -> list[str]:
    """The interpreter of a venv holding ``e2b==version`` (made once)."""
    venv = CACHE / f"py-{version}"
    python = venv / "bin" / "python"
    if not (venv / ".installed").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, f"e2b=={version}"], check=True, timeout=600)
        (venv / ".installed").touch()
    return [str(python), str(HERE / "py_tour.py")]


def js_sdk(version: str) -> list[str]:
    """node running the tour from a directory holding ``e2b@version`` (made once)."""
    d = CACHE / f"js-{version}"
    if not (d / ".installed").exists():
        d.mkdir(parents=True, exist_ok=True)
        (d / "package.json").write_text('{"private": true, "type": "module"}\n')
        npm = ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", f"e2b@{version}"]
        subprocess.run(npm, cwd=d, check=True, timeout=600)
        (d / ".installed").touch()
    (d / "tour.mjs").write_text((HERE / "js_tour.mjs").read_text())  # (resolves e2b from there)
    return ["node", str(d / "tour.mjs")]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = new_server(tmp_path_factory.mktemp("matrix"))
    srv.start()
    yield srv
    srv.destroy()


def tour(server: Server, name: str, argv: list[str]) -> tuple[str, dict[str, str]]:
    env = e2b_env(server.url, KEY_A)
    env["MATRIX_TEMPLATE"] = "matrix-" + name.replace(" ", "-").replace(".", "-")
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=TOUR_TIMEOUT_S)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and lines, f"{name}: {r.stdout[-3000:]}{r.stderr[-3000:]}"
    return name, json.loads(lines[-1])


def table(runs: dict[str, dict[str, str]]) -> str:
    names = list(runs)
    features = list(next(iter(runs.values())))
    mark = {"ok": "✓", "n/a": "—"}
    rows = ["| feature | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for f in features:
        cells = [mark.get(runs[n].get(f, "n/a"), "✗") for n in names]
        rows.append(f"| {f} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def test_the_matrix_in_the_docs_is_this_runs(server: Server) -> None:
    jobs = [(f"python {v}", python_sdk(v)) for v in PYTHON]
    jobs += [(f"js {v}", js_sdk(v)) for v in JAVASCRIPT]
    with ThreadPoolExecutor(3) as pool:  # (tours share the server, each with its own sandboxes)
        runs = dict(pool.map(lambda job: tour(server, *job), jobs))
    failed = {n: {f: r for f, r in got.items() if r != "ok"} for n, got in runs.items()}
    for pinned in PINNED:  # the contract: every feature, on the pinned SDKs
        assert not failed[pinned], f"{pinned}: {failed[pinned]}"
    made = table(runs)
    doc = DOC.read_text()
    before, _, rest = doc.partition(START)
    current, _, after = rest.partition(END)
    if os.environ.get("SANDHOLD_WRITE_MATRIX") == "1":
        DOC.write_text(f"{before}{START}\n{made}\n{END}{after}")
        return
    detail = json.dumps({n: f for n, f in failed.items() if f}, indent=1)
    assert current.strip() == made, (
        f"docs/e2b.md's matrix is not this run's (scripts/compat-matrix.sh writes it):\n"
        f"{made}\nfailures: {detail}"
    )
