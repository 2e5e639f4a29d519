#!/usr/bin/env bash
# Run the compatibility matrix (tests/compat/test_matrix.py) and write its table into
# docs/e2b.md, "Compatibility across SDK releases".
set -euo pipefail
cd "$(dirname "$0")/.."
SANDHOLD_WRITE_MATRIX=1 .venv/bin/pytest -q -p no:cacheprovider tests/compat/test_matrix.py
