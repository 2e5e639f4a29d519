"""Building the ``code-interpreter-v1`` template: ``base`` plus a Jupyter/data/office Python stack.

Layout inside the sandbox:

* ``/opt/sandhold/python`` — the pinned packages of :mod:`sandhold.interpreter.packages`,
  installed with ``pip --target`` (on ``PYTHONPATH`` for every process of the sandbox);
* ``/opt/sandhold/interpreter`` — a copy of this package (``sandhold/interpreter``), which is
  what the agent starts as the code-interpreter service (:data:`SERVICE`);
* ``/home/user/.config/matplotlib`` — a pre-built font cache, so the first plot does not spend
  seconds scanning fonts.

Building is slow only once per machine: wheels are downloaded into a wheelhouse, and the
installed tree is kept as ``site-<hash>`` in the cache directory, owned by the mapped ids, so a
template rebuild is a hard-link copy. The template records a build key (packages, our code,
Python version, ``uid_base``); :func:`build_code_interpreter_template` returns at once when the
existing template has the same key.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sandhold.envd import INTERPRETER_PORT
from sandhold.errors import HostUnsupported, TemplateBuildFailed
from sandhold.interpreter.contexts import ENV_PATH, READY_PATH
from sandhold.interpreter.packages import for_python
from sandhold.runtime import staging
from sandhold.runtime.templates.rootfs_owners import shift_ownership
from sandhold.runtime.templates.store import (
    BASE_BIN,
    BUILD,
    DEFAULT_PATH,
    SANDBOX_USER_UID,
    Template,
    TemplateStore,
)

log = logging.getLogger(__name__)

TEMPLATE_NAME = "code-interpreter-v1"
PYTHON = "/usr/bin/python3"
SANDBOX_SITE = "/opt/sandhold/python"
SANDBOX_CODE = "/opt/sandhold/interpreter"
SANDBOX_MPLCONFIG = "/home/user/.config/matplotlib"
SERVICE_PORT = INTERPRETER_PORT

SANDBOX_HOME = "/home/user"  # the default cwd of contexts, as E2B's
SERVER_MODULE = "sandhold.interpreter.server"

# What the in-sandbox agent must start at boot and keep running, on top of the template's env:
# as root (HOME=/root), in /home/user, as E2B's template runs Jupyter and its kernels (its start
# command is `sudo .../start-up.sh`). The code copy comes first on PYTHONPATH; the server
# removes it again from the environment of the kernels and shells it starts.
SERVICE: dict[str, object] = {
    "name": "code-interpreter",
    "argv": [PYTHON, "-m", SERVER_MODULE, "--port", str(SERVICE_PORT), "--cwd", SANDBOX_HOME],
    "env": {"PYTHONPATH": f"{SANDBOX_CODE}:{SANDBOX_SITE}"},
    "user": "root",
    "cwd": SANDBOX_HOME,
    "port": SERVICE_PORT,
    "ready_path": READY_PATH,  # a warm template's checkpoint is taken once it answers
    "env_path": ENV_PATH,  # the sandbox's env, after a warm start (agent/supervisor.py)
}

# What root keeps in these sandboxes (inside their user namespace only: nothing of the host is
# owned by their uid range): E2B's root reads and writes `user`'s files, so cells do here too
# (an upload of the SDK's, the workspace, /home/user). Its sudo and commands as root keep them
# too; anything else (mount, ptrace, the agent) stays out of reach as for every sandbox's root.
ROOT_CAPS = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL"]

# Source files of this package that run inside the sandbox (template.py itself does not).
CODE_SUFFIXES = (".py", ".js", ".java")


def template_env() -> dict[str, str]:
    return {
        "PATH": f"{DEFAULT_PATH}:{SANDBOX_SITE}/bin:{BASE_BIN}",
        "LANG": "C.UTF-8",
        "PYTHONPATH": SANDBOX_SITE,
        # Scripts run with `python3 x.py` must not try to open a window; Jupyter kernels get
        # the inline backend from the server instead.
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": SANDBOX_MPLCONFIG,
        # ipykernel's bundled debugpy warns about frozen modules on every kernel start.
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    }


def default_cache_dir(store: TemplateStore) -> Path:
    return store.root.parent / "cache" / "interpreter"


def _code_files() -> list[Path]:
    here = Path(__file__).parent
    return sorted(p for p in here.iterdir() if p.suffix in CODE_SUFFIXES and p.is_file())


def _python_version() -> str:
    out = subprocess.run(
        [PYTHON, "-c", "import sys; print(sys.version)"], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise HostUnsupported(f"{PYTHON} does not run: {out.stderr.strip()}")
    return out.stdout.strip()


def pins() -> tuple[str, ...]:
    """The template's packages for the host's Python (packages.for_python)."""
    return for_python(_python_version())


def packages_key(uid_base: int) -> str:
    h = hashlib.sha256()
    version = _python_version()
    h.update(version.encode())
    h.update(f"uid_base={uid_base}".encode())
    for pin in for_python(version):
        h.update(pin.encode() + b"\n")
    return h.hexdigest()[:16]


def build_key(uid_base: int) -> str:
    h = hashlib.sha256(packages_key(uid_base).encode())
    h.update(json.dumps(template_env(), sort_keys=True).encode())
    h.update(json.dumps(SERVICE, sort_keys=True).encode())
    h.update(json.dumps(ROOT_CAPS).encode())
    for f in _code_files():
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


@contextmanager
def _flock(path: Path) -> Iterator[None]:
    """Serialize builds across processes (pytest-xdist workers build at the same time)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _pip(args: list[str], what: str) -> None:
    cmd = [PYTHON, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "is ignored" not in ln]
        raise TemplateBuildFailed(f"{what} failed ({proc.returncode}): " + " | ".join(lines[-8:]))


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _missing_wheels(wheelhouse: Path, pins: tuple[str, ...]) -> list[str]:
    have = set()
    for f in wheelhouse.glob("*.whl"):
        parts = f.name.split("-")
        if len(parts) >= 2:
            have.add((_norm(parts[0]), parts[1]))
    missing = []
    for pin in pins:
        name, _, version = pin.partition("==")
        if (_norm(name), version) not in have:
            missing.append(pin)
    return missing


