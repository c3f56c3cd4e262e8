"""The task supervisor's vocabulary: its phases (see supervisor.py's table), how soon a
step that failed on a Consul error runs again, and a child's exit in words. Pure."""

from __future__ import annotations

import enum
import signal

RETRY_S = 1.0  # a step that failed on a Consul error is tried again this soon


class Phase(enum.Enum):
    CLAIMING = "claiming"
    RENDEZVOUS = "rendezvous"
    RUNNING = "running"
    CHECKING = "checking"
    FENCED = "fenced"



def describe_code(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit {code}"
