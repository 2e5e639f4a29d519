"""The ``bash`` tool's persistent shell, kept in the sandbox rather than in the worker.

Each call is one ``run_command`` through the gateway: a short bash script that first restores
the shell's state saved by the previous call (working directory, exported variables, shell
functions), then ``eval``s the command in that same shell (so ``cd``, ``export`` and function
definitions take effect), and saves the state again from an ``EXIT`` trap, which also runs when
the command calls ``exit``. The state lives in the sandbox (``/tmp/.sandhold-shell``), not in a
worker's memory: a worker that replaces a killed one finds the shell where the session left
it, and several workers never hold diverging copies. Background jobs (``cmd &``) keep running
in the sandbox after their call returns. ``restart`` forgets the state; a reclaimed sandbox
(its ``/tmp`` gone) starts a fresh shell in ``/workspace``, as a rebooted machine would.

What a long-lived process would keep and this does not: unexported variables, aliases,
``set`` options and traps.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

STATE_DIR = "/tmp/.sandhold-shell"
OUTPUT_LIMIT = 100 * 1024  # the tail kept, as the SDK's own bash tool keeps it
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")

# Runs under the gateway's `bash -l -c`, as the sandbox's user, in /workspace. Names start with
# __sandhold_ so that they stay out of the saved state.
_PROLOGUE = f"""exec </dev/null 2>&1
__sandhold_dir={STATE_DIR}
__sandhold_save() {{
  mkdir -p "$__sandhold_dir" && chmod 700 "$__sandhold_dir" || return
  pwd >"$__sandhold_dir/cwd.new" && mv -f "$__sandhold_dir/cwd.new" "$__sandhold_dir/cwd"
  export -p >"$__sandhold_dir/env.new" && mv -f "$__sandhold_dir/env.new" "$__sandhold_dir/env"
  local __sandhold_fns
  __sandhold_fns=$(compgen -A function | grep -v '^__sandhold_')
  if [ -n "$__sandhold_fns" ]; then
    declare -f $__sandhold_fns >"$__sandhold_dir/functions.new"
  else
    : >"$__sandhold_dir/functions.new"
  fi
  mv -f "$__sandhold_dir/functions.new" "$__sandhold_dir/functions"
}}
if [ -f "$__sandhold_dir/env" ]; then
  for __sandhold_v in $(compgen -e); do unset "$__sandhold_v" 2>/dev/null; done
  . "$__sandhold_dir/env" 2>/dev/null
  [ -f "$__sandhold_dir/functions" ] && . "$__sandhold_dir/functions" 2>/dev/null
  cd -- "$(cat "$__sandhold_dir/cwd")" 2>/dev/null || cd /workspace
fi
unset __sandhold_v
trap '__sandhold_rc=$?; __sandhold_save; exit $__sandhold_rc' EXIT
"""

RESET_SCRIPT = f"rm -rf -- {STATE_DIR}"


def command_script(command: str) -> str:
    """The script that runs ``command`` in the session's persistent shell."""
    return f"{_PROLOGUE}eval {shlex.quote(command)}\n"


@dataclass(frozen=True)
class ShellOutput:
    text: str
    exit_code: int | None  # None: timed out (killed before it finished)


def shell_output(result: dict[str, object]) -> ShellOutput:
    """A ``run_command`` result as the SDK's bash tool reports it: stdout and stderr merged
    (the script does it), ANSI escapes stripped, the last ``OUTPUT_LIMIT`` bytes kept."""
    raw = str(result.get("stdout") or "") + str(result.get("stderr") or "")
    text = _ANSI.sub("", raw)
    encoded = text.encode()
    truncated = bool(result.get("truncated")) or len(encoded) > OUTPUT_LIMIT
    if len(encoded) > OUTPUT_LIMIT:
        text = encoded[-OUTPUT_LIMIT:].decode(errors="replace")
    text = text.rstrip("\n")
    if truncated:
        text = "[output truncated]\n" + text
    code = result.get("exit_code")
    return ShellOutput(text, code if isinstance(code, int) else None)
