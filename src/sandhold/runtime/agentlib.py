"""The read-only copy of the agent's code (and its one dependency, h11) that sandboxes run.

Keyed by content hash: running sandboxes keep the version they started with, and the copy
carries compiled bytecode so the agent starts without compiling.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

AGENT_SRC = Path(__file__).parents[1] / "agent"  # sandhold.agent
HELPER_SRC = AGENT_SRC / "spawn_helper.c"
EXTENSION_SRC = AGENT_SRC / "native.c"
CHILD_SRC = AGENT_SRC / "spawn_child.h"  # included by both
# Where the headers of the Python that runs agents are, and its extension modules' suffix.
PYTHON_PATHS = (
    "import sysconfig as s; print(s.get_paths()['include']); print(s.get_config_var('EXT_SUFFIX'))"
)

log = logging.getLogger(__name__)


def _build_helper(target: Path) -> None:
    """The agent's spawn helper, static (templates bring their own libc, or none); without a
    compiler the agent forks commands itself, slower (docs/runtime.md)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        log.warning("no C compiler: sandbox agents fork commands themselves (install gcc)")
        return
    r = subprocess.run([cc, "-O2", "-static", "-Wall", "-o", str(target), str(HELPER_SRC)],
                       capture_output=True, text=True, check=False)  # fmt: skip
    if r.returncode != 0:
        log.warning("the agent's spawn helper did not build: %s", r.stderr.strip()[-500:])
        target.unlink(missing_ok=True)


def _build_extension(agent_dir: Path) -> None:
    """The agent's compiled calls (native.c: the one-step spawn, the filesystem identity), an
    extension module of the host's Python: the one agents run on, but in templates with a
    Python of their own, whose agents use the helper and ctypes instead, as where the headers
    (python3-dev) are missing."""
    cc = shutil.which("cc") or shutil.which("gcc")
    probe = subprocess.run(
        ["/usr/bin/python3", "-c", PYTHON_PATHS], capture_output=True, text=True, check=False
    )
    include, _, suffix = probe.stdout.strip().partition("\n")
    if cc is None or probe.returncode != 0 or not (Path(include) / "Python.h").exists():
        log.warning(
            "no headers of /usr/bin/python3 (install python3-dev): sandbox agents "
            "start commands through the spawn helper"
        )
        return
    target = agent_dir / f"_native{suffix}"
    argv = [cc, "-O2", "-shared", "-fPIC", "-Wall", "-I", include, "-o", str(target)]
    r = subprocess.run([*argv, str(EXTENSION_SRC)], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        log.warning("the agent's extension did not build: %s", r.stderr.strip()[-500:])
        target.unlink(missing_ok=True)


class AgentLib:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._cached: tuple[tuple[tuple[str, int, int], ...], Path] | None = None

    def path(self) -> Path:
        import h11

        h11_src = Path(h11.__file__).parent
        files = [
            *sorted(AGENT_SRC.glob("*.py")),
            HELPER_SRC,
            EXTENSION_SRC,
            CHILD_SRC,
            *sorted(h11_src.glob("*.py")),
        ]
        # Hashing the sources on every create cost ~2-4 ms: redo it only when a file changed.
        stamp = tuple((str(f), st.st_mtime_ns, st.st_size) for f in files for st in [f.stat()])
        cached = self._cached
        if cached is not None and cached[0] == stamp and cached[1].exists():
            return cached[1]
        digest = hashlib.sha256()
        for f in files:
            digest.update(f.name.encode() + f.read_bytes())
        target = self.root / digest.hexdigest()[:16]
        if not target.exists():
            self._build(target, h11_src)
        self._cached = (stamp, target)
        return target

    def _build(self, target: Path, h11_src: Path) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=self.root, prefix=".staging-"))
        pkg = staging / "sandhold"
        (pkg / "agent").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        for f in AGENT_SRC.glob("*.py"):
            shutil.copy2(f, pkg / "agent" / f.name)
        shutil.copytree(h11_src, staging / "h11", ignore=shutil.ignore_patterns("__pycache__"))
        _build_helper(pkg / "agent" / "sandhold-spawn")
        _build_extension(pkg / "agent")
        subprocess.run(["/usr/bin/python3", "-m", "compileall", "-q", str(staging)], check=False)
        for dirpath, dirnames, filenames in os.walk(staging):
            for n in (*dirnames, *filenames):
                executable = n in dirnames or n == "sandhold-spawn" or n.endswith(".so")
                os.chmod(os.path.join(dirpath, n), 0o755 if executable else 0o644)
        os.chmod(staging, 0o755)
        try:
            staging.rename(target)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)  # another process won the race
