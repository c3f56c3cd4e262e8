"""Every failure nomadtf reports to a user is one of these.

    NomadtfError                      exit code 1 unless a subclass says otherwise
    ├── SpecError                     job.json is wrong (exit 2); carries every problem found
    ├── RenderError                   a template could not be rendered (exit 2)
    ├── UnknownNomadVersion           the job's rendering depends on a Nomad version nobody said (exit 2)
    ├── PolicyError                   the operator's sharing policy is wrong (exit 2); every problem found
    ├── DevStackError                 the local Nomad + Consul + OpenBao stack
    │   ├── BinaryError               a server binary could not be found, verified or built
    │   └── PortInUseError            a port the stack needs belongs to something else
    ├── ServerError                   a real server answered with a failure
    │   ├── UnreachableError          nothing answers at the address (one line, no traceback)
    │   ├── NomadError                Nomad API failure (status code and message)
    │   ├── ConsulError               Consul API failure
    │   ├── VaultError                Vault/OpenBao failure (never carries a secret value)
    │   │   └── NoJwtAuthMethod       `acl apply`: no JWT auth method where Nomad logs tasks in
    │   └── AclConflict               `acl apply`: a policy of the job's name is another job's
    ├── TaskError                     the in-allocation supervisor could not continue
    │   ├── RendezvousTimeout         the cluster never became complete; lists who is missing
    │   └── CannotRecord              a task's failure that Consul cannot hold: exit 78, said on stderr
    └── JobFailed                     the run failed (exit 1); see nomadtf/job/outcome.py
        ├── JobNotFound               no such job in Nomad (never submitted, or collected: the archive may hold it)
        ├── NoAllocation              the run has no allocation for that role and index (never placed, or collected)
        ├── FollowTimeout             --timeout passed before the run ended; it goes on (exit 3)
        ├── QueueTimeout              --timeout passed while the run waited in the queue; removed (exit 3)
        ├── QueueInterrupted          Ctrl-C while queued: removed or left queued, as asked (exit 130)
        ├── JobStopped                stopped from outside: stop, purge, another run (exit 4)
        ├── JobTimedOut               the run passed its recovery.deadline (exit 5)
        └── JobLost                   every task ended and none recorded why (exit 6)

The entry points catch these: `nomadtf/cli/` prints `str(error)` and exits with
`error.exit_code`, `runtime/task.py` does the same for `nomadtf task`. Below them an error is
caught only where it is a decision (a watch that retries, `run` cleaning up what it began).
"""

from __future__ import annotations


class NomadtfError(Exception):
    """Root of every error nomadtf raises on purpose."""

    exit_code = 1


class SpecError(NomadtfError):
    """The options file is invalid. `problems` holds one line per problem, all of them."""

    exit_code = 2

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        count = len(self.problems)
        head = "job.json is invalid" if count == 1 else f"job.json has {count} problems"
        super().__init__(head + ":\n" + "\n".join(f"  - {p}" for p in self.problems))


class UsageError(NomadtfError):
    """The command line asks for something that cannot be: a malformed argument, or one
    that does not fit the job it names (`scale worker=0`, `--resume` of a first run). Like
    a bad job.json, a usage error (2); the message names the fix."""

    exit_code = 2


class RenderError(NomadtfError):
    exit_code = 2


class PolicyError(NomadtfError):
    """The admission controller's sharing policy (`admission policy set FILE`) is invalid;
    `problems` holds one line per problem, each naming its field."""

    exit_code = 2

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("the sharing policy is invalid:\n" + "\n".join(f"  - {p}" for p in self.problems))


class UnknownNomadVersion(NomadtfError):
    """Nomad's version could not be read and no setting names it, and the job renders
    differently per version (its tasks' Vault tokens, templates that read Consul): it is
    refused rather than rendered for a guess. The message names the settings that fix it."""

    exit_code = 2


class DevStackError(NomadtfError):
    pass


class BinaryError(DevStackError):
    pass


class PortInUseError(DevStackError):
    pass


class ServerError(NomadtfError):
    pass


class UnreachableError(ServerError):
    pass


class NomadError(ServerError):
    def __init__(self, message: str, status: int | None = None):
        self.status = status
        super().__init__(message)


class ConsulError(ServerError):
    pass


class VaultError(ServerError):
    pass


class NoJwtAuthMethod(VaultError):
    """`acl apply` for Nomad 1.7+: Vault has no JWT auth method at the mount Nomad's clients
    log tasks in at (the once-per-cluster step was not done); nothing is written."""


class AclConflict(ServerError):
    """A Consul or Vault policy of the job's name belongs to another job (`acl apply`)."""


class TaskError(NomadtfError):
    pass


class RendezvousTimeout(TaskError):
    def __init__(self, missing: list[str], waited_s: float):
        self.missing = missing
        super().__init__(
            f"cluster incomplete after {waited_s:.0f}s; still missing: {', '.join(missing)}"
        )


class CannotRecord(TaskError):
    """The task failed and cannot record it in the run's Consul state (Consul unreachable,
    or its Consul token not to be had): it exits 78 with the reason as its last stderr line,
    and `nomadtf run` reports that exit as the run's failure (outcome.py)."""

    exit_code = 78  # sysexits' EX_CONFIG: most often a wrong address or credential


class JobFailed(NomadtfError):
    exit_code = 1


class JobNotFound(JobFailed):
    """Nomad has no such job: never submitted, or purged and collected (`status` and `logs`
    then read the run's archive, client/archive.py)."""


class NoAllocation(JobFailed):
    """The run has no allocation for the role and index asked for: never placed, or
    collected by Nomad (`logs` then reads the run's archive)."""


class FollowTimeout(JobFailed):
    exit_code = 3


class QueueTimeout(JobFailed):
    """The run waited in the admission queue past --timeout; it was removed, nothing submitted."""

    exit_code = 3


class QueueInterrupted(JobFailed):
    """Ctrl-C while the run waited in the queue; the message says whether it was removed
    or left queued (`--on-interrupt`)."""

    exit_code = 130


class JobStopped(JobFailed):
    exit_code = 4


class JobTimedOut(JobFailed):
    exit_code = 5


class JobLost(JobFailed):
    exit_code = 6
