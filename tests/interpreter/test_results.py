"""Every result format of the SDK's Result, and structured chart data for each chart type."""

from __future__ import annotations

import base64

from e2b_code_interpreter import Sandbox
from e2b_code_interpreter.charts import (
    BarChart,
    BoxAndWhiskerChart,
    ChartType,
    LineChart,
    PieChart,
    ScatterChart,
    SuperChart,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def only(execution, **match):  # type: ignore[no-untyped-def]
    assert execution.error is None, execution.error
    assert len(execution.results) == 1, execution.results
    return execution.results[0]


def test_every_rich_format(sbx: Sandbox) -> None:
    code = r"""
import base64, io
from IPython.display import HTML, Markdown, SVG, Latex, JSON, Javascript, Image, display
from PIL import Image as PILImage

def image_bytes(fmt):
    buf = io.BytesIO()
    PILImage.new("RGB", (4, 3), (200, 10, 10)).save(buf, format=fmt)
    return buf.getvalue()

class Pdf:
    def _repr_pdf_(self):
        return b"%PDF-1.4 tiny"

display(HTML("<b>bold</b>"))
display(Markdown("# Title"))
display(SVG('<svg xmlns="http://www.w3.org/2000/svg" width="2" height="2"></svg>'))
display(Image(data=image_bytes("PNG"), format="png"))
display(Image(data=image_bytes("JPEG"), format="jpeg"))
display(Pdf())
display(Latex(r"$\alpha + \beta$"))
display(JSON({"answer": 42, "items": [1, 2]}))
display(Javascript("console.log('hi')"))
"""
    execution = sbx.run_code(code)
    assert execution.error is None, execution.error
    by_format = {}
    for r in execution.results:
        for f in r.formats():
            by_format.setdefault(f, r)
    assert "<b>bold</b>" in by_format["html"].html
    assert by_format["markdown"].markdown == "# Title"
    assert by_format["svg"].svg.startswith("<svg")
    assert base64.b64decode(by_format["png"].png).startswith(PNG_MAGIC)
    assert base64.b64decode(by_format["jpeg"].jpeg)[:2] == b"\xff\xd8"
    assert base64.b64decode(by_format["pdf"].pdf).startswith(b"%PDF")
    assert by_format["latex"].latex == r"$\alpha + \beta$"
    assert by_format["json"].json == {"answer": 42, "items": [1, 2]}
    assert by_format["javascript"].javascript == "console.log('hi')"
    assert all(not r.is_main_result for r in execution.results)


def test_text_result_strips_string_quotes(sbx: Sandbox) -> None:
    assert sbx.run_code("'plain string'").text == "plain string"
    assert sbx.run_code("[1, 'a']").text == "[1, 'a']"


def test_dataframe_gives_html_text_and_data(sbx: Sandbox) -> None:
    execution = sbx.run_code(
        "import pandas as pd\n"
        "pd.DataFrame({'city': ['Oslo', 'Lima'], 'temp': [4.5, None],"
        " 'day': pd.to_datetime(['2024-01-01', '2024-01-02'])})"
    )
    result = only(execution)
    assert result.is_main_result
    assert "<table" in result.html
    assert "Oslo" in result.text
    assert result.data == {
        "city": ["Oslo", "Lima"],
        "temp": [4.5, None],
        "day": ["2024-01-01T00:00:00.000", "2024-01-02T00:00:00.000"],
    }


def chart_of(sbx: Sandbox, code: str):  # type: ignore[no-untyped-def]
    execution = sbx.run_code("import matplotlib.pyplot as plt\nimport numpy as np\n" + code)
    result = only(execution)
    assert base64.b64decode(result.png).startswith(PNG_MAGIC)
    assert result.chart is not None, result.formats()
    return result.chart


def test_line_chart(sbx: Sandbox) -> None:
    chart = chart_of(
        sbx,
        "x = np.linspace(0, 2, 5)\n"
        "plt.plot(x, x * 2, label='double')\n"
        "plt.plot(x, x ** 2, label='square')\n"
        "plt.title('Growth'); plt.xlabel('Time (s)'); plt.ylabel('Value [m]')\n"
        "plt.legend(); plt.show()",
    )
    assert isinstance(chart, LineChart)
    assert chart.type == ChartType.LINE
    assert chart.title == "Growth"
    assert (chart.x_label, chart.x_unit) == ("Time (s)", "s")
    assert (chart.y_label, chart.y_unit) == ("Value [m]", "m")
    assert chart.x_scale == "linear" and chart.y_scale == "linear"
    assert chart.x_ticks and len(chart.x_ticks) == len(chart.x_tick_labels)
    assert [e.label for e in chart.elements] == ["double", "square"]
    assert chart.elements[0].points == [(0.0, 0.0), (0.5, 1.0), (1.0, 2.0), (1.5, 3.0), (2.0, 4.0)]
    assert chart.elements[1].points[-1] == (2.0, 4.0)


def test_scatter_chart_with_log_scale(sbx: Sandbox) -> None:
    chart = chart_of(
        sbx,
        "plt.scatter([1, 10, 100], [2, 3, 4], label='A')\n"
        "plt.scatter([5, 50], [1, 1], label='B')\n"
        "plt.xscale('log'); plt.title('Points'); plt.show()",
    )
    assert isinstance(chart, ScatterChart)
    assert chart.x_scale == "log"
    assert chart.y_scale == "linear"
    assert [e.label for e in chart.elements] == ["A", "B"]
    assert chart.elements[0].points == [(1.0, 2.0), (10.0, 3.0), (100.0, 4.0)]


def test_bar_chart(sbx: Sandbox) -> None:
    chart = chart_of(
        sbx,
        "plt.bar(['Q1', 'Q2', 'Q3'], [10, 25, 17], label='2024')\n"
        "plt.title('Revenue'); plt.xlabel('Quarter'); plt.ylabel('EUR (k)'); plt.show()",
    )
    assert isinstance(chart, BarChart)
    assert chart.title == "Revenue"
    assert chart.x_label == "Quarter" and chart.y_unit == "k"
    assert [(e.label, e.value, e.group) for e in chart.elements] == [
        ("Q1", 10.0, "2024"), ("Q2", 25.0, "2024"), ("Q3", 17.0, "2024"),
    ]  # fmt: skip


def test_pie_chart(sbx: Sandbox) -> None:
    chart = chart_of(
        sbx,
        "plt.pie([1, 1, 2], labels=['a', 'b', 'c']); plt.title('Share'); plt.show()",
    )
    assert isinstance(chart, PieChart)
    assert chart.title == "Share"
    assert [e.label for e in chart.elements] == ["a", "b", "c"]
    assert [round(e.angle) for e in chart.elements] == [90, 90, 180]
    assert all(e.radius == 1 for e in chart.elements)


def test_box_and_whisker_chart(sbx: Sandbox) -> None:
    chart = chart_of(
        sbx,
        "data = [[1, 2, 3, 4, 5], [2, 4, 6, 8, 40]]\n"
        "plt.boxplot(data, tick_labels=['low', 'high'])\n"
        "plt.title('Spread'); plt.ylabel('Score'); plt.show()",
    )
    assert isinstance(chart, BoxAndWhiskerChart)
    assert chart.title == "Spread"
    low, high = chart.elements
    assert (low.label, low.min, low.first_quartile, low.median, low.third_quartile, low.max) == (
        "low", 1, 2, 3, 4, 5,
    )  # fmt: skip
    assert high.label == "high" and high.median == 6
    assert high.outliers == [40]


def test_superchart_of_several_axes(sbx: Sandbox) -> None:
    chart = chart_of(
        sbx,
        "fig, (a, b) = plt.subplots(1, 2)\n"
        "a.plot([1, 2], [3, 4]); a.set_title('left')\n"
        "b.bar(['x', 'y'], [1, 2]); b.set_title('right')\n"
        "fig.suptitle('Both'); plt.show()",
    )
    assert isinstance(chart, SuperChart)
    assert chart.title == "Both"
    assert [type(c) for c in chart.elements] == [LineChart, BarChart]
    assert [c.title for c in chart.elements] == ["left", "right"]


def test_figure_object_as_last_expression(sbx: Sandbox) -> None:
    execution = sbx.run_code(
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(); ax.plot([0, 1], [1, 0]); ax.set_title('obj')\nfig"
    )
    assert execution.error is None
    charts = [r.chart for r in execution.results if r.chart is not None]
    assert charts and charts[0].title == "obj"
    assert all(r.png for r in execution.results)


def test_plot_without_show_is_displayed_at_end_of_cell(sbx: Sandbox) -> None:
    execution = sbx.run_code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.title('end')"
    )
    assert execution.error is None
    main = [r for r in execution.results if r.is_main_result]
    figures = [r for r in execution.results if r.png]
    assert main and main[0].text.startswith("Text(")  # the title() call's value
    assert len(figures) == 1 and figures[0].chart.title == "end"


def test_box_plot_with_patches_and_horizontal(sbx: Sandbox) -> None:
    chart = chart_of(
        sbx,
        "plt.boxplot([[3, 4, 5, 6, 7]], tick_labels=['only'], patch_artist=True,"
        " orientation='horizontal')\nplt.xlabel('Latency (ms)'); plt.show()",
    )
    assert isinstance(chart, BoxAndWhiskerChart)
    (box,) = chart.elements
    assert (box.label, box.min, box.median, box.max) == ("only", 3, 5, 7)
    assert chart.y_label == "Latency (ms)" and chart.y_unit == "ms"


def test_empty_figure_has_no_chart(sbx: Sandbox) -> None:
    execution = sbx.run_code("import matplotlib.pyplot as plt\nplt.figure(); plt.show()")
    assert execution.error is None
    assert all(r.chart is None for r in execution.results)