def ensure_site_packages(cache_dir: Path, uid_base: int) -> Path:
    """The installed package tree for this package list, built once and then reused. Call it
    holding the cache's lock (``_flock(cache_dir / ".lock")``) until done with the tree: a
    build removes the trees it replaces (``prune_site_trees``)."""
    if shutil.which(PYTHON) is None:
        raise HostUnsupported(f"{PYTHON} is missing (apt-get install python3)")
    site = cache_dir / f"site-{packages_key(uid_base)}"
    if (site / ".complete").exists():
        return site
    if subprocess.run([PYTHON, "-m", "pip", "--version"], capture_output=True).returncode:
        raise HostUnsupported(f"pip for {PYTHON} is missing (apt-get install python3-pip)")
    wheelhouse = cache_dir / "wheels"
    wheelhouse.mkdir(parents=True, exist_ok=True)
    pinned = pins()
    missing = _missing_wheels(wheelhouse, pinned)
    if missing:
        t0 = time.monotonic()
        _pip(
            ["download", "--no-deps", "--only-binary=:all:", "-d", str(wheelhouse), *missing],
            "downloading wheels",
        )
        log.info("downloaded %d wheels in %.1f s", len(missing), time.monotonic() - t0)
    staging = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".site-"))
    try:
        t0 = time.monotonic()
        # --target disables pip's externally-managed check, so Debian's pip needs no
        # --break-system-packages here; --no-index keeps the install offline.
        _pip(
            ["install", "--no-deps", "--no-index", "--find-links", str(wheelhouse),
             "--target", str(staging / "t"), *pinned],
            "installing packages",
        )  # fmt: skip
        log.info("installed %d packages in %.1f s", len(pinned), time.monotonic() - t0)
        tree = staging / "t"
        # Readable by every sandbox user whatever our umask; writable by sandbox root only.
        subprocess.run(["chmod", "-R", "u+rwX,go+rX,go-w", str(tree)], check=True)
        shift_ownership(tree, uid_base)
        done = {"packages": list(pinned), "uid_base": uid_base}
        (tree / ".complete").write_text(json.dumps(done))
        shutil.rmtree(site, ignore_errors=True)
        tree.rename(site)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    prune_site_trees(cache_dir, site, uid_base)
    return site


def prune_site_trees(cache_dir: Path, keep: Path, uid_base: int) -> list[str]:
    """Remove the package trees ``keep`` replaces (this ``uid_base``'s, of other packages or
    another Python, or of before trees recorded their ``uid_base``) and what a build cut short
    left; trees of other ``uid_base`` values are other servers' and stay. Templates made of a
    removed tree keep their hard-linked copies. Returns the names removed."""
    gone = []
    for d in cache_dir.iterdir():
        if d == keep or not d.is_dir():
            continue
        if d.name.startswith(".site-"):  # a build holds the lock: this one's is over
            gone.append(d.name)
        elif d.name.startswith("site-"):
            try:
                owner = json.loads((d / ".complete").read_text()).get("uid_base", uid_base)
            except (OSError, ValueError):
                owner = uid_base  # never completed
            if owner == uid_base:
                gone.append(d.name)
    for name in gone:
        shutil.rmtree(cache_dir / name, ignore_errors=True)
        log.info("removed the package tree %s, replaced by %s", name, keep.name)
    return gone


