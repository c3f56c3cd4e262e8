"""What `nomadtf run` says about a failed task: which one, its exit code and reason, the
traceback or last meaningful lines of its stderr, and what to do. Pure: the follower
passes the allocations, the recorded state and the stderr it read.

A task's stderr is mostly TensorFlow's and absl's start-up notices (oneDNN, CPU
instructions, CUDA libraries not found, `kernel_and_device.cc` lines) around nomadtf's own
log; `meaningful_lines` drops the notices and keeps the last traceback, or the last lines
when there is none.

Usage:
    alloc = failing_alloc(allocs, recorded="failed: chief[0] exited 1, a permanent exit code")
    text = failure_text("digits", "chief[0] exited 1, ...", FailedTask.of(alloc, stderr))
    lines = side_role_warning("evaluator", 0, 1, stderr)   # training goes on
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nomadtf import roles
from nomadtf.job.answers import Allocation
from nomadtf.job.outcome import failed_slot, latest_allocs

STDERR_LINES = 15  # at most this many lines of a task's stderr in a report

# TensorFlow's C++ log, in its two formats: "2024-01-15 10:23:45.123456: I tensorflow/...cc:94] ..."
# and absl's "I0000 00:00:1796345174.621029   23688 port.cc:153] ...". INFO and WARNING lines are
# notices; an ERROR line is kept unless it is one of the known harmless ones below.
_TF_LOG = re.compile(r"^(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: ([IWEF]) \S+:\d+\]|([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\])")
_NOISE = re.compile(
    "|".join(
        (
            r"^WARNING: All log messages before absl::InitializeLog\(\) is called",
            r"^To enable the following instructions:",
            r"oneDNN custom operations are on",
            r"This TensorFlow binary is optimized to use available CPU instructions",
            r"Could not find cuda drivers on your machine",
            r"TF-TRT Warning",
            r"Unable to register cu(?:DNN|FFT|BLAS) factory",
            r"[Ff]ailed call to cuInit",
            r"Cannot dlopen some GPU libraries",
            r"Skipping registering GPU devices",
            r"cudart_stub\.cc|cuda_(?:dnn|fft|blas|executor|diagnostics)\.cc|dso_loader\.cc",
            r"^(?:WARNING|INFO):(?:tensorflow|absl):",
            r"^Instructions for updating:$",
        )
    )
)
_TRACEBACK = "Traceback (most recent call last):"
# Frames of the interpreter's and nomadtf's own start of the code (runpy, the warm start's
# bootstrap, the GPU memory cap): in every traceback, about nothing the user wrote.
_BOOTSTRAP_FRAME = re.compile(r'^(\s*)File "(?:<frozen runpy>|.*[/\\]nomadtf[/\\](?:usercode[/\\])?(?:warmstart|gpulimit)\.py)", line \d+')


def is_noise(line: str) -> bool:
    """A line of TensorFlow's, absl's or CUDA's start-up chatter, not about the failure."""
    if not line.strip():
        return True
    match = _TF_LOG.match(line)
    if match and (match[1] or match[2]) in ("I", "W"):
        return True
    return bool(_NOISE.search(line))


def meaningful_lines(stderr: str, limit: int = STDERR_LINES, cut: bool = False) -> list[str]:
    """The last traceback in `stderr` and what follows it (nomadtf's own lines about the
    exit), else its last meaningful lines; at most `limit`, noise dropped. `cut`: `stderr` is
    the tail of a longer log, its first line may be partial."""
    lines = stderr.splitlines()[1:] if cut else stderr.splitlines()
    kept = [line.rstrip() for line in lines if not is_noise(line)]
    starts = [i for i, line in enumerate(kept) if line.startswith(_TRACEBACK)]
    if not starts:
        return kept[-limit:]
    traceback = _without_bootstrap_frames(kept[starts[-1]:])
    if len(traceback) <= limit:
        return traceback
    return [traceback[0], "  ...", *traceback[-(limit - 2):]]


def _without_bootstrap_frames(traceback: list[str]) -> list[str]:
    """The traceback less the frames of runpy and nomadtf's bootstrap (each frame's "File"
    line and the source lines indented under it)."""
    out: list[str] = []
    skipping: str | None = None  # the indent of the frame being dropped
    for line in traceback:
        if skipping is not None and line.startswith(skipping + " ") and not line.lstrip().startswith("File "):
            continue
        match = _BOOTSTRAP_FRAME.match(line)
        skipping = match[1] if match else None
        if match is None:
            out.append(line)
    return out


def exit_code_of(alloc: Allocation) -> int | None:
    """The exit code of the allocation's task's last termination, None if it never ended."""
    codes = [(event.time, event.exit_code) for _task, event in alloc.events() if event.type == "Terminated"]
    return max(codes)[1] if codes else None


