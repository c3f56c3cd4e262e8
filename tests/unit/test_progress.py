"""The training code's progress helper (nomadtf.progress): at most one write a second, the
calls in between dropped, nothing at all outside nomadtf."""

from __future__ import annotations

import json

from nomadtf import progress


def test_calls_within_a_second_of_the_last_write_are_dropped(tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    clock = [100.0]
    monkeypatch.setenv("NOMADTF_PROGRESS_FILE", str(path))
    monkeypatch.setattr(progress, "_last_write", 0.0)
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    progress.report(step=1, loss=0.9)
    clock[0] = 100.5
    progress.report(step=2, loss=0.8)  # half a second later: dropped, not kept for later
    assert progress.read(str(path))["step"] == 1
    clock[0] = 101.0
    progress.report(step=3, loss=0.7)
    written = json.loads(path.read_text())
    assert written["step"] == 3 and written["metrics"] == {"loss": 0.7} and not (tmp_path / "p.json.tmp").exists()


def test_outside_nomadtf_nothing_is_written_and_an_unreadable_file_reads_as_none(tmp_path, monkeypatch):
    monkeypatch.delenv("NOMADTF_PROGRESS_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    progress.report(step=1)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "half.json").write_text('{"step": ')
    assert progress.read(str(tmp_path / "half.json")) is None and progress.read(str(tmp_path / "absent.json")) is None


def test_done_is_written_at_once_with_the_last_step_and_stays_in_every_later_write(tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    clock = [100.0]
    monkeypatch.setenv("NOMADTF_PROGRESS_FILE", str(path))
    monkeypatch.setattr(progress, "_last_write", 0.0)
    monkeypatch.setattr(progress, "_done", False)
    monkeypatch.setattr(progress, "_last", {})
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    progress.report(step=7, loss=0.5)
    assert "done" not in progress.read(str(path))
    clock[0] = 100.1  # within the second that drops a report: done is not dropped
    progress.done()
    written = progress.read(str(path))
    assert written["done"] is True and written["step"] == 7 and written["metrics"] == {"loss": 0.5}


def test_done_without_a_report_writes_nothing(tmp_path, monkeypatch):
    """A worker that never reports must not put a step 0 in the run's progress."""
    path = tmp_path / "p.json"
    monkeypatch.setenv("NOMADTF_PROGRESS_FILE", str(path))
    monkeypatch.setattr(progress, "_done", False)
    monkeypatch.setattr(progress, "_last", {})
    progress.done()
    assert not path.exists()
