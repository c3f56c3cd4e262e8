"""What every local stack offers, whichever it is.

Usage:
    progress: Progress = print
"""

from __future__ import annotations

from collections.abc import Callable

# How a long step reports what it does: one line at a time (the CLI stamps and prints it).
Progress = Callable[[str], None]
