"""`nomadtf task`: the runtime inside every allocation, one concern per module.

    loop.py        one event queue: watch events, signals, child exits, timers
    policy.py      pure decisions: who restarts on which event, budgets, exit classes, hang
    launch.py      pure: the child's command line and environment (TF_CONFIG, GPUs, paths)
    child.py       the TensorFlow process: start, stop, process group, parent death, reaping
    warm.py        the child started during the rendezvous, so `import tensorflow` overlaps it
    jobenv.py      the job's own Python environment: reused or built, held while the task runs
    membership.py  index claim, rendezvous, the watches (Consul and the template file)
    supervisor.py  the task's life: reads events, asks the policy, acts
"""

import logging
import sys

from nomadtf.runtime.supervisor import run_task

__all__ = ["main", "run_task"]


def main(role: str) -> int:
    """`nomadtf task --role ROLE`: log setup, then the task's whole life; its exit code."""
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        # Milliseconds: how fast a peer's move is seen and acted on is read from these lines.
        format=f"%(asctime)s.%(msecs)03d nomadtf task {role}: %(message)s",
        datefmt="%H:%M:%S",
    )
    return run_task(role)
