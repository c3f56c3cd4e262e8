"""`python -m nomadtf` is the same as the `nomadtf` console script (tasks use this form)."""

from nomadtf.cli import main

main()
