"""The error tree and its wire tables: every class of the tree has an answer on every wire."""

from __future__ import annotations

import importlib
import pkgutil
import re

import pytest

import sandhold
from sandhold import errors
from sandhold.cli.errors import EXIT_STATUS
from sandhold.e2b.errors import E2B_STATUS
from sandhold.gateway.errors import MCP_RETRYABLE, REST_STATUS

TABLES = {"e2b": E2B_STATUS, "rest": REST_STATUS, "mcp": MCP_RETRYABLE, "cli": EXIT_STATUS}


HOST_SIDE_INTERPRETER = {"sandhold.interpreter", "sandhold.interpreter.template",
                         "sandhold.interpreter.packages"}  # fmt: skip


def _in_sandbox(name: str) -> bool:
    """The agent and the code interpreter run inside sandboxes and answer in envd's codes."""
    if name.startswith("sandhold.agent") or name.endswith(".__main__"):
        return True  # (a __main__ runs a program when imported)
    return name.startswith("sandhold.interpreter") and name not in HOST_SIDE_INTERPRETER


def _import_everything() -> None:
    """Subclasses register themselves on import: load every host-side module first."""
    for mod in pkgutil.walk_packages(sandhold.__path__, "sandhold."):
        if not _in_sandbox(mod.name):
            importlib.import_module(mod.name)


@pytest.mark.parametrize("wire", sorted(TABLES))
def test_every_class_of_the_tree_is_in_the_table(wire: str) -> None:
    _import_everything()
    missing = [c.__qualname__ for c in errors.all_classes() if c not in TABLES[wire]]
    assert not missing, f"{wire} table has no answer for {missing}"


def test_every_class_of_the_tree_lives_in_errors_py() -> None:
    _import_everything()
    strays = [f"{c.__module__}.{c.__qualname__}" for c in errors.all_classes()
              if c.__module__ != "sandhold.errors"]  # fmt: skip
    assert not strays, f"errors defined outside sandhold.errors: {strays}"


def test_the_docstring_draws_every_class() -> None:
    drawn = set(re.findall(r"(?:──|^    )\s*(\w+)", errors.__doc__ or "", re.M))
    undrawn = [c.__name__ for c in errors.all_classes() if c.__name__ not in drawn]
    assert not undrawn, f"the tree in errors.py's docstring lacks {undrawn}"


def test_no_host_side_exception_outside_the_tree() -> None:
    """Every exception class the host side defines is a leaf of the one tree."""
    _import_everything()
    loose = []
    for mod in pkgutil.walk_packages(sandhold.__path__, "sandhold."):
        if _in_sandbox(mod.name):
            continue
        m = importlib.import_module(mod.name)
        for obj in vars(m).values():
            if (isinstance(obj, type) and issubclass(obj, BaseException)
                    and obj.__module__ == m.__name__
                    and not issubclass(obj, errors.SandholdError)):  # fmt: skip
                loose.append(f"{m.__name__}.{obj.__qualname__}")
    assert not loose, f"exceptions outside the tree: {loose}"


def test_lookup_finds_the_nearest_answer() -> None:
    assert errors.lookup(REST_STATUS, errors.SandboxNotFound("x")) == 404
    assert errors.lookup(REST_STATUS, errors.PortClosed("x")) == 400
    assert errors.lookup(E2B_STATUS, errors.HostUnsupported("x")) == 500
    assert errors.lookup(REST_STATUS, errors.HostUnsupported("x")) == 503
