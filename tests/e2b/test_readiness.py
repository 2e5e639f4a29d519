"""Readiness (``GET /ready``, service/readiness.py) against a real `sandhold serve`: what a
Kubernetes readiness probe or a fleet's edge reads. Each check that fails says so (503), and
readiness comes back once the cause is gone; ``/health`` (liveness) answers throughout."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

from tests.support.e2b_server import new_server

CHECKS = {"data_dir", "cgroups", "criu", "base_template"}


def ready(url: str) -> httpx.Response:
    return httpx.get(f"{url}/ready", timeout=30)


def until(url: str, status: int, timeout: float = 300) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while (r := ready(url)).status_code != status:
        assert time.monotonic() < deadline, f"/ready stayed {r.status_code}: {r.text}"
        time.sleep(0.25)
    body: dict[str, object] = r.json()
    return body


def test_a_fresh_server_builds_base_and_becomes_ready(tmp_path: Path) -> None:
    srv = new_server(tmp_path, suspend_after_s="-1")
    srv.start()
    try:
        first = ready(srv.url)
        assert set(first.json()["checks"]) == CHECKS
        if first.status_code == 503:  # base is built in the background, started by the probe
            assert first.json()["checks"]["base_template"] is False, first.text
        body = until(srv.url, 200)
        assert body == {"status": "ready", "checks": dict.fromkeys(CHECKS, True)}
        assert srv.runtime().templates.built("base")
    finally:
        srv.destroy()


def test_a_read_only_data_dir_is_not_ready_until_it_is_writable(tmp_path: Path) -> None:
    srv = new_server(tmp_path, suspend_after_s="-1")
    srv.start()
    d = str(srv.data_dir)
    try:
        until(srv.url, 200)
        subprocess.run(["mount", "--bind", d, d], check=True)
        try:
            subprocess.run(["mount", "-o", "remount,bind,ro", d], check=True)
            body = until(srv.url, 503)
            assert body["checks"] == {**dict.fromkeys(CHECKS, True), "data_dir": False}
            assert httpx.get(f"{srv.url}/health", timeout=30).status_code == 200  # alive
        finally:
            subprocess.run(["umount", d], check=True)
        until(srv.url, 200)
    finally:
        srv.destroy()


def test_a_server_that_suspends_needs_criu_to_be_ready(tmp_path: Path) -> None:
    srv = new_server(tmp_path, suspend_after_s="600", criu_path=str(tmp_path / "no-criu"))
    srv.start()
    try:
        body = until(srv.url, 503)
        assert body["checks"]["criu"] is False and body["status"] == "not ready"
        assert "/no-criu" not in str(body)  # the reasons go to the log, not to the caller
        assert "not ready: criu: suspend_after_s is set" in srv.log.read_text()
    finally:
        srv.destroy()
