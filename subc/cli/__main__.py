"""``python -m subc.cli``."""

from . import run

run()
