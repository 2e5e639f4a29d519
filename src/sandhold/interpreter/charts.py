"""Structured chart data (MIME ``e2b/chart``) for matplotlib figures, inside the kernel.

``e2b_charts`` (the library E2B's template uses) extracts each axes. Added here:

* every value is made JSON-safe (numpy scalars, Decimals and enums become plain numbers and
  strings, NaN becomes null), so a figure never breaks the kernel's message serialization;
* box plots are recognised from their geometry, however drawn: the library classifies the
  default ``patch_artist=False`` boxes (lines) as a line chart, and fails on a box whose
  whisker has zero length.
"""

from __future__ import annotations

import enum
import math
import re
import warnings
from decimal import Decimal
from typing import Any

UNIT_RE = re.compile(r"\s\((.*?)\)|\[(.*?)\]")


def json_safe(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return json_safe(value.value)
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float | Decimal):
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        try:
            return json_safe(value.item())
        except (TypeError, ValueError):
            pass
    return str(value)


def _unit(label: str | None) -> str | None:
    if not label:
        return None
    m = UNIT_RE.search(label)
    return (m.group(1) or m.group(2)) if m else None


def _segments(ax: Any, transpose: bool) -> list[tuple[list[float], list[float], Any]]:
    out = []
    for line in ax.get_lines():
        try:
            xs = [float(v) for v in line.get_xdata()]
            ys = [float(v) for v in line.get_ydata()]
        except (TypeError, ValueError):
            return []
        out.append((ys, xs, line) if transpose else (xs, ys, line))
    return out


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def _rectangles(ax: Any, transpose: bool) -> list[tuple[float, float, float, float]] | None:
    """Boxes drawn as closed 5-point lines or (``patch_artist=True``) as path patches."""
    shapes = [(xs, ys) for xs, ys, _ in _segments(ax, transpose) if len(xs) == 5]
    for patch in ax.patches:
        if type(patch).__name__ != "PathPatch":
            return None  # bars, wedges...: not a box plot
        verts = patch.get_path().vertices
        xs, ys = [float(v) for v in verts[:, 0]], [float(v) for v in verts[:, 1]]
        shapes.append((ys, xs) if transpose else (xs, ys))
    rects = []
    for xs, ys in shapes:
        ux, uy = {round(v, 9) for v in xs}, {round(v, 9) for v in ys}
        if len(ux) == 2 and len(uy) == 2 and _close(xs[0], xs[-1]) and _close(ys[0], ys[-1]):
            rects.append((min(xs), max(xs), min(ys), max(ys)))
    return rects


def _boxes(ax: Any, transpose: bool) -> list[dict[str, Any]] | None:
    """Box statistics when every box of ``ax`` is a rectangle with a median line across it and
    whiskers along the value axis (y, or x when ``transpose``)."""
    rects = _rectangles(ax, transpose)
    if not rects:
        return None
    segs = _segments(ax, transpose)
    boxes = []
    for left, right, q1, q3 in rects:
        center = (left + right) / 2
        median = low = high = None
        outliers: list[float] = []
        for xs, ys, line in segs:
            if len(xs) == 2 and _close(ys[0], ys[1]):
                # The median spans the whole box; caps are narrower.
                full = _close(min(xs), left) and _close(max(xs), right)
                if full and q1 - 1e-9 <= ys[0] <= q3 + 1e-9 and median is None:
                    median = ys[0]
            elif len(xs) == 2 and _close(xs[0], xs[1]) and _close(xs[0], center):
                if _close(max(ys), q1):
                    low = min(ys)
                elif _close(min(ys), q3):
                    high = max(ys)
            elif line.get_linestyle() in ("None", "none", "", " ") and xs:
                outliers += [y for x, y in zip(xs, ys, strict=False) if _close(x, center)]
        if median is None:
            return None
        boxes.append(
            {
                "center": center,
                "min": q1 if low is None else low,
                "first_quartile": q1,
                "median": median,
                "third_quartile": q3,
                "max": q3 if high is None else high,
                "outliers": outliers,
            }
        )
    return boxes


def boxplot(ax: Any) -> dict[str, Any] | None:
    """A ``box_and_whisker`` chart when ``ax`` holds a box plot (and nothing else)."""
    if ax.collections:
        return None
    for transpose in (False, True):
        boxes = _boxes(ax, transpose)
        if boxes:
            break
    else:
        return None
    if transpose:
        ticks, labels = ax.get_yticks(), ax.get_yticklabels()
        cat_label, value_label = ax.get_ylabel(), ax.get_xlabel()
    else:
        ticks, labels = ax.get_xticks(), ax.get_xticklabels()
        cat_label, value_label = ax.get_xlabel(), ax.get_ylabel()
    names = {round(float(t), 6): lb.get_text() for t, lb in zip(ticks, labels, strict=False)}
    elements = []
    for i, box in enumerate(sorted(boxes, key=lambda b: b["center"])):
        center = box.pop("center")
        elements.append({"label": names.get(round(center, 6)) or str(i + 1), **box})
    return json_safe(
        {
            "type": "box_and_whisker",
            "title": ax.get_title() or None,
            "x_label": cat_label or None,
            "y_label": value_label or None,
            "x_unit": _unit(cat_label),
            "y_unit": _unit(value_label),
            "elements": elements,
        }
    )


def axes_chart(ax: Any) -> dict[str, Any]:
    box = boxplot(ax)
    if box is not None:
        return box
    from e2b_charts.main import get_chart_from_ax

    return json_safe(get_chart_from_ax(ax).model_dump())  # type: ignore[no-any-return]


def figure_to_chart(figure: Any) -> dict[str, Any] | None:
    axes = figure.get_axes()
    if not axes or not any(ax.has_data() for ax in axes):
        return None  # an empty figure is not a chart
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydantic warns about numpy values; json_safe fixes them
        if len(axes) == 1:
            return axes_chart(axes[0])
        return {
            "type": "superchart",
            "title": figure.get_suptitle() or None,
            "elements": [axes_chart(ax) for ax in axes],
        }
