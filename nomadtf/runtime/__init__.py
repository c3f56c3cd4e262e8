"""`nomadtf task`: the runtime inside every allocation, one concern per module.

    task.py           the entry, `run_task(role)`: log format, spec, Vault login, clients, exit codes
    alloc.py          pure: what Nomad tells the task about itself (NOMAD_* variables, the spec file)
    supervisor.py     the phase machine's loop: reads events, runs one step per phase, asks the policy
    gathering.py      its CLAIMING and RENDEZVOUS: an index taken, the cluster waited for, the child started
    following.py      its RUNNING: the job's state and settled cluster acted on, our child's exit decided
    recovering.py     its CHECKING and FENCED: a peer's change looked for, recovery in place, the fence
    childcare.py      the child started, restarted, stopped; the outcome kept and sent once recorded
    phase.py          pure: the phases, the retry delay, an exit code in words
    startup.py        what a task does once before the phase machine (job ended? budget, environment, session, script)
    loop.py           one event queue: watch events, signals, child exits, timers
    policy.py         pure decisions: who restarts on which event, budgets, exit classes, hang
    membership.py     who we are among our peers, and every Consul step of it: index claim, the
                      cluster, the generation, role counts, the watches
    recording.py      the writes a decision depends on, retried: our session, the recorded outcome,
                      a new incarnation (membership builds on it)
    watches.py        Consul blocking queries and the template's cluster file turned into loop events
    deadline.py       pure: time limits (recovery.deadline, how long a decision or a login is retried)
    budget.py         the allocation's restart budget, kept in the task directory across Nomad's restarts
    secretenv.py      the job's secrets read from Vault once, for the child's environment and files
    codeuser.py       who the code runs as (driver.code_user): its uid, its folders and secret files
    progresswatch.py  the child's progress file: hang detection, and progress published to Consul
    starter.py        how our child starts: command, environment, the job's interpreter, warm or cold
    launch.py         pure: the child's command line and environment (TF_CONFIG, GPUs, paths)
    child.py          the TensorFlow process: start, stop, process group, parent death, reaping
    warm.py           the child started during the rendezvous, so `import tensorflow` overlaps it
    jobenv.py         the job's own Python environment: reused or built, held while the task runs
    venvcache.py      the client's cache of job environments: locks, markers, builds with uv, gc
    oom.py            was our child killed for its memory: the cgroup's OOM counter, before and after
    versions.py       the Python and TensorFlow our child runs, read from its own interpreter
    archive.py        the run's archive: the code's stdout and stderr per attempt (a tee), the outcome record
    notify.py         job.json `notify`: the outcome record POSTed by the task that records it, retried
"""

__all__ = ["run_task"]


def __getattr__(name: str):
    """`run_task` loads the task runtime (py-consul, psutil) when it is asked for, so that a
    pure module of this package (policy, deadline, launch) loads without them."""
    if name == "run_task":
        from nomadtf.runtime.task import run_task

        return run_task
    raise AttributeError(f"module 'nomadtf.runtime' has no attribute {name!r}")
