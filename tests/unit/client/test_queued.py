"""What a queued run says to its submitter (nomadtf/client/queued.py: QueueStatus.describe,
describe_short), from the board the controller publishes. Pure."""

from __future__ import annotations

import time

import pytest

from nomadtf.admission.board import Board, BoardLine
from nomadtf.client.queued import QueueStatus, describe_short
from nomadtf.job.capacity import Resources

SINCE = 1_700_000_000.0  # 22:13:20 UTC


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def line(short: Resources | None, note: str = "does not fit now", place: int = 1, since: float = SINCE) -> BoardLine:
    return BoardLine("ticket", "team-a", 50, place, since, Resources(3380, 1800, {"nvidia/gpu": 1}), short, note)


def status(line: BoardLine | None, leader: str = "admission-1", length: int = 2) -> QueueStatus:
    return QueueStatus("team-a/digits", "3f2a9c1e", line, length, leader)


def test_without_a_leader_the_run_waits_for_one_whatever_the_board_says():
    expected = "team-a/digits run 3f2a9c1e waits: no admission controller leads now; it is admitted once one does"
    assert status(None, leader="").describe() == expected
    assert status(line(Resources(1200)), leader="").describe() == expected


def test_a_run_the_leader_has_not_published_yet_says_so():
    assert status(None).describe() == "team-a/digits run 3f2a9c1e is queued; the admission controller has not published its place yet"


def test_a_line_with_a_shortfall_says_what_the_run_needs_what_the_cluster_lacks_and_its_place(utc):
    assert status(line(Resources(1200, 0, {"nvidia/gpu": 1}))).describe() == (
        "team-a/digits run 3f2a9c1e does not fit now: needs cpu 3380 MHz, memory 1800 MB, nvidia/gpu x1; "
        "the cluster lacks cpu 1200 MHz, nvidia/gpu x1 now; place 1 of 2 in the queue since 22:13:20"
    )


def test_a_line_that_fits_or_lacks_nothing_names_no_shortfall(utc):
    admitting = status(line(None, note="admitting", place=1)).describe()
    assert admitting == "team-a/digits run 3f2a9c1e admitting: needs cpu 3380 MHz, memory 1800 MB, nvidia/gpu x1; place 1 of 2 in the queue since 22:13:20"
    behind = status(line(Resources(), note="waits for the runs ahead", place=2)).describe()
    assert "lacks" not in behind and behind.startswith("team-a/digits run 3f2a9c1e waits for the runs ahead: needs ")


def test_a_line_without_a_note_or_a_time_still_reads():
    text = status(line(Resources(0, 512), note="", since=0)).describe()
    assert text == (
        "team-a/digits run 3f2a9c1e waits: needs cpu 3380 MHz, memory 1800 MB, nvidia/gpu x1; "
        "the cluster lacks memory 512 MB now; place 1 of 2 in the queue since ?"
    )


def test_describe_short_names_only_what_lacks_something():
    assert describe_short(Resources(1200, 0, {"nvidia/gpu": 2, "amd/gpu": 0})) == "cpu 1200 MHz, nvidia/gpu x2"
    assert describe_short(Resources(0, 2048, {"b": 1, "a": 3})) == "memory 2048 MB, a x3, b x1"
    assert describe_short(Resources()) == ""


# The board reads any `since` a float takes; describe once raised on these.
@pytest.mark.parametrize("since", ["1e400", "NaN", "1e20"])
def test_a_board_line_with_an_out_of_range_since_still_describes(since):
    board = Board.parse('{"leader": "admission-1", "lines": [{"ticket": "t", "namespace": "team-a", "priority": 50, "place": 1, "since": %s}]}' % since)
    assert "place 1 of 2" in status(board.line_of("t")).describe()
