"""Contexts (create, list, restart, remove, cwd, languages), timeouts and interrupts, concurrency,
kernel crashes, kill and reconnect."""

from __future__ import annotations

import asyncio
import time

import pytest
from e2b import NotFoundException, SandboxException, TimeoutException
from e2b_code_interpreter import AsyncSandbox, Sandbox

from tests.support.interpreter import API_KEY, InterpreterServer


def test_default_contexts_exist(sbx: Sandbox) -> None:
    languages = {c.language for c in sbx.list_code_contexts()}
    assert {"python", "javascript"} <= languages


def test_create_list_restart_remove(sbx: Sandbox) -> None:
    ctx = sbx.create_code_context(cwd="/tmp")
    assert (ctx.language, ctx.cwd) == ("python", "/tmp")
    assert ctx.id in {c.id for c in sbx.list_code_contexts()}

    assert sbx.run_code("import os; os.getcwd()", context=ctx).text == "/tmp"
    sbx.run_code("only_here = 1", context=ctx)
    assert sbx.run_code("only_here", context=ctx).text == "1"
    # Contexts do not share state.
    assert sbx.run_code("'only_here' in globals()").text == "False"

    sbx.restart_code_context(ctx)
    restarted = sbx.run_code("only_here", context=ctx)
    assert restarted.error is not None and restarted.error.name == "NameError"

    sbx.remove_code_context(ctx)
    assert ctx.id not in {c.id for c in sbx.list_code_contexts()}
    with pytest.raises(NotFoundException):
        sbx.run_code("1", context=ctx)
    with pytest.raises(NotFoundException):
        sbx.remove_code_context(ctx.id)


def test_contexts_per_language(sbx: Sandbox) -> None:
    js = sbx.create_code_context(language="javascript", cwd="/opt")
    assert js.language == "javascript"
    assert sbx.run_code("process.cwd()", context=js).text == "/opt"
    sh = sbx.create_code_context(language="bash", cwd="/var")
    assert sbx.run_code("pwd", context=sh).logs.stdout == ["/var\n"]
    for ctx in (js, sh):
        sbx.remove_code_context(ctx)


def test_bad_context_requests_are_refused(sbx: Sandbox) -> None:
    with pytest.raises(SandboxException, match="400"):
        sbx.create_code_context(language="cobol")
    with pytest.raises(SandboxException, match="not an existing directory"):
        sbx.create_code_context(cwd="/no/such/dir")


@pytest.mark.parametrize(
    ("language", "setup", "hang", "check", "expected"),
    [
        ("python", "kept = 'yes'", "import time\nwhile True: time.sleep(0.1)", "kept", "yes"),
        ("javascript", "var kept = 'yes'", "while (true) {}", "kept", "yes"),
        ("javascript", "var kept2 = 'yes'", "await new Promise(() => {})", "kept2", "yes"),
        ("bash", "KEPT=yes", "sleep 600", "echo $KEPT", None),
    ],
)
def test_timeout_interrupts_and_context_stays_usable(
    sbx: Sandbox, language: str, setup: str, hang: str, check: str, expected: str | None
) -> None:
    ctx = sbx.create_code_context(language=language)
    try:
        assert sbx.run_code(setup, context=ctx).error is None
        started = time.monotonic()
        with pytest.raises(TimeoutException):
            sbx.run_code(hang, context=ctx, timeout=2)
        assert time.monotonic() - started < 10
        # The next execution is not stuck behind the interrupted one (it would time out), and
        # state survived.
        after = sbx.run_code(check, context=ctx, timeout=30)
        assert after.error is None
        if expected is None:
            assert after.logs.stdout == ["yes\n"]
        else:
            assert after.text == expected
    finally:
        sbx.remove_code_context(ctx)


def test_kernel_crash_is_reported_and_recovered(sbx: Sandbox) -> None:
    ctx = sbx.create_code_context()
    try:
        crashed = sbx.run_code("import os\nos._exit(3)", context=ctx, timeout=60)
        assert crashed.error is not None
        assert crashed.error.name == "UnexpectedEndOfExecution"
        assert sbx.run_code("21 * 2", context=ctx, timeout=60).text == "42"
    finally:
        sbx.remove_code_context(ctx)


async def test_concurrent_executions_in_different_contexts(
    sbx: Sandbox, interp: InterpreterServer
) -> None:
    asbx = await AsyncSandbox.connect(
        sbx.sandbox_id, api_key=API_KEY, api_url=interp.url, sandbox_url=interp.sandbox_url
    )
    contexts = [
        await asbx.create_code_context(),
        await asbx.create_code_context(),
        await asbx.create_code_context(language="javascript"),
    ]
    # Each says when it started and ended, by the sandbox's clock: together, they overlap.
    code = {
        "python": "import time\ns = time.time()\ntime.sleep(2)\nf'{s} {time.time()}'",
        "javascript": "const s = Date.now() / 1000\n"
        "await new Promise((r) => setTimeout(r, 2000))\n`${s} ${Date.now() / 1000}`",
    }
    results = await asyncio.gather(
        *(asbx.run_code(code[c.language], context=c, timeout=60) for c in contexts)
    )
    spans = [tuple(map(float, r.text.strip("'\"").split())) for r in results]
    assert len(spans) == 3 and all(end - start >= 1.9 for start, end in spans), spans
    assert max(s for s, _ in spans) < min(e for _, e in spans), f"one after another: {spans}"
    for c in contexts:
        await asbx.remove_code_context(c)


async def test_executions_in_one_context_queue_in_order(
    sbx: Sandbox, interp: InterpreterServer
) -> None:
    asbx = await AsyncSandbox.connect(
        sbx.sandbox_id, api_key=API_KEY, api_url=interp.url, sandbox_url=interp.sandbox_url
    )
    ctx = await asbx.create_code_context()
    await asbx.run_code("log = []", context=ctx)
    await asyncio.gather(
        *(asbx.run_code(f"import time; time.sleep(0.2); log.append({i})", context=ctx)
          for i in range(4))
    )  # fmt: skip
    logged = await asbx.run_code("sorted(log) == list(range(4)) and len(log)", context=ctx)
    assert logged.text == "4"
    await asbx.remove_code_context(ctx)


def test_reconnect_keeps_state_and_kill_ends_it(make_sandbox, interp: InterpreterServer) -> None:  # type: ignore[no-untyped-def]
    first = make_sandbox()
    first.run_code("session_value = 'persisted'")
    again = Sandbox.connect(
        first.sandbox_id, api_key=API_KEY, api_url=interp.url, sandbox_url=interp.sandbox_url
    )
    assert again.run_code("session_value").text == "persisted"
    again.kill()
    with pytest.raises(SandboxException):
        first.run_code("1", timeout=20)
