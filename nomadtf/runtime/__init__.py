"""`nomadtf task`: the runtime inside every allocation, one concern per module.

    loop.py        one event queue: watch events, signals, child exits, timers
    policy.py      pure decisions: who restarts on which event, budgets, exit classes, hang
    child.py       the TensorFlow process: start, stop, process group, parent death, reaping
    membership.py  index claim, rendezvous, watches, the health endpoint (Consul)
    supervisor.py  the task's life: reads events, asks the policy, acts
"""

from nomadtf.runtime.supervisor import run_task

__all__ = ["run_task"]
