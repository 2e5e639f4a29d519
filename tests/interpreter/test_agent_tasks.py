"""What agents actually ask for: office files and charts built in the sandbox, then opened on
the host with the same libraries to check them."""

from __future__ import annotations

import io

# The dev extras (installed by `make test`) hold these: a missing one is a broken test
# environment, which fails here rather than skipping the module.
import openpyxl
import pptx
from e2b_code_interpreter import Sandbox
from PIL import Image as PIL_Image

from sandhold.interpreter.template import pins

SALES_CSV = """region,month,units,price
North,2024-01,120,9.5
North,2024-02,135,9.5
South,2024-01,80,11.0
South,2024-02,95,11.0
West,2024-01,60,10.0
West,2024-02,75,10.0
"""


def test_xlsx_report_with_formulas_and_chart(sbx: Sandbox) -> None:
    sbx.files.write("/workspace/sales.csv", SALES_CSV)
    code = r"""
import pandas as pd
from openpyxl import Workbook
from openpyxl.chart import BarChart, Reference

df = pd.read_csv("/workspace/sales.csv")
totals = df.assign(revenue=df.units * df.price).groupby("region", as_index=False)[["units"]].sum()
prices = df.groupby("region")["price"].first()

wb = Workbook()
ws = wb.active
ws.title = "Summary"
ws.append(["Region", "Units", "Price", "Revenue"])
for i, row in enumerate(totals.itertuples(index=False), start=2):
    ws.append([row.region, int(row.units), float(prices[row.region]), f"=B{i}*C{i}"])
last = ws.max_row
ws.append(["Total", f"=SUM(B2:B{last})", None, f"=SUM(D2:D{last})"])

chart = BarChart()
chart.title = "Revenue by region"
chart.add_data(Reference(ws, min_col=4, min_row=1, max_row=last), titles_from_data=True)
chart.set_categories(Reference(ws, min_col=1, min_row=2, max_row=last))
ws.add_chart(chart, "F2")
wb.save("/workspace/report.xlsx")
print(last)
"""
    execution = sbx.run_code(code, timeout=120)
    assert execution.error is None, execution.error
    assert execution.logs.stdout == ["4\n"]

    data = sbx.files.read("/workspace/report.xlsx", format="bytes")
    wb = openpyxl.load_workbook(io.BytesIO(bytes(data)))
    ws = wb["Summary"]
    rows = [[c.value for c in r] for r in ws.iter_rows(min_row=1, max_row=5, max_col=4)]
    assert rows == [
        ["Region", "Units", "Price", "Revenue"],
        ["North", 255, 9.5, "=B2*C2"],
        ["South", 175, 11.0, "=B3*C3"],
        ["West", 135, 10.0, "=B4*C4"],
        ["Total", "=SUM(B2:B4)", None, "=SUM(D2:D4)"],
    ]
    assert len(ws._charts) == 1
    assert ws._charts[0].title is not None


def test_three_slide_pptx(sbx: Sandbox) -> None:
    code = r"""
from pptx import Presentation
from pptx.util import Inches

prs = Presentation()
title = prs.slides.add_slide(prs.slide_layouts[0])
title.shapes.title.text = "Quarterly review"
title.placeholders[1].text = "Prepared in a sandbox"

bullets = prs.slides.add_slide(prs.slide_layouts[1])
bullets.shapes.title.text = "Highlights"
body = bullets.placeholders[1].text_frame
body.text = "Revenue up 12%"
body.add_paragraph().text = "Two new regions"

table_slide = prs.slides.add_slide(prs.slide_layouts[5])
table_slide.shapes.title.text = "Numbers"
table = table_slide.shapes.add_table(3, 2, Inches(1), Inches(2), Inches(6), Inches(1.5)).table
for r, (k, v) in enumerate([("Region", "Units"), ("North", "255"), ("South", "175")]):
    table.cell(r, 0).text, table.cell(r, 1).text = k, v
prs.save("/home/user/review.pptx")
"""
    execution = sbx.run_code(code, timeout=120)
    assert execution.error is None, execution.error
    data = sbx.files.read("/home/user/review.pptx", format="bytes")
    prs = pptx.Presentation(io.BytesIO(bytes(data)))
    slides = list(prs.slides)
    assert len(slides) == 3
    assert [s.shapes.title.text for s in slides] == ["Quarterly review", "Highlights", "Numbers"]
    texts = [p.text for p in slides[1].placeholders[1].text_frame.paragraphs]
    assert texts == ["Revenue up 12%", "Two new regions"]
    tables = [sh for sh in slides[2].shapes if sh.has_table]
    assert tables[0].table.cell(1, 1).text == "255"


def test_matplotlib_chart_rendered_to_file_and_shown(sbx: Sandbox) -> None:
    code = r"""
import matplotlib.pyplot as plt
import pandas as pd
df = pd.read_csv("/workspace/sales.csv")
pivot = df.pivot_table(index="month", columns="region", values="units", aggfunc="sum")
ax = pivot.plot(kind="line", marker="o", title="Units per month")
ax.set_ylabel("Units")
plt.savefig("/workspace/units.png", dpi=80)
plt.show()
"""
    sbx.files.write("/workspace/sales.csv", SALES_CSV)
    execution = sbx.run_code(code, timeout=120)
    assert execution.error is None, execution.error
    charts = [r.chart for r in execution.results if r.chart is not None]
    assert len(charts) == 1
    chart = charts[0]
    assert chart.title == "Units per month" and chart.y_label == "Units"
    assert sorted(e.label for e in chart.elements) == ["North", "South", "West"]

    png = sbx.files.read("/workspace/units.png", format="bytes")
    image = PIL_Image.open(io.BytesIO(bytes(png)))
    assert image.format == "PNG" and image.size == (512, 384)  # 6.4 x 4.8 in at 80 dpi


def test_scripts_outside_the_kernel_see_the_stack(sbx: Sandbox) -> None:
    # commands.run is a plain shell: the template's PYTHONPATH and Agg backend apply there too.
    out = sbx.commands.run(
        "python3 -c 'import numpy, pandas, scipy, sklearn, matplotlib.pyplot as plt, docx, "
        "pptx, openpyxl, xlsxwriter, reportlab, pypdf, sympy, seaborn; "
        'plt.plot([1]); plt.savefig("/tmp/x.png"); print(numpy.__version__)\''
    )
    assert out.exit_code == 0, out.stderr
    assert f"numpy=={out.stdout.strip()}" in pins()
