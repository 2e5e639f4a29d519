"""PIL images shown the way E2B's template shows them (its startup script hooks PIL): saving one
to a path given as a string displays it, ``show()`` displays it; both give a PNG result. And
matplotlib is E2B's 3.10, whose ``boxplot`` still takes ``labels=``."""

from __future__ import annotations

import base64
import io

from e2b_code_interpreter import Sandbox
from e2b_code_interpreter.charts import BoxAndWhiskerChart
from PIL import Image

MAKE = (
    "import numpy\nfrom PIL import Image\n"
    "pixels = (numpy.random.rand(16, 12, 3) * 255).astype('uint8')\n"
    "image = Image.fromarray(pixels).convert('RGBA')\n"
)


def png_size(result) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    assert result.png, result.formats()
    return Image.open(io.BytesIO(base64.b64decode(result.png))).size


def test_saving_an_image_to_a_path_shows_it(sbx: Sandbox) -> None:
    execution = sbx.run_code(MAKE + "image.save('saved.png')\nprint('Image saved.')")
    assert execution.error is None, execution.error
    (result,) = execution.results
    assert png_size(result) == (12, 16) and not result.is_main_result
    assert execution.logs.stdout == ["Image saved.\n"]
    assert sbx.files.read("/home/user/saved.png", format="bytes")[:4] == b"\x89PNG"


def test_show_displays_instead_of_starting_a_viewer(sbx: Sandbox) -> None:
    execution = sbx.run_code(MAKE + "image.show()\nprint('Image shown.')")
    assert execution.error is None, execution.error
    (result,) = execution.results
    assert png_size(result) == (12, 16)


def test_saving_elsewhere_than_to_a_str_path_shows_nothing(sbx: Sandbox) -> None:
    # As on E2B: an in-memory encode (what displaying does itself) and a pathlib.Path do not.
    code = MAKE + (
        "import io, pathlib\nbuffer = io.BytesIO()\nimage.save(buffer, 'PNG')\n"
        "image.save(pathlib.Path('by_path.png'))\nlen(buffer.getvalue()) > 0"
    )
    execution = sbx.run_code(code)
    assert execution.error is None, execution.error
    assert [r.text for r in execution.results] == ["True"]


def test_an_image_as_the_last_expression(sbx: Sandbox) -> None:
    execution = sbx.run_code(MAKE + "image")
    (result,) = execution.results
    assert result.is_main_result and png_size(result) == (12, 16)


def test_a_jpeg_saved_shows_its_image(sbx: Sandbox) -> None:
    execution = sbx.run_code(MAKE + "image.convert('RGB').save('/tmp/saved.jpg', quality=80)")
    (result,) = execution.results
    assert result.jpeg and png_size(result) == (12, 16)


def test_boxplot_takes_labels(sbx: Sandbox) -> None:
    code = (
        "import matplotlib, matplotlib.pyplot as plt\n"
        "plt.boxplot([[1, 2, 3, 4, 5], [2, 3, 4, 5, 9]], labels=['low', 'high'])\n"
        "plt.show()\nmatplotlib.__version__"
    )
    execution = sbx.run_code(code)
    assert execution.error is None, execution.error
    figure, version = execution.results
    assert version.text.startswith("3.10.")
    assert isinstance(figure.chart, BoxAndWhiskerChart)
    assert [e.label for e in figure.chart.elements] == ["low", "high"]
