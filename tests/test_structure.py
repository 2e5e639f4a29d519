"""The structure the architecture page promises (docs/architecture.md), checked on the sources:
which way imports go, how large a module may grow, where the ports are named."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "sandhold"
MAX_LINES = 500
# (importing package, package it must never import)
FORBIDDEN = [
    ("gateway", "sandhold.e2b"),  # the gateway speaks E2B as a client, never through the server
    ("service", "sandhold.e2b"),  # the service knows nothing of any surface
    ("service", "sandhold.gateway"),
    ("runtime", "sandhold.service"),  # the runtime is below the service
    ("runtime", "sandhold.e2b"),
    ("runtime", "sandhold.gateway"),
    ("envd", "sandhold.e2b"),
    ("envd", "sandhold.gateway"),
    ("envd", "sandhold.service"),
    # Templates are built on the sandbox core, never on checkpoints (which build on both).
    ("runtime/templates", "sandhold.runtime.checkpoint"),
    # Only the facade composes the runtime; its parts are handed what they use (host.py).
    ("runtime/templates", "sandhold.runtime.runtime"),
    ("runtime/checkpoint", "sandhold.runtime.runtime"),
]
# The sandbox core's modules that may use checkpoints: the facade, which composes, and the
# doctor, which checks CRIU on this host.
CORE_USING_CHECKPOINTS = {"runtime/runtime.py", "runtime/doctor.py"}


def modules(package: str = "") -> list[Path]:
    return sorted((SRC / package).rglob("*.py"))


def imported(path: Path) -> set[str]:
    """Every module a source file imports, at the top or inside functions."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


@pytest.mark.parametrize(("package", "forbidden"), FORBIDDEN)
def test_imports_go_down_only(package: str, forbidden: str) -> None:
    bad = [f"{p.relative_to(SRC)} imports {m}" for p in modules(package) for m in imported(p)
           if m == forbidden or m.startswith(forbidden + ".")]  # fmt: skip
    assert not bad, bad


def test_the_sandbox_core_uses_no_checkpoint() -> None:
    """The core (``runtime/*.py``) works without CRIU: the cgroup and mount layers below it can
    be swapped without touching checkpoints, and nothing in it reaches for the facade."""
    bad = []
    for p in sorted((SRC / "runtime").glob("*.py")):
        rel = str(p.relative_to(SRC))
        for m in imported(p):
            uses_checkpoint = m.startswith("sandhold.runtime.checkpoint")
            if uses_checkpoint and rel not in CORE_USING_CHECKPOINTS:
                bad.append(f"{rel} imports {m}")
            if m == "sandhold.runtime.runtime" and rel != "runtime/runtime.py":
                bad.append(f"{rel} imports {m}")
    assert not bad, bad


def fmt_skips(text: str) -> list[ast.AST]:
    """The statements a ``# fmt: skip`` keeps from the formatter (the one ending on its line)."""
    tree = ast.parse(text)
    ends = {i + 1 for i, line in enumerate(text.splitlines()) if line.endswith("# fmt: skip")}
    out = []
    for ln in sorted(ends):
        nodes = [n for n in ast.walk(tree) if isinstance(n, ast.stmt) and n.end_lineno == ln]
        if nodes:
            out.append(min(nodes, key=lambda n: (n.end_lineno or 0) - n.lineno))
    return out


def is_flag_table(node: ast.AST) -> bool:
    """A statement that lays out command-line flags (three or more ``-x``/``--xx`` strings)."""
    strings = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant)
               and isinstance(c.value, str)]  # fmt: skip
    return sum(1 for v in strings if v[:2] == "--" or (v[:1] == "-" and v[1:2].isalpha())) >= 3


def test_the_formatter_formats_all_but_flag_tables() -> None:
    """The line cap is met by splitting modules, not by packing lines: ``# fmt: skip`` in the
    sources only keeps aligned tables of command-line flags."""
    packed = [f"{p.relative_to(SRC)}:{n.lineno}" for p in modules()
              for n in fmt_skips(p.read_text()) if not is_flag_table(n)]  # fmt: skip
    assert not packed, f"# fmt: skip on what is not a table of flags: {packed}"
    assert not is_flag_table(ast.parse('x = ["a", "-", "b"]'))
    assert is_flag_table(ast.parse('x = ["--bind", "a", "-O2", "--ro-bind"]'))


