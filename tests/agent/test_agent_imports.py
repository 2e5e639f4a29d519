"""The agent runs under the template's ``/usr/bin/python3 -I -S`` with nothing but its own
library copy on sys.path: it may import only the standard library and its vendored h11, and
its modules must not import each other in a circle.

The first test imports every agent module for real, in that interpreter, from the copy the
runtime hands sandboxes; the others read the sources (so imports inside functions, which the
agent uses to load things lazily, count too).
"""

from __future__ import annotations

import ast
import graphlib
import json
import subprocess
import sys
from pathlib import Path

import sandhold.agent
from sandhold.config import Settings

AGENT_DIR = Path(sandhold.agent.__file__).parent
PACKAGE = "sandhold.agent"
PYTHON = "/usr/bin/python3"  # what templates provide, not the venv's interpreter

# Imports every module named on stdin, then prints sys.modules: each name and its file.
PROBE = """
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
for name in json.load(sys.stdin):
    importlib.import_module(name)
print(json.dumps({name: getattr(m, "__file__", None) for name, m in sys.modules.items()}))
"""


def _module_name(path: Path) -> str:
    rel = path.relative_to(AGENT_DIR).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([PACKAGE, *parts])


def _agent_modules() -> dict[str, ast.Module]:
    """Every module of the agent's source tree (recursively: a subpackage would show up here
    and then fail to import from the copy, whose builder takes only ``agent/*.py``)."""
    return {
        _module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(AGENT_DIR.rglob("*.py"))
    }


def _allowed(name: str) -> bool:
    top = name.partition(".")[0]
    if top == "sandhold":  # the agent and the (empty) packages above it, nothing host-side
        return name in ("sandhold", "sandhold.runtime", PACKAGE) or name.startswith(PACKAGE + ".")
    return top in sys.stdlib_module_names or top == "h11"


def test_agent_imports_only_the_standard_library_and_h11(tmp_path: Path) -> None:
    # Imported here: the host-side runtime's imports are no concern of the other tests.
    from sandhold.runtime.runtime import Runtime

    lib = Runtime(Settings(data_dir=tmp_path)).agent_lib()
    modules = sorted(_agent_modules())
    probe = subprocess.run(
        [PYTHON, "-I", "-S", "-c", PROBE, str(lib)],
        input=json.dumps(modules),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    loaded: dict[str, str | None] = json.loads(probe.stdout)
    assert set(modules) <= set(loaded)
    foreign = sorted(m for m in loaded if m != "__main__" and not _allowed(m))
    assert not foreign, f"the agent imports modules a template's python3 lacks: {foreign}"
    # What is not the standard library came from the copy, not from elsewhere on the path.
    for name, file in loaded.items():
        if name.partition(".")[0] in ("sandhold", "h11"):
            assert file is not None and Path(file).is_relative_to(lib), (name, file)


def _imports(tree: ast.Module, module: str) -> list[str]:
    """Absolute names of everything ``module`` imports, wherever in the file."""
    package = module if module == PACKAGE else module.rpartition(".")[0]
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0]
                origin = f"{base}.{node.module}" if node.module else base
            else:
                origin = node.module or ""
            out.append(origin)
            # `from . import libc` imports a module; `from .http import Request` a name.
            out += [f"{origin}.{alias.name}" for alias in node.names]
    return out


def test_lazy_imports_too_are_standard_library() -> None:
    """Imports inside functions run only when called, so the first test may not see them."""
    foreign = {
        f"{module}: {name}"
        for module, tree in _agent_modules().items()
        for name in _imports(tree, module)
        if not _allowed(name)
    }
    assert not foreign, sorted(foreign)


def _import_graph() -> dict[str, set[str]]:
    trees = _agent_modules()
    return {
        module: {name for name in _imports(tree, module) if name in trees and name != module}
        for module, tree in trees.items()
    }


def test_agent_modules_import_each_other_without_cycles() -> None:
    graph = _import_graph()
    assert graph[f"{PACKAGE}.server"], "the graph lost its edges: the import reader is broken"
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        # graphlib lists each module before those importing it: reversed, each imports the next.
        cycle = " -> ".join(m.removeprefix(PACKAGE + ".") for m in reversed(e.args[1]))
        raise AssertionError(f"import cycle in the agent: {cycle}") from None


# What an agent must not load, for its memory: every sandbox runs one (docs/runtime.md, "The
# agent's memory"). asyncio with what it imports is ~3.7 MiB per agent, logging ~0.8, ctypes
# ~0.3 until something needs a libc call the standard library lacks.
HEAVY = ("asyncio", "logging", "ctypes", "concurrent", "threading", "subprocess", "ssl")

# What __main__ imports to serve, then what is left in sys.modules.
SERVE_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import socket
import sandhold.agent.config, sandhold.agent.server
print(json.dumps(sorted(sys.modules)))
"""


def test_serving_imports_none_of_the_heavy_modules(tmp_path: Path) -> None:
    from sandhold.runtime.runtime import Runtime

    lib = Runtime(Settings(data_dir=tmp_path)).agent_lib()
    probe = subprocess.run(
        [PYTHON, "-I", "-S", "-c", SERVE_PROBE, str(lib)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    loaded = {name.partition(".")[0] for name in json.loads(probe.stdout)}
    assert "h11" in loaded and "sandhold" in loaded  # the probe imported the server
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


async def test_an_idle_agent_has_not_mapped_ctypes() -> None:
    """A C module shows in the process's mappings once imported: an agent that has served
    requests but needed no libc call (no file operation as another user) has no _ctypes."""
    from tests.support.agent import start_agent

    async with start_agent() as a:
        for _ in range(3):
            assert (await a.client.get("/health")).status_code == 204
        maps = Path(f"/proc/{a.pid}/maps").read_text()
        assert "/_asyncio." not in maps and "/_ctypes." not in maps, maps
        assert "python3" in maps  # the right process


async def test_an_agent_that_ran_commands_as_a_user_has_not_mapped_ctypes(tmp_path: Path) -> None:
    """From a copy built as the runtime builds it: commands and their cwd checks as another
    user go through the agent's extension (native.c), not ctypes (~1 MiB of every agent)."""
    from sandhold.runtime.runtime import Runtime
    from tests.agent.helpers import run
    from tests.support.agent import start_agent

    lib = Runtime(Settings(data_dir=tmp_path)).agent_lib()
    assert list(lib.glob("sandhold/agent/_native*.so")), "the extension did not build"
    async with start_agent(lib=lib) as a:
        for _ in range(3):
            out = await run(a.client, "id -un; pwd", user="nobody", process={"cwd": "/tmp"})
            assert out.output() == b"nobody\n/tmp\n", out
        maps = Path(f"/proc/{a.pid}/maps").read_text()
        assert "/_native." in maps, "the extension should be what started them"
        assert "/_ctypes." not in maps, maps
