"""``python -m sandhold.cli``: what the tests and benchmarks start servers with."""

from sandhold.cli import app

app()
