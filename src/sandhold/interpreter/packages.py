"""Every Python package of the ``code-interpreter-v1`` template, pinned, dependencies included.

The data stack follows E2B's own template (e2b-dev/code-interpreter, ``template/requirements.txt``):
its pins wherever it pins a package, so code written against E2B's sandbox meets the same versions
(matplotlib 3.10, whose ``boxplot`` still takes ``labels=``; numpy 1.26, pandas 2.2, scipy 1.13).
Not installed from that list: ``jupyter-server`` (the service drives kernels itself), ``gensim``,
``librosa``, ``numba``, ``soundfile``, ``spacy``, ``opencv-python`` and ``kaleido`` (hundreds of MB
between them; opencv-python needs the host's libGL, kaleido a Chrome, spaCy and NLTK's models a
download); a sandbox installs them with pip when a policy lets it reach an index.

The list is the full closure (resolved once for CPython 3.11 on x86-64/manylinux), so the build
installs with ``--no-deps`` from a local wheelhouse: no resolver run, no surprise upgrades, and a
rebuild needs no network. Changing anything here changes the template's build key, so the next
``ensure`` rebuilds it (downloading only the wheels the wheelhouse lacks). The template runs the
host's Python; where it has no wheel of a pin, ``FOR_PYTHON`` names the version it gets instead.
"""

from __future__ import annotations

# What agents reach for, plus the kernel stack and the in-sandbox server's own needs.
TOP_LEVEL: tuple[str, ...] = (
    # the interpreter service (same versions as the host project where they overlap)
    "starlette==1.10.0",
    "uvicorn==0.54.0",
    "h11==0.16.0",
    # Jupyter kernel stack (E2B's pins; jupyter_client is what its jupyter-server resolves to)
    "ipykernel==6.29.5",
    "ipython==9.2.0",
    "jupyter_client==8.10.0",
    "tornado==6.5.1",
    # structured chart data (MIME e2b/chart), the library E2B's own template uses: it asks for
    # the latest, and the latest that fits its numpy 1.26 is 0.0.4 (1.0 needs numpy 2)
    "e2b-charts==0.0.4",
    # data and plotting (E2B's pins)
    "numpy==1.26.4",
    "pandas==2.2.3",
    "scipy==1.13.1",
    "matplotlib==3.10.3",
    "seaborn==0.13.2",
    "scikit-learn==1.6.1",
    "scikit-image==0.25.2",
    "sympy==1.14.0",
    "joblib==1.5.0",
    "pytz==2025.2",
    "xarray==2025.4.0",
    "plotly==6.0.1",
    "bokeh==3.7.3",
    "imageio==2.37.0",
    "orjson==3.10.18",
    # text, HTTP, tests (E2B's pins)
    "requests==2.32.4",
    "urllib3==2.5.0",
    "aiohttp==3.12.14",
    "nltk==3.9.1",
    "textblob==0.19.0",
    "pytest==8.3.5",
    "tabulate==0.10.0",
    # documents and images (E2B's pins; xlsxwriter, python-pptx, pypdf, reportlab, lxml: ours)
    "pillow==11.3.0",
    "openpyxl==3.1.5",
    "xlrd==2.0.1",
    "xlsxwriter==3.3.1",
    "python-pptx==1.0.2",
    "python-docx==1.1.2",
    "pypdf==7.1.1",
    "reportlab==5.1.0",
    "beautifulsoup4==4.13.4",
    "lxml==6.1.3",
)

DEPENDENCIES: tuple[str, ...] = (
    "aiohappyeyeballs==2.7.1",
    "aiosignal==1.4.0",
    "annotated-types==0.8.0",
    "anyio==4.16.0",
    "asttokens==3.0.2",
    "attrs==26.1.0",
    "certifi==2026.10.19.post1",
    "charset-normalizer==3.5.3",
    "click==8.5.1",
    "comm==0.2.3",
    "contourpy==1.3.3",
    "cycler==0.12.1",
    "debugpy==1.8.22",
    "decorator==5.3.1",
    "et_xmlfile==2.0.0",
    "executing==2.3.0",
    "fonttools==4.68.0",
    "frozenlist==1.8.0",
    "idna==3.20",
    "iniconfig==2.3.1",
    "ipython_pygments_lexers==1.1.1",
    "jedi==0.20.1",
    "Jinja2==3.1.6",
    "jupyter_core==5.9.1",
    "kiwisolver==1.5.1",
    "lazy-loader==0.6",
    "MarkupSafe==3.0.4",
    "matplotlib-inline==0.2.2",
    "mpmath==1.3.0",
    "multidict==6.9.1",
    "narwhals==2.29.0",
    "nest-asyncio==1.6.0",
    "networkx==3.6.1",
    "packaging==26.4",
    "parso==0.8.7",
    "pexpect==4.9.0",
    "platformdirs==4.14.9",
    "pluggy==1.7.0",
    "prompt_toolkit==3.0.53",
    "propcache==0.5.4",
    "psutil==7.2.2",
    "ptyprocess==0.7.0",
    "pure_eval==0.2.4",
    "pydantic==2.14.4",
    "pydantic_core==2.50.5",
    "Pygments==2.21.0",
    "pyparsing==3.3.3",
    "python-dateutil==4.0.0",
    "PyYAML==6.0.4",
    "pyzmq==27.3.0",
    "regex==2026.11.19",
    "soupsieve==2.10",
    "stack-data==0.6.3",
    "threadpoolctl==3.8.0",
    "tifffile==2026.3.3",
    "tqdm==4.70.1",
    "traitlets==5.16.1",
    "typing-inspection==0.4.5",
    "typing_extensions==4.16.0",
    "tzdata==2026.6",
    "wcwidth==0.9.4",
    "xyzservices==2026.9.1",
    "yarl==1.25.1",
)

PACKAGES: tuple[str, ...] = TOP_LEVEL + DEPENDENCIES

# Debian 13's Python 3.13 has no wheel of numpy 1.26 or scipy 1.13: it gets the first scipy with
# its wheels and the newest numpy that scipy accepts (pandas, matplotlib and scikit-learn above
# take numpy 2 as well).
FOR_PYTHON: dict[str, dict[str, str]] = {"3.13": {"numpy": "2.2.6", "scipy": "1.14.1"}}


def for_python(version: str) -> tuple[str, ...]:
    """PACKAGES for the host's Python ``version`` (``sys.version``)."""
    minor = ".".join(version.split()[0].split(".")[:2])
    instead = FOR_PYTHON.get(minor, {})
    pins = (pin.partition("==") for pin in PACKAGES)
    return tuple(f"{n}=={instead[n]}" if n in instead else f"{n}=={v}" for n, _, v in pins)
