"""A real `sandhold serve` process for tests, driven by the official, unmodified e2b SDK
(``new_server``, ``Server``; the two teams' API keys ``KEY_A``, ``KEY_B``).

Servers never bind a port themselves here: the test binds and listens (``listen``) and hands
the open socket to the process (``--fd``), so no other process can take the port in between and
a restarted server serves on the same one. While no server runs, connections wait in the
socket's backlog instead of being refused."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest

from sandhold.config import Settings
from sandhold.runtime import cgroup_parent, cgroups, mounts, safefs
from sandhold.runtime.checkpoint.criu import criu_status
from sandhold.runtime.runtime import Runtime
from tests.support.http import answers

KEY_A = "sandhold-test-key-a"
KEY_B = "sandhold-test-key-b"
API_KEYS = {KEY_A: "team-a", KEY_B: "team-b"}


def listen() -> socket.socket:
    """A listening socket on a free loopback port, for a server process to serve on."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def start_process(
    args: list[str], env: dict[str, str], log: Path, sock: socket.socket, under: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    """Start `sandhold <args> --fd N` serving on ``sock`` (run by the ``under`` command line:
    an init, a namespace) and wait until its /health answers."""
    fd = sock.fileno()
    url = "http://{}:{}".format(*sock.getsockname()[:2])
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [*under, sys.executable, "-m", "sandhold.cli", *args, "--fd", str(fd)], env=env,
            stdout=out, stderr=subprocess.STDOUT, pass_fds=(fd,),
        )  # fmt: skip
    # (the cgroup v2 guest emulates its CPU: a server starts there in 20-50 s)
    timeout = float(os.environ.get("SANDHOLD_TEST_START_TIMEOUT_S", 60))
    if answers(f"{url}/health", timeout, lambda: proc.poll() is None):
        return proc
    if proc.poll() is not None:
        raise RuntimeError(f"sandhold {args[0]} exited: {log.read_text()[-3000:]}")
    stop_process(proc)
    raise RuntimeError(f"sandhold {args[0]} did not start: {log.read_text()[-3000:]}")


def stop_process(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Server:
    """One `sandhold serve` subprocess over a data dir; can be stopped and started again."""

    def __init__(self, data_dir: Path, sock: socket.socket, log: Path, **settings: str) -> None:
        self.data_dir = data_dir
        self.sock = sock
        self.address, self.port = sock.getsockname()[:2]
        self.log = log
        self.settings = settings
        self.under: list[str] = []  # what the server runs under (start_process)
        # Under `unshare --fork` (a pod): stop signals unshare's child, the pod's PID 1, as a
        # kubelet does (unshare itself holds SIGTERM blocked while it waits for its child).
        self.pod = False
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
        env.update(
            SANDHOLD_DATA_DIR=str(self.data_dir),
            SANDHOLD_PREBUILD_TEMPLATES="[]",
            SANDHOLD_API_KEYS=json.dumps(API_KEYS),
            NO_PROXY="127.0.0.1,localhost",
        )
        env.update({f"SANDHOLD_{k.upper()}": v for k, v in self.settings.items()})
        self.proc = start_process(["serve"], env, self.log, self.sock, self.under)

    def stop(self) -> None:
        if self.pod and self.proc is not None and self.proc.poll() is None:
            pid = self.proc.pid
            for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
                os.kill(int(child), signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
        stop_process(self.proc)
        self.proc = None

    def runtime(self) -> Runtime:
        return Runtime(Settings(data_dir=self.data_dir))

    def destroy(self) -> None:
        """Stop the server, kill every sandbox it left and remove the data dir, whatever fails
        on the way; then fail if a sandbox could not be killed or was left half-removed."""
        self.stop()
        self.sock.close()
        errors = destroy_runtime_dir(self.data_dir)
        assert not errors, f"cleanup failed: {errors}"

    def sdk(self, key: str = KEY_A) -> dict[str, str]:
        """The official SDK's keyword arguments that point it at this server as ``key``."""
        return {"api_url": self.url, "sandbox_url": self.url, "api_key": key}

    def api(self, key: str = KEY_A) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"X-API-KEY": key}, timeout=30)


def needs_criu() -> None:
    """Skip the caller (a test, a fixture: its module) where CRIU cannot run on this machine."""
    ok, detail = criu_status(Settings().criu_path)
    if not ok:
        pytest.skip(f"CRIU unusable here: {detail}")


def e2b_env(url: str, key: str) -> dict[str, str]:
    """A client process's environment (the CLI, the JS SDK) aimed at ``url`` as ``key``.

    The caller's own ``E2B_*`` settings are dropped so none can point it elsewhere.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=key)
    env["NO_PROXY"] = "127.0.0.1,localhost"
    return env


def new_server(tmp: Path, **settings: str) -> Server:
    data_dir = Path(tempfile.mkdtemp(prefix="sandhold-e2b-", dir="/var/tmp"))
    data_dir.chmod(0o755)  # the sandboxes' unprivileged owner must traverse it
    return Server(data_dir, listen(), tmp / f"server-{data_dir.name}.log", **settings)


def destroy_runtime_dir(data_dir: Path) -> list[str]:
    """Kill every sandbox under a runtime data dir and remove it; returns what went wrong."""
    settings = Settings(data_dir=data_dir)
    errors: list[str] = []
    try:
        rt = Runtime(settings).open()
        for info in rt.list():
            try:
                rt.kill(info.id)
            except Exception as e:
                errors.append(f"kill {info.id}: {e!r}")
    finally:
        for target in mounts.mounts_under(data_dir):
            mounts.umount(Path(target))
            errors.append(f"left mounted: {target}")
        cgroups.remove_parent(cgroup_parent.name(settings))
        cgroup_parent.release(settings)
        safefs.remove_quietly(data_dir)  # (a template's tree may be deep)
    return errors
