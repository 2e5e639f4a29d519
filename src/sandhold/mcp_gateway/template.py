"""Building the ``mcp-gateway`` template (on the host): ``base`` plus the ``mcp-gateway`` command.

The SDK creates sandboxes with ``mcp`` from this template (``default_mcp_template``); a team's
own MCP template is built on it (``Template().from_template("mcp-gateway")``) with its servers'
registry files (docs/mcp-gateway.md). Inside:

* ``/opt/sandhold/mcp-gateway/lib`` — the official ``mcp`` SDK and its dependencies, copied
  from the server's own environment (the version this project pins), and this package's
  in-sandbox modules; run by the sandbox's ``/usr/bin/python3`` (the host's, through
  ``base``'s ``/usr``), which must be the server's Python version for the compiled ones;
* ``/opt/sandhold/bin/mcp-gateway`` — the command (on ``base``'s PATH);
* ``/etc/mcp-gateway/servers/`` — the registry, empty.

The copy is built once per content (``lib-<key>`` in the cache dir, owned by the mapped ids)
and hard-linked into the template; the template records its key and is rebuilt when it differs.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sandhold.errors import HostUnsupported, TemplateBuildFailed
from sandhold.runtime import staging
from sandhold.runtime.templates.rootfs_owners import shift_ownership
from sandhold.runtime.templates.store import (
    BASE_BIN,
    BUILD,
    Template,
    TemplateStore,
    flocked,
)

log = logging.getLogger(__name__)

TEMPLATE_NAME = "mcp-gateway"
PYTHON = "/usr/bin/python3"
SANDBOX_LIB = "/opt/sandhold/mcp-gateway/lib"
SANDBOX_REGISTRY = "/etc/mcp-gateway/servers"
IN_SANDBOX = ("__init__.py", "config.py", "gateway.py", "main.py")  # this package's, copied
COMMAND = f"""#!{PYTHON} -I
import sys
sys.path.insert(0, {SANDBOX_LIB!r})
from sandhold.mcp_gateway.main import main
sys.exit(main(sys.argv[1:]))
"""


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distributions(root: str = "mcp") -> list[md.Distribution]:
    """``root`` and what it requires, transitively, as installed here: a requirement counts when
    its distribution is installed (a platform's, e.g. pywin32, is not) and, when it is an
    extra's, that extra was asked for (``pyjwt[crypto]``)."""
    seen: dict[str, md.Distribution] = {}
    todo: list[tuple[str, set[str]]] = [(root, set())]
    while todo:
        name, extras = todo.pop()
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        k = _key(dist.metadata["Name"])
        if k in seen:
            continue
        seen[k] = dist
        for req in dist.requires or []:
            spec, _, marker = req.partition(";")
            m = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", spec)
            if m is None:
                continue
            extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
            if extra and _key(extra[1]) not in {_key(e) for e in extras}:
                continue
            todo.append((m[1], {e.strip() for e in (m[2] or "").split(",") if e.strip()}))
    return [seen[k] for k in sorted(seen)]


def _code_files() -> list[Path]:
    here = Path(__file__).parent
    return [here / n for n in IN_SANDBOX]


def build_key(uid_base: int) -> str:
    h = hashlib.sha256(f"{sys.version_info[:2]} uid_base={uid_base}\n".encode())
    for d in distributions():
        h.update(f"{d.metadata['Name']}=={d.version}\n".encode())
    for f in _code_files():
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    h.update(COMMAND.encode())
    return h.hexdigest()[:16]


def _check_python() -> None:
    proc = subprocess.run(
        [PYTHON, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise HostUnsupported(f"{PYTHON} does not run: {proc.stderr.strip()[-300:]}")
    theirs, ours = tuple(map(int, proc.stdout.split())), sys.version_info[:2]
    if theirs != ours:
        raise HostUnsupported(
            f"the mcp-gateway template runs the mcp SDK copied from the server's Python "
            f"({'.'.join(map(str, ours))}) on the sandboxes' {PYTHON} "
            f"({'.'.join(map(str, theirs))}): run the server on a venv of {PYTHON}"
        )


def ensure_lib(cache_dir: Path, uid_base: int, key: str) -> Path:
    """The copied packages and code, built once per key."""
    lib = cache_dir / f"lib-{key}"
    cache_dir.mkdir(parents=True, exist_ok=True)
    with flocked(cache_dir / ".lock"):
        if (lib / ".complete").exists():
            return lib
        _check_python()
        staging = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".lib-"))
        try:
            tree = staging / "t"
            tree.mkdir()
            for dist in distributions():
                for rel in dist.files or []:
                    parts = Path(str(rel)).parts
                    if not parts or parts[0] == ".." or "__pycache__" in parts:
                        continue  # scripts outside site-packages; bytecode is rebuilt
                    src = Path(str(dist.locate_file(rel)))
                    if src.is_file():
                        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(src, tree / rel)
            pkg = tree / "sandhold" / "mcp_gateway"
            pkg.mkdir(parents=True)
            (tree / "sandhold" / "__init__.py").write_text("")
            for f in _code_files():
                shutil.copy2(f, pkg / f.name)
            subprocess.run(
                [PYTHON, "-m", "compileall", "-q", str(tree)], capture_output=True, check=False
            )
            probe = subprocess.run(
                [
                    PYTHON,
                    "-I",
                    "-c",
                    f"import sys; sys.path.insert(0, {str(tree)!r}); "
                    "import sandhold.mcp_gateway.gateway",
                ],
                capture_output=True,
                text=True,
            )
            if probe.returncode != 0:
                raise TemplateBuildFailed(
                    "the mcp SDK does not import on the sandboxes' "
                    f"{PYTHON}: {probe.stderr.strip()[-500:]}"
                )
            subprocess.run(["chmod", "-R", "u+rwX,go+rX,go-w", str(tree)], check=True)
            shift_ownership(tree, uid_base)
            (tree / ".complete").write_text(key)
            shutil.rmtree(lib, ignore_errors=True)
            tree.rename(lib)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return lib


def is_up_to_date(store: TemplateStore, name: str, key: str) -> bool:
    try:
        info = json.loads((store.root / name / "build.json").read_text())
    except (FileNotFoundError, ValueError):
        return False
    return (store.root / name / "template.json").exists() and info.get("key") == key


def build_mcp_gateway_template(store: TemplateStore, name: str = TEMPLATE_NAME) -> Template:
    """Build (or return the up-to-date) ``mcp-gateway`` template in ``store``."""
    key = build_key(store.uid_base)
    with flocked(store.root / f".{name}.lock"):
        if is_up_to_date(store, name, key):
            return store.get(name)
        t0 = time.monotonic()
        lib = ensure_lib(store.root.parent / "cache" / "mcp-gateway", store.uid_base, key)
        staging_root = staging.make(store.root, BUILD)  # swept if a crash cuts it short
        try:
            # `base`'s skeleton, built in a private store: nothing half-built is ever visible.
            base = TemplateStore(staging_root, store.uid_base).build_base(name)
            rootfs = base.rootfs
            target = rootfs / SANDBOX_LIB.lstrip("/")
            target.parent.mkdir(parents=True)
            if subprocess.run(["cp", "-al", str(lib), str(target)]).returncode != 0:
                shutil.rmtree(target, ignore_errors=True)
                subprocess.run(["cp", "-a", str(lib), str(target)], check=True)
            command = rootfs / BASE_BIN.lstrip("/") / "mcp-gateway"
            command.write_text(COMMAND)
            command.chmod(0o755)
            registry = rootfs / SANDBOX_REGISTRY.lstrip("/")
            registry.mkdir(parents=True, mode=0o755)
            for new in (target.parent, command, registry.parent, registry):  # lib is shifted
                _own(new, store.uid_base)
            tpl = Template(
                name=name,
                kind="host",
                rootfs=store.root / name / "rootfs",
                env=dict(base.env),
                ro_binds=list(base.ro_binds),
                created_at=time.time(),
            )
            staged = staging_root / name
            (staged / "template.json").write_text(json.dumps(tpl.to_json(), indent=2))
            (staged / "build.json").write_text(json.dumps({"key": key, "built_at": time.time()}))
            store.swap_in(staged, name)
        finally:
            shutil.rmtree(staging_root, ignore_errors=True)
        log.info("built template %s in %.1f s", name, time.monotonic() - t0)
        return store.get(name)


def _own(path: Path, uid_base: int) -> None:
    """What host uid n made, sandbox uid n owns (as templates._shift_ownership, one path)."""
    st = os.lstat(path)
    if st.st_uid < 65536:
        os.lchown(path, st.st_uid + uid_base, st.st_gid + uid_base)
