"""run_code basics through the SDK: state, streaming callbacks, errors, env vars, languages."""

from __future__ import annotations

import time

from e2b_code_interpreter import OutputMessage, Sandbox


def test_state_is_kept_across_calls(sbx: Sandbox) -> None:
    first = sbx.run_code("counter = 40\ncounter += 1")
    assert first.error is None
    second = sbx.run_code("counter + 1")
    assert second.text == "42"
    assert second.execution_count is not None
    assert second.execution_count > (first.execution_count or 0)


def test_stdout_and_stderr_stream_to_callbacks(sbx: Sandbox) -> None:
    seen: list[tuple[str, str, float]] = []
    code = (
        "import sys, time\n"
        "print('first', flush=True)\n"
        "time.sleep(1.2)\n"
        "print('oops', file=sys.stderr, flush=True)\n"
        "print('last')\n"
    )

    def out(m: OutputMessage) -> None:
        seen.append(("out", m.line, time.monotonic()))

    def err(m: OutputMessage) -> None:
        seen.append(("err", m.line, time.monotonic()))

    start = time.monotonic()
    execution = sbx.run_code(code, on_stdout=out, on_stderr=err)
    end = time.monotonic()
    assert "".join(execution.logs.stdout) == "first\nlast\n"
    assert "".join(execution.logs.stderr) == "oops\n"
    assert [(k, t) for k, t, _ in seen] == [
        ("out", "first\n"),
        ("err", "oops\n"),
        ("out", "last\n"),
    ]
    # Streamed: the first line arrived long before the cell finished.
    assert seen[0][2] - start < end - start - 1.0
    assert all(m for m in execution.logs.stdout)


def test_main_result_and_display_calls(sbx: Sandbox) -> None:
    execution = sbx.run_code("from IPython.display import display\ndisplay('shown')\n'returned'")
    main = [r for r in execution.results if r.is_main_result]
    shown = [r for r in execution.results if not r.is_main_result]
    assert [r.text for r in main] == ["returned"]
    assert [r.text for r in shown] == ["shown"]
    assert execution.text == "returned"


def test_error_name_value_and_traceback(sbx: Sandbox) -> None:
    errors = []
    execution = sbx.run_code(
        "def inner():\n    raise ValueError('bad value 7')\n\ninner()", on_error=errors.append
    )
    assert execution.error is not None
    assert execution.error.name == "ValueError"
    assert execution.error.value == "bad value 7"
    assert "inner()" in execution.error.traceback
    assert "raise ValueError" in execution.error.traceback
    assert "\x1b[" not in execution.error.traceback  # plain text, no terminal colours
    assert errors and errors[0].name == "ValueError"
    # The context survives an error.
    assert sbx.run_code("1 + 1").text == "2"


def test_syntax_error(sbx: Sandbox) -> None:
    execution = sbx.run_code("def broken(:\n    pass")
    assert execution.error is not None
    assert execution.error.name == "SyntaxError"


def test_env_vars_apply_to_one_execution(sbx: Sandbox) -> None:
    with_env = sbx.run_code(
        "import os; os.environ.get('GREETING')", envs={"GREETING": "hello there"}
    )
    assert with_env.text == "hello there"
    after = sbx.run_code("import os; os.environ.get('GREETING', 'unset')")
    assert after.text == "unset"


