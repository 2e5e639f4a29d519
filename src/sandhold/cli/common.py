"""What the command groups share: the two consoles, the one way a command fails with an error of
the tree (``fail``, through the exit-status table of ``sandhold.cli.errors``), and settings.

Kept light: ``sandhold --help`` imports every group module, so anything heavy is imported inside
the function that needs it."""

from __future__ import annotations

from typing import Any, NoReturn

import typer
from rich.console import Console

from sandhold.cli.errors import exit_status
from sandhold.errors import SandholdError

console = Console()
err = Console(stderr=True, soft_wrap=True)  # an error is one line, whatever the terminal

FD_HELP = (
    "serve on this inherited, already listening socket instead of binding host and port "
    "(the API-key rule judges the socket's own address)"
)


def fail(e: SandholdError) -> NoReturn:
    """Print ``e`` (escaped: messages quote user input) and exit with its table's status."""
    from rich.markup import escape

    err.print(f"[red]error[/red] ({e.code}): {escape(e.message)}")
    raise typer.Exit(exit_status(e))


def load_settings(**overrides: Any) -> Any:
    """Fresh settings with the options that were given (``None``: not given) over the rest.
    Raises ``ConfigError``."""
    from sandhold.config import load

    return load(**{k: v for k, v in overrides.items() if v is not None})


def runtime() -> Any:
    """This host's runtime, opened. Raises an error of the tree (settings, host, data dir)."""
    from sandhold.config import get_settings
    from sandhold.runtime.runtime import Runtime

    return Runtime(get_settings()).open()
