"""``code-interpreter-v1`` starts warm, through the official SDK: the server checkpoints a
sandbox whose kernel has started (service/warmer.py, at start), and each create restores it.
A warm sandbox is indistinguishable from a booted one: its own env in the kernel and in
commands, a first execution counted 1, state and files its own."""

from __future__ import annotations

import time

import pytest

from sandhold.config import Settings
from sandhold.runtime.runtime import Runtime
from tests.support.e2b_server import needs_criu
from tests.support.interpreter import InterpreterServer, SandboxFactory


@pytest.fixture(scope="module")
def warm(interp: InterpreterServer) -> Runtime:
    needs_criu()
    rt = Runtime(Settings(data_dir=interp.data_dir))
    template = rt.templates.get("code-interpreter-v1")
    deadline = time.monotonic() + 180
    while rt.warm.available(template) is None:  # the server's warmer makes it at start
        assert time.monotonic() < deadline, "the server made no warm checkpoint"
        time.sleep(0.2)
    return rt


def test_sandboxes_start_warm_and_are_their_own(warm, make_sandbox: SandboxFactory) -> None:
    a = make_sandbox(envs={"WHO": "a"})
    b = make_sandbox(envs={"WHO": "b"})
    assert warm.get(a.sandbox_id).started_from == warm.get(b.sandbox_id).started_from == "warm"
    first = a.run_code("import os; os.environ['WHO']")
    assert first.text == "a" and first.execution_count == 1
    assert b.run_code("import os; os.environ['WHO']").text == "b"
    assert a.commands.run("echo $WHO").stdout.strip() == "a"
    a.run_code("x = 41")
    assert a.run_code("x + 1").text == "42"
    missing = b.run_code("x")
    assert missing.error is not None and missing.error.name == "NameError"
    a.files.write("/home/user/only-a.txt", "a")
    assert not b.files.exists("/home/user/only-a.txt")
    js = b.run_code("process.env.WHO", language="javascript")  # started after: gets it too
    assert js.text == "b", js


def test_run_code_envs_still_apply_per_call(warm, make_sandbox: SandboxFactory) -> None:
    sbx = make_sandbox(envs={"WHO": "sandbox"})
    assert warm.get(sbx.sandbox_id).started_from == "warm"
    code = "import os; os.environ['WHO']"
    assert sbx.run_code(code, envs={"WHO": "call"}).text == "call"
    assert sbx.run_code(code).text == "sandbox"
