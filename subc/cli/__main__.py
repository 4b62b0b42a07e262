"""``python -m subc.cli``."""

from . import main

main()
