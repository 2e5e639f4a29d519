"""The agent's three ways to start a command, held to one behaviour: the one-step extension
(native.c, the default), the static helper after a posix_spawn (spawn_helper.c, where the
extension did not build) and a fork of the agent (where neither did). Each is built here as
the agent library builds it and run in this process as root, switching to ``nobody``."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandhold.agent import aio, spawn
from sandhold.agent.rpc import RpcError
from sandhold.agent.users import lookup_user
from sandhold.runtime import agentlib

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switches users: needs root")
WAYS = ("extension", "helper", "fork")
GLIBC_SIGNALS = 0b11 << 31  # 32 and 33, glibc's own: nobody can set them (in a mask: bit n-1)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("agent-spawn")
    agentlib._build_helper(d / "sandhold-spawn")
    agentlib._build_extension(d)
    assert (d / "sandhold-spawn").exists() and list(d.glob("_native*.so")), "both must build"
    return d


@pytest.fixture(params=WAYS)
def way(request: pytest.FixtureRequest, built: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    ext = None
    if request.param == "extension":
        path = str(next(built.glob("_native*.so")))
        loader = importlib.machinery.ExtensionFileLoader("_native", path)
        spec = importlib.util.spec_from_file_location("_native", path, loader=loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        ext = module.spawn
    monkeypatch.setattr(spawn, "_ext_spawn", ext)
    helper = built / "sandhold-spawn" if request.param == "helper" else built / "absent"
    monkeypatch.setattr(spawn, "HELPER", str(helper))
    return str(request.param)


def run(argv: list[str], *, cwd: str = "/tmp", env: dict[str, str] | None = None,
        user: str = "nobody", keep: frozenset[int] = frozenset()) -> tuple[int, str]:  # fmt: skip
    """The command's exit code and its stdout and stderr, interleaved."""
    who = lookup_user(user)
    assert who is not None
    spec = spawn.SpawnSpec(argv, env if env is not None else {"PATH": "/usr/bin:/bin"}, cwd,
                           who, None, False)  # fmt: skip
    spec.root_caps = keep

    async def go() -> tuple[int, str]:
        started = await spawn.start_child(spec, 1024, lambda pid: None)
        out = bytearray()
        for fd, _ in started.outputs:
            out += b"".join(iter(lambda fd=fd: os.read(fd, 65536), b""))
            os.close(fd)
        _, status = os.waitpid(started.pid, 0)
        return os.waitstatus_to_exitcode(status), out.decode()

    return aio.run(go())


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory ``nobody`` can reach (pytest's own are root's only)."""
    d = Path(tempfile.mkdtemp(prefix="agent-spawn-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


def test_the_command_runs_as_the_user_with_nothing_of_the_agent(way: str) -> None:
    nobody = lookup_user("nobody")
    assert nobody is not None
    script = (
        'echo "ids $(id -u) $(id -g) $(id -G)"; echo "cwd $(pwd)"; '
        "echo \"fds $(ls /proc/self/fd | sort -n | tr '\\n' ' ')\"; "
        'echo "oom $(cat /proc/self/oom_score_adj)"; echo "session $(ps -o sid= -p $$) $$"; '
        "grep -E '^(SigBlk|SigIgn|Cap...)' /proc/self/status | tr -d '\\t'; env | sort"
    )
    code, out = run(["sh", "-c", script], env={"PATH": "/usr/bin:/bin", "ONLY": "this"})
    assert code == 0, out
    got = dict(line.replace(":", " ", 1).split(" ", 1) for line in out.splitlines()
               if not line.startswith(("PATH=", "ONLY=", "PWD=")))  # fmt: skip
    assert got["ids"] == f"{nobody.uid} {nobody.gid} {nobody.gid}", out
    assert got["cwd"] == "/tmp"
    assert got["fds"].split() == ["0", "1", "2", "3"], out  # (3: ls's own directory)
    assert got["oom"] == "500"
    sid, pid = got["session"].split()
    assert sid == pid, "a new session, the command its leader"
    for key in ("SigBlk", "SigIgn", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(got[key], 16) & ~GLIBC_SIGNALS == 0, (key, out)
    env = [line for line in out.splitlines() if "=" in line and not line.startswith("PWD=")]
    assert env == ["ONLY=this", "PATH=/usr/bin:/bin"], "its own environment, nothing more"


def test_signals_the_agent_inherited_ignored_are_default_for_the_command(way: str) -> None:
    """A server started in the background by a shell ignores SIGINT and SIGQUIT, and its
    sandboxes' agents inherit that: the command must not (an ignored signal stays ignored
    across exec)."""
    ignored = (signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGRTMIN + 3)
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in ignored}
    try:
        code, out = run(["grep", "^SigIgn", "/proc/self/status"])
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert code == 0, out
    assert int(out.split()[1], 16) & ~GLIBC_SIGNALS == 0, out


def test_root_keeps_only_the_capabilities_asked_for(way: str) -> None:
    code, out = run(["grep", "-E", "^Cap(Prm|Eff|Bnd)", "/proc/self/status"], user="root",
                    keep=frozenset({0, 21}))  # fmt: skip
    assert code == 0, out
    assert {line.split()[1] for line in out.splitlines()} == {f"{(1 << 0) | (1 << 21):016x}"}


def test_the_search_is_the_commands_path_and_a_file_without_a_shebang_is_no_executable(
    way: str, scratch: Path
) -> None:
    (scratch / "bin").mkdir()
    for name, text in (("tool", '#!/bin/sh\necho "script $1"\n'), ("bare", 'echo "sh ran it"\n')):
        (scratch / "bin" / name).write_text(text)
        (scratch / "bin" / name).chmod(0o755)
    path = {"PATH": f"/nonexistent:{scratch / 'bin'}"}
    assert run(["tool", "arg"], env=path) == (0, "script arg\n")
    with pytest.raises(RpcError) as e:  # as envd (Go) says it; glibc's execvp would run sh
        run(["bare"], env=path)
    assert e.value.message == "error starting process 'bare': fork/exec bare: exec format error"


@pytest.mark.parametrize(
    ("argv", "cwd", "message"),
    [
        (["no-such-command"], "/tmp", "fork/exec no-such-command: no such file or directory"),
        (["/bin/true"], "/no/such/dir", "chdir /no/such/dir: no such file or directory"),
    ],
)
def test_a_command_that_cannot_start_is_an_error_with_envds_words(
    way: str, argv: list[str], cwd: str, message: str
) -> None:
    with pytest.raises(RpcError) as e:
        run(argv, cwd=cwd)
    assert e.value.code == "invalid_argument"
    assert e.value.message == f"error starting process '{' '.join(argv)}': {message}"


def test_a_file_the_user_may_not_execute_is_permission_denied(way: str, scratch: Path) -> None:
    private = scratch / "private"
    private.write_text("#!/bin/sh\necho no\n")
    private.chmod(stat.S_IRWXU)  # root's only
    with pytest.raises(RpcError) as e:
        run([str(private)])
    assert e.value.message.endswith(f"fork/exec {private}: permission denied")


def test_a_bad_environment_name_is_refused_before_anything_starts(way: str) -> None:
    if way == "fork":
        pytest.skip("the forked child reports it as a failed exec")
    with pytest.raises(ValueError):
        run(["true"], env={"A=B": "c", "PATH": "/bin"})
