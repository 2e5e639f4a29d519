"""Contexts run with the identity E2B's template gives them: root (HOME=/root), in /home/user
unless a cwd is asked for, so a context in /root works; what cells make stays readable and
writable through the SDK's files API (as `user`), and cells change what the SDK uploaded."""

from __future__ import annotations

from e2b_code_interpreter import Sandbox


def test_a_cell_runs_as_root_in_home_user(sbx: Sandbox) -> None:
    code = (
        "import os, getpass, subprocess\n"
        "whoami = subprocess.run(['whoami'], capture_output=True, text=True).stdout.strip()\n"
        "(os.getuid(), os.getgid(), getpass.getuser(), whoami, os.environ['HOME'], os.getcwd())"
    )
    execution = sbx.run_code(code)
    assert execution.error is None, execution.error
    assert execution.text == "(0, 0, 'root', 'root', '/root', '/home/user')"


def test_every_language_runs_as_root(sbx: Sandbox) -> None:
    bash = sbx.run_code("whoami; echo $HOME; pwd", language="bash")
    assert bash.logs.stdout == ["root\n/root\n/home/user\n"], bash
    js = sbx.run_code("[process.getuid(), process.env.HOME, process.cwd()]", language="js")
    assert js.text == "[ 0, '/root', '/home/user' ]", js
    r = sbx.run_code('Sys.getenv("USER")', language="r")
    assert r.text == '[1] "root"', r


def test_a_context_in_root_s_home(sbx: Sandbox) -> None:
    ctx = sbx.create_code_context(cwd="/root")
    assert ctx.cwd == "/root"
    execution = sbx.run_code(
        "import os\nopen('note.txt', 'w').write('kept')\n"
        "(os.getcwd(), open('/root/note.txt').read())",
        context=ctx,
    )
    assert execution.error is None, execution.error
    assert execution.text == "('/root', 'kept')"
    sh = sbx.create_code_context(language="bash", cwd="/root")
    # Joined: how the output is cut into chunks depends on when the context reads it.
    out = sbx.run_code("pwd; cat note.txt; echo", context=sh).logs.stdout
    assert "".join(out) == "/root\nkept\n", out
    for c in (ctx, sh):
        sbx.remove_code_context(c)


def test_what_cells_make_is_the_users_through_the_sdk(sbx: Sandbox) -> None:
    made = sbx.run_code(
        "import os\nos.makedirs('made/deeper', exist_ok=True)\n"
        "open('made/result.csv', 'w').write('a,b\\n1,2\\n')"
    )
    assert made.error is None, made.error
    assert sbx.files.read("/home/user/made/result.csv") == "a,b\n1,2\n"
    sbx.files.write("/home/user/made/result.csv", "a,b\n3,4\n")  # overwritten by `user`
    sbx.files.write("/home/user/made/deeper/extra.txt", "in a directory a cell made")
    read = sbx.run_code("print(open('made/result.csv').read(), end='')")
    assert read.logs.stdout == ["a,b\n3,4\n"], read
    out = sbx.commands.run("echo 5,6 >> made/result.csv; cat made/deeper/extra.txt")
    assert out.stdout == "in a directory a cell made"
    assert sbx.files.read("/home/user/made/result.csv") == "a,b\n3,4\n5,6\n"
    sbx.files.remove("/home/user/made/deeper/extra.txt")
    assert not sbx.files.exists("/home/user/made/deeper/extra.txt")


def test_cells_change_what_the_sdk_uploaded(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/upload.csv", "x\n1\n")
    sbx.files.write("/workspace/upload.csv", "x\n1\n")
    code = (
        "import os\n"
        "for p in ('/home/user/upload.csv', '/workspace/upload.csv'):\n"
        "    open(p, 'a').write('2\\n'); os.chmod(p, 0o640); os.utime(p, (0, 0))\n"
        "open('/workspace/report.txt', 'w').write('done')"
    )
    execution = sbx.run_code(code)
    assert execution.error is None, execution.error
    for path in ("/home/user/upload.csv", "/workspace/upload.csv"):
        assert sbx.files.read(path) == "x\n1\n2\n"
        assert sbx.files.get_info(path).mode & 0o777 == 0o640
    assert sbx.files.read("/workspace/report.txt") == "done"
