"""The code-interpreter template as built on disk."""

from __future__ import annotations

import json
import os
import re

from e2b_code_interpreter import Sandbox

from sandhold.config import Settings
from sandhold.interpreter.packages import PACKAGES, for_python
from sandhold.interpreter.template import (
    SANDBOX_CODE,
    SANDBOX_SITE,
    SERVICE,
    TEMPLATE_NAME,
    build_code_interpreter_template,
    is_up_to_date,
    pins,
    prune_site_trees,
)
from sandhold.runtime.templates.store import TemplateStore
from tests.support.interpreter import CACHE_DIR, InterpreterServer


def store_of(interp: InterpreterServer) -> TemplateStore:
    return TemplateStore(interp.data_dir / "templates", Settings(data_dir=interp.data_dir).uid_base)


def test_every_package_is_pinned() -> None:
    names = [p.partition("==")[0].lower() for p in pins()]
    assert all("==" in p for p in pins())
    assert len(names) == len(set(names))


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# Modules a cell imports -> the distribution pinned for them (E2B's pins: packages.py).
IMPORTS = {"numpy": "numpy", "pandas": "pandas", "scipy": "scipy", "matplotlib": "matplotlib",
           "seaborn": "seaborn", "sklearn": "scikit-learn", "skimage": "scikit-image",
           "sympy": "sympy", "PIL": "pillow", "IPython": "ipython", "ipykernel": "ipykernel",
           "plotly": "plotly", "bokeh": "bokeh", "xarray": "xarray", "requests": "requests",
           "urllib3": "urllib3", "aiohttp": "aiohttp", "nltk": "nltk", "joblib": "joblib",
           "openpyxl": "openpyxl", "bs4": "beautifulsoup4", "docx": "python-docx"}  # fmt: skip


def test_the_sandbox_runs_the_pinned_versions(sbx: Sandbox) -> None:
    pinned = {_norm(n): v for n, _, v in (p.partition("==") for p in pins())}
    code = (
        f"import importlib, importlib.metadata as md, json\nsite = [{SANDBOX_SITE!r}]\n"
        "installed = {d.metadata['Name']: d.version for d in md.distributions(path=site)}\n"
        f"imported = {{m: importlib.import_module(m).__version__ for m in {sorted(IMPORTS)!r}}}\n"
        "print(json.dumps([installed, imported]))"
    )
    execution = sbx.run_code(code)
    assert execution.error is None, execution.error
    installed, imported = json.loads("".join(execution.logs.stdout))
    assert {_norm(n): v for n, v in installed.items()} == pinned
    assert imported == {m: pinned[dist] for m, dist in IMPORTS.items()}
    assert pinned["matplotlib"].startswith("3.10.")  # boxplot(labels=...), as on E2B


def test_template_layout_and_env(interp: InterpreterServer) -> None:
    store = store_of(interp)
    tpl = store.get(TEMPLATE_NAME)
    assert tpl.env["PYTHONPATH"] == SANDBOX_SITE
    assert tpl.env["MPLBACKEND"] == "Agg"
    assert ("/usr", "/usr") in tpl.ro_binds
    root = tpl.rootfs
    site = root / SANDBOX_SITE.lstrip("/")
    assert (site / "ipykernel").is_dir() and (site / "e2b_charts").is_dir()
    code = root / SANDBOX_CODE.lstrip("/") / "sandhold" / "interpreter"
    assert (code / "server.py").is_file() and (code / "js_runner.js").is_file()
    uid_base = store.uid_base
    # Sandbox root owns the packages; `user` owns its home and /workspace.
    assert os.lstat(site / "numpy").st_uid == uid_base
    assert os.lstat(root / "home/user/.config/matplotlib").st_uid == uid_base + 1000
    assert list((root / "home/user/.config/matplotlib").glob("fontlist-*.json"))
    assert os.lstat(root / "workspace").st_uid == uid_base + 1000
    assert store.get(TEMPLATE_NAME).services == [json.loads(json.dumps(SERVICE))]


def test_fontlist_points_inside_the_sandbox(interp: InterpreterServer) -> None:
    root = store_of(interp).get(TEMPLATE_NAME).rootfs
    (fontlist,) = (root / "home/user/.config/matplotlib").glob("fontlist-*.json")
    text = fontlist.read_text()
    # matplotlib's own fonts are stored relative to its data dir; nothing may point at a host
    # path that does not exist inside the sandbox.
    assert str(CACHE_DIR) not in text and str(interp.data_dir) not in text
    assert '"fname"' in text


def test_rebuild_is_skipped_when_up_to_date(interp: InterpreterServer) -> None:
    store = store_of(interp)
    assert is_up_to_date(store)
    before = store.get(TEMPLATE_NAME).created_at
    build_code_interpreter_template(store, cache_dir=CACHE_DIR)
    assert store.get(TEMPLATE_NAME).created_at == before


def test_rebuild_from_cache_is_fast_and_atomic(interp: InterpreterServer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = TemplateStore(tmp_path / "templates", store_of(interp).uid_base)
    trees = sorted(CACHE_DIR.glob("site-*"))
    tpl = build_code_interpreter_template(store, name="ci-copy", cache_dir=CACHE_DIR)
    assert [t.name for t in store.list()] == ["ci-copy"]
    assert tpl.rootfs == store.root / "ci-copy" / "rootfs"
    # From the cache: no new package tree, and the template's files are its hard links.
    assert sorted(CACHE_DIR.glob("site-*")) == trees
    copied = tpl.rootfs / SANDBOX_SITE.lstrip("/") / "numpy" / "__init__.py"
    assert any(copied.stat().st_ino == (t / "numpy" / "__init__.py").stat().st_ino for t in trees)
    # Forced rebuild swaps the directory in one rename; no staging debris is left visible.
    build_code_interpreter_template(store, name="ci-copy", cache_dir=CACHE_DIR, force=True)
    assert [t.name for t in store.list()] == ["ci-copy"]
    assert not [p for p in store.root.iterdir() if p.name.startswith((".build-", ".old-"))]


def test_a_new_package_tree_replaces_the_old_ones_of_its_uid_base_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    def tree(name: str, complete: dict[str, object] | None) -> None:
        (tmp_path / name / "numpy").mkdir(parents=True)
        if complete is not None:
            (tmp_path / name / ".complete").write_text(json.dumps(complete))

    tree("site-new", {"packages": ["a==2"], "uid_base": 100000})
    tree("site-old", {"packages": ["a==1"], "uid_base": 100000})  # replaced
    tree("site-legacy", {"packages": ["a==1"]})  # from before trees said their uid_base
    tree("site-torn", None)  # never completed
    tree(".site-x1y2", None)  # a build cut short
    tree("site-theirs", {"packages": ["a==1"], "uid_base": 200000})  # another server's
    (tmp_path / "wheels").mkdir()
    gone = prune_site_trees(tmp_path, tmp_path / "site-new", 100000)
    assert sorted(gone) == [".site-x1y2", "site-legacy", "site-old", "site-torn"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site-new", "site-theirs", "wheels"]
    assert (tmp_path / "site-new" / "numpy").is_dir()


def test_a_python_without_wheels_of_a_pin_gets_the_version_named_for_it() -> None:
    assert for_python("3.11.2 (main, Apr 28 2025, 14:11:48) [GCC 12.2.0]") == PACKAGES
    on_13 = dict(p.partition("==")[::2] for p in for_python("3.13.5 (main) [GCC 14.2.0]"))
    assert (on_13["numpy"], on_13["scipy"]) == ("2.2.6", "1.14.1")
    assert len(on_13) == len(PACKAGES)
