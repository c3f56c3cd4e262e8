"""How `nomadtf run` shows a run while it follows it: a live table on a terminal,
timestamped lines (only on change) everywhere else."""

from __future__ import annotations

import sys
import time

from nomadtf.cli.common import stamp


def view_line(view) -> str:
    roles = " | ".join(
        f"{role}: {rv.running}/{rv.wanted} running, {rv.complete} done, {rv.failed} failed, {rv.restarts} restarts"
        for role, rv in view.roles.items()
    )
    step = f" | step {view.step}" if view.step is not None else ""
    metrics = "".join(f" {k}={v:.4g}" for k, v in sorted(view.metrics.items()))
    return f"[{view.elapsed:5.0f}s] {roles}{step}{metrics}"


class Display:
    """A live table on a terminal; timestamped lines (only on change) everywhere else."""

    def __init__(self) -> None:
        self.live = None
        self.last = ""
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.live import Live

            self.live = Live(console=Console(stderr=True), refresh_per_second=4, transient=True)
            self.live.start()

    def view(self, view) -> None:
        if self.live is not None:
            self.live.update(self._table(view))
            return
        line = view_line(view)
        key = line.split("]", 1)[1]
        if key != self.last:
            self.last = key
            stamp(line)

    def event(self, text: str) -> None:
        if self.live is not None:
            self.live.console.print(f"{time.strftime('%H:%M:%S')} {text}")
        else:
            stamp(text)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    @staticmethod
    def _table(view):
        from rich.table import Table

        table = Table(title=f"{view.job_id}  {view.elapsed:.0f}s  step {view.step if view.step is not None else '-'}")
        for column in ("role", "wanted", "running", "complete", "failed", "restarts"):
            table.add_column(column)
        for role, rv in view.roles.items():
            table.add_row(role, str(rv.wanted), str(rv.running), str(rv.complete), str(rv.failed), str(rv.restarts))
        if view.last_line:
            table.caption = f"chief: {view.last_line}"
        return table
