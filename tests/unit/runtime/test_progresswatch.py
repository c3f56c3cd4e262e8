"""The running child's progress (nomadtf.runtime.progresswatch): what the child writes with
nomadtf.progress.report is read each tick, judged for a hang, and published at most every
PUBLISH_S, as the child's own process would write it."""

from __future__ import annotations

import subprocess
import sys

from nomadtf.errors import ConsulError
from nomadtf.runtime import progresswatch
from nomadtf.runtime.progresswatch import ProgressWatch
from nomadtf.runtime.recording import Identity


class Discovery:
    def __init__(self, fail: bool = False):
        self.published: list[dict] = []
        self.fail = fail

    def publish_progress(self, progress):
        if self.fail:
            raise ConsulError("Consul answered 500")
        self.published.append(progress)


def _report(path, step: int, **metrics: float) -> None:
    """One report from a child process of its own, the way training code makes it."""
    code = f"from nomadtf import progress; progress.report(step={step}, **{metrics!r})"
    subprocess.run([sys.executable, "-c", code], env={"NOMADTF_PROGRESS_FILE": str(path), "PYTHONPATH": ":".join(sys.path)}, check=True)


def _watch(tmp_path, discovery, timeout_s: float = 10.0) -> ProgressWatch:
    me = Identity("worker", "alloc", 0, "inc", index=1)
    return ProgressWatch(tmp_path / "nomadtf-progress.json", timeout_s, discovery, me)  # type: ignore[arg-type]


def test_a_new_step_is_published_tagged_with_whose_it_is_and_at_most_every_publish_interval(tmp_path):
    discovery = Discovery()
    watch = _watch(tmp_path, discovery)
    watch.restart(now=100.0)
    assert watch.tick(now=101.0) is False and discovery.published == []  # nothing reported yet
    _report(watch.path, 1, loss=0.5)
    watch.tick(now=102.0)
    assert [(p["step"], p["metrics"], p["role"], p["index"]) for p in discovery.published] == [(1, {"loss": 0.5}, "worker", 1)]
    _report(watch.path, 2)
    watch.tick(now=102.0 + progresswatch.PUBLISH_S / 2)  # too soon: read, not published
    assert len(discovery.published) == 1
    watch.tick(now=102.0 + progresswatch.PUBLISH_S)  # the one held back goes out when due, not dropped
    assert [p["step"] for p in discovery.published] == [1, 2]
    watch.tick(now=110.0)  # the same report again: nothing new to say
    assert len(discovery.published) == 2
    _report(watch.path, 3)
    watch.tick(now=111.0)
    assert [p["step"] for p in discovery.published] == [1, 2, 3]


def test_a_new_checkpoint_is_published_at_once_not_held_back(tmp_path):
    """A preemption or a growth waits on it: each step the code runs on after saving is lost."""
    discovery = Discovery()
    watch = _watch(tmp_path, discovery)
    watch.restart(now=100.0)
    _report(watch.path, 7)
    watch.tick(now=101.0)
    code = "from nomadtf import progress; progress.report(step=8); progress.checkpointed(8)"
    subprocess.run([sys.executable, "-c", code], env={"NOMADTF_PROGRESS_FILE": str(watch.path), "PYTHONPATH": ":".join(sys.path)}, check=True)
    watch.tick(now=101.1)  # well within PUBLISH_S
    assert [(p["step"], p.get("checkpoint_step")) for p in discovery.published] == [(7, None), (8, 8)]


def test_no_new_step_for_the_hang_timeout_is_a_hang_and_a_restart_forgives_it(tmp_path):
    watch = _watch(tmp_path, Discovery(fail=True), timeout_s=3.0)  # Consul away: progress is best effort
    watch.restart(now=0.0)
    assert watch.tick(now=100.0) is False  # silent from the start: never judged
    _report(watch.path, 5)
    assert watch.tick(now=100.0) is False
    assert watch.tick(now=103.5) is True  # step 5 for 3.5 s
    watch.restart(now=104.0)  # a new child: it must report before it is judged
    assert watch.tick(now=200.0) is False
    assert watch.timeout_s == 3.0


def _done(path, step: int) -> None:
    """The last report and `done()` from a child process of its own, as training code ends its loop."""
    code = f"from nomadtf import progress; progress.report(step={step}); progress.done()"
    subprocess.run([sys.executable, "-c", code], env={"NOMADTF_PROGRESS_FILE": str(path), "PYTHONPATH": ":".join(sys.path)}, check=True)


def test_code_that_said_its_loop_is_done_is_never_hung_and_its_next_attempt_is_judged_afresh(tmp_path):
    """A final evaluation or TensorFlow's shutdown (a mirrored first worker's waits on its
    peers) may outlast the hang timeout: after `progress.done()` silence is no hang. A
    restarted child starts from the same file, done and all, and is judged once it reports."""
    watch = _watch(tmp_path, Discovery(), timeout_s=3.0)
    watch.restart(now=0.0)
    _done(watch.path, 40)
    assert watch.tick(now=1.0) is False
    assert watch.tick(now=60.0) is False  # a minute of silence after done: no hang
    assert watch.last["done"] is True and watch.last["step"] == 40
    watch.restart(now=61.0)  # the next attempt: the file still says done, from the last one
    assert watch.tick(now=70.0) is False  # it has not reported yet
    _report(watch.path, 10)
    assert watch.tick(now=71.0) is False
    assert watch.tick(now=75.0) is True  # its own silence is judged again
