"""Runs inside every Python kernel at start (``runpy.run_path``, so nothing lands in the user's
namespace). It adds the E2B display formats and a helper module for the server.

* ``e2b/chart``: matplotlib figures -> structured chart data (via the ``e2b_charts`` library),
  next to the PNG the inline backend already produces.
* ``e2b/data``: pandas DataFrames -> ``{column: [values...]}``.
* ``_sandhold`` (in ``sys.modules``): ``push_env``/``pop_env`` for per-execution env vars.
* PIL images shown the way E2B's template shows them: saving one to a path given as a string
  (``img.save("out.png")``) also displays it, and ``img.show()`` displays it instead of starting
  an image viewer (there is no screen): either way an image result (PNG) of the execution.

Everything is registered by type *name*, or patched when its module is first imported, so
neither pandas, matplotlib nor PIL is imported until the user imports them: a kernel starts as
fast as a bare one.
"""

from __future__ import annotations

import functools
import importlib.machinery
import json
import math
import os
import sys
import types
from collections.abc import Sequence
from typing import Any

# run_path sets __file__; charts.py, next to this file, is loaded on the first figure.
_HERE = os.path.dirname(os.path.abspath(__file__))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        try:
            return _json_safe(value.item())
        except (TypeError, ValueError):
            return str(value)
    return value


_charts: dict[str, Any] = {}


def _figure_to_chart(figure: Any) -> dict[str, Any] | None:
    # A formatter that raises prints a traceback into the user's output; a chart we cannot
    # describe is simply left out (the PNG is still there).
    try:
        if not _charts:
            import runpy

            _charts.update(runpy.run_path(os.path.join(_HERE, "charts.py")))
        return _charts["figure_to_chart"](figure)  # type: ignore[no-any-return]
    except Exception:
        return None


def _dataframe_to_data(frame: Any) -> dict[str, Any] | None:
    try:
        split = json.loads(frame.to_json(orient="split", date_format="iso", default_handler=str))
        columns = [str(c) for c in split["columns"]]
        return {c: [row[i] for row in split["data"]] for i, c in enumerate(columns)}
    except Exception:
        return None


def _install_formatters() -> None:
    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    shell = get_ipython()
    if shell is None:
        return

    class ChartFormatter(BaseFormatter):
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict,)

        def __call__(self, obj: Any) -> Any:
            # Not registered by type: the inline backend pops every formatter's Figure entry
            # when it (re)configures itself.
            figure_module = sys.modules.get("matplotlib.figure")
            if figure_module is not None and isinstance(obj, figure_module.Figure):
                return _figure_to_chart(obj)
            return super().__call__(obj)

    class DataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict,)

    display = shell.display_formatter
    chart = ChartFormatter(parent=display)
    data = DataFormatter(parent=display)
    for module in ("pandas", "pandas.core.frame"):
        data.for_type_by_name(module, "DataFrame", _dataframe_to_data)
    display.formatters[chart.format_type] = chart
    display.formatters[data.format_type] = data
    if display.active_types:
        display.active_types = [*display.active_types, "e2b/chart", "e2b/data"]


def _install_helpers() -> None:
    helpers = types.ModuleType("_sandhold", "Helpers the code-interpreter server calls.")
    saved: list[dict[str, str | None]] = []

    def push_env(values: dict[str, str]) -> None:
        saved.append({k: os.environ.get(k) for k in values})
        os.environ.update(values)

    def pop_env() -> None:
        if not saved:
            return
        for key, old in saved.pop().items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old

    helpers.push_env = push_env  # type: ignore[attr-defined]
    helpers.pop_env = pop_env  # type: ignore[attr-defined]
    sys.modules["_sandhold"] = helpers


def _display(obj: Any) -> None:
    from IPython.display import display

    display(obj)


def _patch_pil(image_module: Any) -> None:
    """``Image.save`` to a str path displays the image first, ``Image.show`` only displays it."""
    image_class = image_module.Image
    if getattr(image_class.save, "sandhold_shows", False):
        return
    save = image_class.save

    @functools.wraps(save)
    def save_and_show(self: Any, fp: Any, *args: Any, **kwargs: Any) -> Any:
        # Only a path as a str, as on E2B: the display itself saves to a BytesIO (no loop),
        # and so does code that encodes an image in memory.
        if isinstance(fp, str):
            _display(self)
        return save(self, fp, *args, **kwargs)

    def show(self: Any, title: str | None = None, **options: Any) -> None:
        _display(self)

    save_and_show.sandhold_shows = True  # type: ignore[attr-defined]
    image_class.save = save_and_show
    image_class.show = show


class _PatchOnImport:
    """A meta-path finder that patches ``PIL.Image`` right after its first import."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if name != "PIL.Image":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return None  # the usual import, unpatched
        run = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            run(module)
            try:
                _patch_pil(module)
            except Exception:  # an unexpected Pillow: images are simply not shown
                pass

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _install_image_display() -> None:
    if "PIL.Image" in sys.modules:
        _patch_pil(sys.modules["PIL.Image"])
    else:
        sys.meta_path.insert(0, _PatchOnImport())  # type: ignore[arg-type]


_install_formatters()
_install_helpers()
_install_image_display()