def _copy_tree(src: Path, dst: Path) -> None:
    """Hard-link copy when possible (instant; the template is read-only below the overlay)."""
    proc = subprocess.run(["cp", "-al", str(src), str(dst)], capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(dst, ignore_errors=True)
        subprocess.run(["cp", "-a", str(src), str(dst)], check=True)


def _install_code(rootfs: Path) -> None:
    code_root = rootfs / SANDBOX_CODE.lstrip("/")
    pkg = code_root / "sandhold" / "interpreter"
    pkg.mkdir(parents=True)
    (code_root / "sandhold" / "__init__.py").write_text("")
    for f in _code_files():
        shutil.copy2(f, pkg / f.name)
    subprocess.run([PYTHON, "-m", "compileall", "-q", str(code_root)], check=False)
    subprocess.run(["chmod", "-R", "u+rwX,go+rX,go-w", str(code_root)], check=True)


def _font_cache(rootfs: Path, site: Path, uid_base: int) -> None:
    """Pre-build matplotlib's font list, rewritten to the paths seen inside the sandbox."""
    target = rootfs / SANDBOX_MPLCONFIG.lstrip("/")
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        env = {"PATH": DEFAULT_PATH, "PYTHONPATH": str(site), "MPLCONFIGDIR": tmp, "HOME": tmp}
        proc = subprocess.run(
            [PYTHON, "-c", "import matplotlib.font_manager"],
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise TemplateBuildFailed(f"matplotlib font cache: {proc.stderr.strip()[-500:]}")
        for f in Path(tmp).glob("fontlist-*.json"):
            text = f.read_text().replace(str(site), SANDBOX_SITE)
            (target / f.name).write_text(text)
    owner = uid_base + SANDBOX_USER_UID
    # .config and everything below it belong to `user`, like the rest of /home/user.
    for p in (target.parent, target, *target.iterdir()):
        os.lchown(p, owner, owner)


def _read_build_info(store: TemplateStore, name: str) -> dict[str, object]:
    try:
        return json.loads((store.root / name / "build.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def is_up_to_date(store: TemplateStore, name: str = TEMPLATE_NAME) -> bool:
    return (store.root / name / "template.json").exists() and _read_build_info(store, name).get(
        "key"
    ) == build_key(store.uid_base)


def build_code_interpreter_template(
    store: TemplateStore,
    name: str = TEMPLATE_NAME,
    *,
    cache_dir: Path | None = None,
    force: bool = False,
) -> Template:
    """Build (or return the up-to-date) code-interpreter template in ``store``."""
    cache_dir = cache_dir or default_cache_dir(store)
    with _flock(store.root / f".{name}.lock"):
        if not force and is_up_to_date(store, name):
            return store.get(name)
        t0 = time.monotonic()
        staging_root = staging.make(store.root, BUILD)  # swept if a crash cuts it short
        try:
            # A private store in the staging dir gives us the exact `base` skeleton without
            # exposing a half-built template in the real store.
            base = TemplateStore(staging_root, store.uid_base).build_base(name)
            rootfs = base.rootfs
            (rootfs / "opt" / "sandhold").mkdir(parents=True, exist_ok=True)
            with _flock(cache_dir / ".lock"):  # no build prunes the tree while it is read
                site = ensure_site_packages(cache_dir, store.uid_base)
                _copy_tree(site, rootfs / SANDBOX_SITE.lstrip("/"))
                _install_code(rootfs)
                shift_ownership(rootfs / "opt" / "sandhold", store.uid_base)
                _font_cache(rootfs, site, store.uid_base)
            # Like a bound workspace (the runtime gives it to `user`): code running as user
            # can write deliverables there even when no workspace is mounted.
            user_id = store.uid_base + SANDBOX_USER_UID
            os.lchown(rootfs / "workspace", user_id, user_id)
            tpl = Template(
                name=name,
                kind="host",
                rootfs=store.root / name / "rootfs",
                user="user",
                workdir=SANDBOX_HOME,
                env=template_env(),
                ro_binds=list(base.ro_binds),
                services=[SERVICE],
                created_at=time.time(),
                warm=True,
                root_caps=list(ROOT_CAPS),
            )
            staged = staging_root / name
            (staged / "template.json").write_text(json.dumps(tpl.to_json(), indent=2))
            info = {
                "key": build_key(store.uid_base),
                "packages": list(pins()),
                "built_at": time.time(),
                "build_seconds": round(time.monotonic() - t0, 1),
            }
            (staged / "build.json").write_text(json.dumps(info, indent=2))
            store.swap_in(staged, name)
        finally:
            shutil.rmtree(staging_root, ignore_errors=True)
        log.info("built template %s in %.1f s", name, time.monotonic() - t0)
        return store.get(name)
