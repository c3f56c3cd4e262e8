"""`python -m nomadtf` is the same as the `nomadtf` console script (tasks use this form)."""

import signal

# Before anything is imported: a SIGHUP (a template re-render, `nomad alloc signal`) that
# arrives while the interpreter is still starting must not end the task with exit 129.
# The runtime installs its own handler once it runs (nomadtf.runtime.loop).
signal.signal(signal.SIGHUP, signal.SIG_IGN)

from nomadtf.cli import main  # noqa: E402 - after the signal disposition, on purpose

main()