# Modules that build SQL outside sandhold.store: features that own their tables or reports
# (docs/architecture.md, "Where SQL lives").
SQL_OWNERS = {"tunnel/registry.py", "tunnel/relay.py", "console/queries.py", "fleet/catalog.py"}
SQL_BUILDERS = {"select", "insert", "update", "delete", "text", "func", "and_", "or_"}


def test_sql_lives_in_the_store_or_a_feature_that_owns_its_tables() -> None:
    bad = []
    for p in modules():
        rel = str(p.relative_to(SRC))
        if rel.startswith("store/") or rel in SQL_OWNERS:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("sql"):
                continue
            if names := {a.name for a in node.names} & SQL_BUILDERS:
                bad.append(f"{rel} imports {sorted(names)} from {node.module}")
    assert not bad, bad


def test_no_module_over_the_limit() -> None:
    big = {str(p.relative_to(SRC)): n for p in modules()
           if (n := len(p.read_text().splitlines())) > MAX_LINES}  # fmt: skip
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def test_the_agent_imports_nothing_of_the_host() -> None:
    """The in-sandbox program (``sandhold.agent``) runs alone, on the sandbox's Python, with its
    package copied (runtime/agentlib.py): the host may import its constants, never the reverse."""
    bad = [f"{p.relative_to(SRC)} imports {m}" for p in modules("agent") for m in imported(p)
           if m.startswith("sandhold") and not m.startswith("sandhold.agent")]  # fmt: skip
    assert not bad, bad


def test_the_envd_ports_are_named_once_on_the_host_side() -> None:
    """The in-sandbox code (agent, interpreter service) cannot import the host's constants."""
    in_sandbox = ("agent/", "interpreter/")
    host_interpreter = ("interpreter/template.py", "interpreter/packages.py")
    literal = []
    for p in modules():
        rel = str(p.relative_to(SRC))
        sandboxed = rel.startswith(in_sandbox) and rel not in host_interpreter
        if sandboxed or rel == "envd/__init__.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Constant) and node.value in (49983, 49999):
                literal.append(f"{rel}:{node.lineno}")
    assert not literal, f"envd/interpreter port literals outside sandhold.envd: {literal}"


def test_every_module_is_named_in_its_package_map() -> None:
    """Each package's ``__init__`` docstring is its map: every module of the package is in it
    (as ``name`` or ``name.py``), so a reader finds a module's place without opening it."""
    unnamed = []
    for init in sorted(SRC.rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        for mod in sorted(init.parent.glob("*.py")):
            named = f"``{mod.stem}``" in doc or f"``{mod.name}``" in doc
            if mod.name != "__init__.py" and not named:
                unnamed.append(str(mod.relative_to(SRC)))
    assert not unnamed, f"modules missing from their package's map: {unnamed}"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of sandhold it imports, at any depth of the file (type-checking
    imports too: a helper typed by its parent is still bound to it)."""
    names = {module_name(p): p for p in modules()}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                base = node.module
                if node.level:
                    base = ".".join([*package.split(".")[: 1 - node.level or None], base])
                edges.add(base)
                edges.update(f"{base}.{a.name}" for a in node.names)
        graph[name] = {e for e in edges if e in names and e != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_circles_are_found() -> None:
    """The check below can fail: a circle through three modules is reported."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_the_import_graph_has_no_circles() -> None:
    """No module imports, even only for type checking, one that imports it back: a helper is
    handed its parts, never its parent."""
    found = circles(import_graph())
    assert not found, f"import circles: {found}"


def test_no_test_imports_a_conftest() -> None:
    """Conftest files hold fixtures; helpers shared between tests live in tests/support."""
    root = SRC.parents[1]
    bad = [f"{p.relative_to(root)} imports {m}" for d in ("tests", "bench")
           for p in sorted((root / d).rglob("*.py")) for m in imported(p)
           if m.endswith("conftest")]  # fmt: skip
    assert not bad, bad
