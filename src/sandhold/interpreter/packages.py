"""Every Python package of the ``code-interpreter-v1`` template, pinned, dependencies included.

The list is the full closure (resolved once for CPython 3.11 on x86-64/manylinux), so the build
installs with ``--no-deps`` from a local wheelhouse: no resolver run, no surprise upgrades, and a
rebuild needs no network. Changing anything here changes the template's build key, so the next
``ensure`` rebuilds it.
"""

from __future__ import annotations

# What agents reach for, plus the kernel stack and the in-sandbox server's own needs.
TOP_LEVEL: tuple[str, ...] = (
    # the interpreter service (same versions as the host project where they overlap)
    "starlette==1.10.0",
    "uvicorn==0.54.0",
    "h11==0.16.0",
    # Jupyter kernel stack
    "ipykernel==7.4.0",
    "jupyter_client==8.10.0",
    "ipython==9.18.1",
    # structured chart data (MIME e2b/chart), the library E2B's own template uses
    "e2b-charts==1.0.0",
    # data and plotting
    "numpy==2.4.6",
    "pandas==3.1.1",
    "scipy==1.17.1",
    "matplotlib==3.11.2",
    "seaborn==0.13.2",
    "scikit-learn==1.9.1",
    "sympy==1.14.0",
    "tabulate==0.10.0",
    # documents and images
    "pillow==13.0.0",
    "openpyxl==3.1.5",
    "xlsxwriter==3.3.1",
    "python-pptx==1.0.2",
    "python-docx==1.2.0",
    "pypdf==7.1.1",
    "reportlab==5.1.0",
    "beautifulsoup4==4.15.0",
    "lxml==6.1.3",
)

DEPENDENCIES: tuple[str, ...] = (
    "annotated-types==0.8.0",
    "anyio==4.16.0",
    "asttokens==3.0.2",
    "charset-normalizer==3.5.3",
    "click==8.5.1",
    "cloudpickle==3.1.3",
    "comm==0.2.3",
    "contourpy==1.3.3",
    "cycler==0.12.1",
    "debugpy==1.8.22",
    "et_xmlfile==2.0.0",
    "executing==2.3.0",
    "fonttools==4.68.0",
    "idna==3.20",
    "ipython_pygments_lexers==1.1.1",
    "jedi==0.20.1",
    "joblib==1.6.0",
    "jupyter_core==5.9.1",
    "kiwisolver==1.5.1",
    "matplotlib-inline==0.2.2",
    "mpmath==1.3.0",
    "narwhals==2.29.0",
    "nest-asyncio2==1.7.4",
    "packaging==26.4",
    "parso==0.8.7",
    "pexpect==4.9.0",
    "platformdirs==4.14.8",
    "prompt_toolkit==3.0.53",
    "psutil==7.2.2",
    "ptyprocess==0.7.0",
    "pure_eval==0.2.4",
    "pydantic==2.14.4",
    "pydantic_core==2.50.5",
    "Pygments==2.21.0",
    "pyparsing==3.3.3",
    "python-dateutil==4.0.0",
    "pyzmq==27.3.0",
    "soupsieve==2.10",
    "stack-data==0.6.3",
    "threadpoolctl==3.8.0",
    "tornado==6.6.1",
    "traitlets==5.16.1",
    "typing-inspection==0.4.5",
    "typing_extensions==4.16.0",
    "tzdata==2026.6",
    "wcwidth==0.9.4",
)

PACKAGES: tuple[str, ...] = TOP_LEVEL + DEPENDENCIES