def failing_alloc(allocs: list[Allocation], recorded: str | None, decided: str = "") -> Allocation | None:
    """The allocation whose failure ended the run: the newest of the slot the recorded
    state names (`failed: chief[0] ...`) or, with no record, the slot the outcome's reason
    `decided` starts with (`worker[0]: driver.image ...`), else the newest failed allocation
    of a training role, else the task whose exit decides the training (chief[0], worker[0])."""
    latest = latest_allocs(allocs)
    named = failed_slot(recorded) or _slot_named(decided)
    if named and named in latest:
        return latest[named]
    failed = [a for a in allocs if a.client_status in ("failed", "lost") and not roles.is_soft(a.slot[0])]
    if failed:
        return max(failed, key=lambda a: a.create_index)
    return latest.get(("chief", 0)) or latest.get(("worker", 0))


def _slot_named(reason: str) -> tuple[str, int] | None:
    match = re.match(r"(\w+)\[(\d+)\]", reason)
    return (match[1], int(match[2])) if match else None


@dataclass(frozen=True)
class FailedTask:
    """One task as the failure report shows it."""

    role: str
    index: int
    alloc_id: str
    status: str  # Nomad's ClientStatus
    exit_code: int | None
    stderr: list[str] = field(default_factory=list)  # meaningful lines (meaningful_lines)
    events: list[str] = field(default_factory=list)  # its last task events, as text

    @property
    def name(self) -> str:
        return f"{self.role}[{self.index}]"

    @classmethod
    def of(cls, alloc: Allocation, stderr: str, events: list[str] | None = None, cut: bool = False) -> FailedTask:
        role, index = alloc.slot
        return cls(
            role, index, alloc.id[:8], alloc.client_status or "?", exit_code_of(alloc),
            meaningful_lines(stderr, cut=cut), list(events or []),
        )


_MEMORY_FIX = re.compile(r"killed for exceeding its \d+ MiB: raise (roles\.\w+\.memory(?:_max)?)")
# outcome.describe_pull_failure's words; a GPU-only job's field carries a note in brackets
_IMAGE_FIX = re.compile(r"(driver\.(?:gpu_)?image)\S*(?: \([^)]*\))? (\S+) could not be pulled")


def failure_text(job_id: str, reason: str, task: FailedTask | None) -> str:
    """The report `nomadtf run` prints when a run failed: the reason, the failing task with
    its exit code, its traceback (or last meaningful stderr lines), and what to do."""
    lines = [f"job {job_id} failed" + (f": {reason}" if reason else "")]
    if task is None:
        lines.append(f"what to do: look at the tasks' logs (nomadtf logs {job_id} --role chief --stderr)")
        return "\n".join(lines)
    code = f", exit {task.exit_code}" if task.exit_code is not None else ""
    lines.append(f"failing task: {task.name} (allocation {task.alloc_id}, {task.status}{code})")
    if task.events:
        lines.append("  its last events:")
        lines += [f"    {text}" for text in task.events]
    image = _IMAGE_FIX.search(reason or "")
    if image:  # the task never started (outcome.pull_failure): no stderr, no code to blame
        field_name = image[1]
        lines.append(
            f"what to do: make {image[2]} pullable by every client (`nomadtf dev image build` on the local stack, "
            f"`docker push` to your registry), or set {field_name} in job.json (or --var {field_name}=IMAGE) to one that is"
        )
        return "\n".join(lines)
    if task.stderr:
        what = "traceback" if any(line.startswith(_TRACEBACK) for line in task.stderr) else f"last {len(task.stderr)} lines"
        lines.append(f"  {task.name} stderr ({what}, TensorFlow's notices left out):")
        lines += [f"    {line}" for line in task.stderr]
    else:
        lines.append(f"  {task.name} wrote nothing to stderr but TensorFlow's notices")
    logs = f"nomadtf logs {job_id} --role {task.role} --index {task.index} --stderr"
    memory = _MEMORY_FIX.search(reason or "")
    if memory:  # an OOM kill (runtime/oom.py): the limit is the fault, not the code
        field_name = memory[1]
        lines.append(f"what to do: raise {field_name} in job.json (or --var {field_name}=MiB), then run the job again; its whole log: {logs}")
    else:
        lines.append(f"what to do: fix what {task.name}'s stderr above names, then run the job again; its whole log: {logs}")
    return "\n".join(lines)


def side_role_warning(role: str, index: int, exit_code: int | None, stderr: str, cut: bool = False) -> list[str]:
    """The warning for a failed evaluator or TensorBoard: training is not disturbed by it."""
    code = f"exit {exit_code}" if exit_code is not None else "no exit code"
    head = f"{role}[{index}] failed ({code}); training goes on"
    tail = meaningful_lines(stderr, cut=cut)
    return [head + (":" if tail else ""), *(f"    {line}" for line in tail)]