def test_sandbox_env_reaches_the_kernel(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    sbx = make_sandbox(envs={"FROM_CREATE": "yes"})
    # The kernel inherits the service's environment; the bridge-started service gets the
    # sandbox env from the agent the same way the agent-started one does.
    assert sbx.run_code("import os; os.environ.get('FROM_CREATE')").text == "yes"


def test_javascript_keeps_state_and_returns_last_value(sbx: Sandbox) -> None:
    first = sbx.run_code("let total = 20; const add = (a) => total += a;", language="javascript")
    assert first.error is None
    out: list[str] = []
    second = sbx.run_code(
        "console.log('adding'); add(22)", language="js", on_stdout=lambda m: out.append(m.line)
    )
    assert second.text == "42"
    assert out == ["adding\n"]
    awaited = sbx.run_code(
        "const v = await new Promise((r) => setTimeout(() => r(total + 1), 50));\nv",
        language="javascript",
    )
    assert awaited.text == "43"
    assert sbx.run_code("v * 2", language="javascript").text == "86"


def test_javascript_es_module_imports(sbx: Sandbox) -> None:
    """`import` statements work in a cell (a script for node) and bind for later cells."""
    r = sbx.run_code("import fs from 'fs'\nimport { join as j } from 'node:path'\n"
                     "import * as os from 'os'\nfs.existsSync(j('/', 'tmp'))",
                     language="javascript")  # fmt: skip
    assert r.error is None and r.text == "true", r
    assert sbx.run_code("typeof os.cpus + ' ' + j('a', 'b')", language="js").text == "function a/b"
    sbx.files.write("/home/user/mod.mjs", "export const answer = 42; export default 'dflt';")
    r = sbx.run_code("import d, { answer } from './mod.mjs'\n`${d} ${answer}`", language="js")
    assert r.error is None and r.text == "dflt 42", r
    missing = sbx.run_code("import nope from 'no-such-module'", language="js")
    assert missing.error is not None and "no-such-module" in missing.error.value


def test_javascript_errors_and_env(sbx: Sandbox) -> None:
    execution = sbx.run_code("null.prop", language="javascript")
    assert execution.error is not None
    assert execution.error.name == "TypeError"
    assert "null" in execution.error.value
    env = sbx.run_code("process.env.JS_VAR", language="javascript", envs={"JS_VAR": "on"})
    assert env.text == "on"
    assert sbx.run_code("process.env.JS_VAR", language="javascript").text is None


def test_bash_is_a_persistent_shell(sbx: Sandbox) -> None:
    sbx.run_code("cd /tmp && export MARK=kept && mkdir -p bashdir", language="bash")
    execution = sbx.run_code("echo $PWD $MARK $ONE_OFF; ls -d bashdir", language="bash",
                             envs={"ONE_OFF": "x"})  # fmt: skip
    assert execution.logs.stdout == ["/tmp kept x\nbashdir\n"]
    again = sbx.run_code('echo "[$ONE_OFF]"', language="bash")
    assert again.logs.stdout == ["[]\n"]
    failed = sbx.run_code("ls /does-not-exist", language="bash")
    assert failed.error is not None
    assert failed.error.value == "exit status 2"
    assert "No such file" in "".join(failed.logs.stderr)


def test_r_contexts_keep_state_and_take_env(sbx: Sandbox) -> None:
    """R, through IRkernel (Debian's): state across cells, results, errors, per-call env."""
    first = sbx.run_code("x <- 40 + 2\nx", language="r")
    assert first.error is None and first.text == "[1] 42", first
    assert sbx.run_code("x * 2", language="r").text == "[1] 84"
    out = sbx.run_code('cat("hello\\n")', language="r")
    assert out.logs.stdout == ["hello\n"], out
    err = sbx.run_code('stop("boom")', language="r")
    assert err.error is not None and "boom" in err.error.value, err
    env = sbx.run_code('Sys.getenv("R_VAR")', language="r", envs={"R_VAR": "on"})
    assert env.text == '[1] "on"', env
    assert sbx.run_code('Sys.getenv("R_VAR")', language="r").text == '[1] ""'
    ctx = sbx.create_code_context(language="r", cwd="/tmp")
    assert sbx.run_code("getwd()", context=ctx).text == '[1] "/tmp"'


def test_typescript_cells(sbx: Sandbox) -> None:
    """`ts` runs TypeScript (types erased by TypeScript's own transpiler) in a node context."""
    r = sbx.run_code("interface P { n: number }\nconst p: P = { n: 41 };\np.n + 1", language="ts")
    assert r.error is None and r.text == "42", r
    assert sbx.run_code("const twice = (x: number): number => x * 2;\ntwice(p.n)",
                        language="typescript").text == "82"  # fmt: skip
    bad = sbx.run_code("const s: = 1", language="ts")
    assert bad.error is not None and bad.error.name == "SyntaxError", bad


def test_java_contexts_keep_declarations(sbx: Sandbox) -> None:
    """Java, through JShell: declarations persist, the last expression is the result, output
    streams, exceptions and compile errors are errors."""
    r = sbx.run_code("int x = 40;\nx + 2", language="java")
    assert r.error is None and r.text == "42", r
    r = sbx.run_code('System.out.println("hi " + x);\nString.valueOf(x * 2)', language="java")
    assert r.logs.stdout == ["hi 40\n"] and r.text == "80", r  # a String as its text, as E2B's
    r = sbx.run_code('"tab\\there, \\"quoted\\" \\u00e9"', language="java")
    assert r.text == 'tab\there, "quoted" \u00e9', r
    boom = sbx.run_code("int[] a = new int[1];\na[3] = 1;", language="java")
    assert boom.error is not None and boom.error.name.endswith("ArrayIndexOutOfBoundsException")
    bad = sbx.run_code("foo bar;", language="java")
    assert bad.error is not None and bad.error.name == "CompilationError", bad


def test_java_sees_environment_variables_as_system_properties(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    """As E2B's Java kernel: the sandbox's envs and a call's ``envs`` are system properties (a
    call's for that call only)."""
    sbx = make_sandbox(envs={"FROM_SANDBOX": "s"})
    get = 'System.getProperty("FROM_SANDBOX") + "/" + System.getProperty("FROM_CALL")'
    assert sbx.run_code(get, language="java", envs={"FROM_CALL": "c"}).text == "s/c"
    assert sbx.run_code(get, language="java").text == "s/null"


def test_output_written_just_before_a_cell_ends_belongs_to_it(sbx: Sandbox) -> None:
    # The kernel skips flushes of streams that hold nothing and sleeps no more after a cell
    # (kernel_launcher.py, python_kernel.py): whatever a cell writes last, unflushed, from a
    # thread or at the file-descriptor level, still arrives with that cell, before its result.
    code = (
        "import os, sys, threading\n"
        "print('a{i}', end='')\n"
        "t = threading.Thread(target=print, args=('b{i}',)); t.start(); t.join()\n"
        "print('e{i}', file=sys.stderr, end='')\n"
        "{i}\n"
    )
    for i in range(12):
        execution = sbx.run_code(code.format(i=i))
        assert execution.error is None
        assert "".join(execution.logs.stdout) == f"a{i}b{i}\n"
        assert "".join(execution.logs.stderr) == f"e{i}"
        assert execution.text == str(i)


def test_the_kernel_starts_without_what_it_cannot_use_and_user_code_still_imports_it(
    sbx: Sandbox,
) -> None:
    # kernel_launcher.py keeps debugpy, jedi and the terminal IPython (prompt_toolkit) out of
    # the kernel's start: a third of its memory. User code imports each of them as usual.
    started = sbx.run_code(
        "import sys\n"
        "sorted({m.split('.')[0] for m in sys.modules}"
        " & {'debugpy', '_pydevd_bundle', 'jedi', 'parso', 'prompt_toolkit'})"
    )
    assert started.error is None, started.error
    assert started.text == "[]"
    imported = sbx.run_code(
        "import debugpy, jedi, prompt_toolkit, IPython\n"
        "from IPython.terminal.embed import InteractiveShellEmbed\n"
        "jedi.Script('import os\\nos.pa').complete()[0].name, callable(IPython.embed),"
        " InteractiveShellEmbed.__module__"
    )
    assert imported.error is None, imported.error
    assert imported.text == "('pardir', True, 'IPython.terminal.embed')"
