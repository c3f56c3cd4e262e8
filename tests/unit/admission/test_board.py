"""The board the controller's leader publishes and every submitter reads
(nomadtf/admission/board.py): it round-trips, and no value anyone could write makes a
reader raise. Pure."""

from __future__ import annotations

import json

import pytest

from nomadtf.admission.board import MAX_LINES, Board, BoardLine, Happened, Skipped
from nomadtf.job.capacity import Resources


def line(ticket: str = "t1", place: int = 1, **extra) -> BoardLine:
    fields = {"namespace": "team-a", "priority": 50, "place": place, "since": 1_700_000_000.5,
              "needs": Resources(3380, 1800, {"nvidia/gpu": 2}), "short": Resources(1200, 0, {}), "note": "does not fit now"}  # fmt: skip
    fields.update(extra)
    return BoardLine(ticket, **fields)


def line_dict(**extra) -> dict:
    return {**line().as_dict(), **extra}


def test_a_board_reads_back_what_was_written():
    board = Board(
        leader="admission-1", at=1_700_000_100.25,
        lines=(line("t1", 1), line("t2", 2, short=None, note="admitting", needs=Resources(100, 200, {}))),
        skipped=(Skipped("team-b", "broken", "Meta nomadtf.counts is not JSON"),),
        length=5, free=Resources(800, 4096, {"nvidia/gpu/Tesla-V100": 1}), recent=(Happened("team-a", "t1", "05:07:19 admitted after 3s in the queue"), Happened("team-c", "t2", "05:07:20 refused: it can never fit")),
    )  # fmt: skip
    assert Board.parse(board.value()) == board
    assert Board.parse(board.value().encode()) == board  # the KV value's bytes


def test_a_board_without_a_length_counts_its_lines():
    assert Board.parse(Board(lines=(line("a"), line("b"))).value()).length == 2


def test_a_board_keeps_at_most_max_lines_but_counts_every_run():
    board = Board(lines=tuple(line(f"t{i}", i + 1) for i in range(MAX_LINES + 5)))
    read = Board.parse(board.value())
    assert len(read.lines) == MAX_LINES and read.length == MAX_LINES + 5


def test_line_of_finds_a_run_by_its_ticket_only():
    board = Board(lines=(line("t1", 1), line("t2", 2)))
    assert board.line_of("t2").place == 2
    assert board.line_of("t3") is None


@pytest.mark.parametrize("raw", [None, b"", "", "not json", b"\xff\xfe", "[1, 2]", "null", '"a string"', "42", "{"])
def test_a_value_that_is_not_a_board_reads_as_an_empty_one(raw):
    assert Board.parse(raw) == Board()


@pytest.mark.parametrize(
    "junk",
    [
        pytest.param({"ticket": "x"}, id="missing-fields"),
        pytest.param(line_dict(priority="high"), id="priority-not-a-number"),
        pytest.param(line_dict(place=None), id="place-null"),
        pytest.param(line_dict(needs={"cpu": "lots"}), id="needs-garbled"),
        pytest.param(line_dict(needs={"devices": {"nvidia/gpu": None}}), id="device-count-null"),
        pytest.param(line_dict(short={"memory": [1]}), id="short-garbled"),
        pytest.param(line_dict(priority="9" * 5000), id="huge-number-string"),
        pytest.param([1, 2], id="a-list"),
        pytest.param("t9", id="a-string"),
        pytest.param(None, id="null"),
        pytest.param(7, id="a-number"),
    ],
)
def test_a_line_that_cannot_be_read_is_dropped_and_the_others_kept(junk):
    good = line_dict(ticket="good", place=2)
    board = Board.parse(json.dumps({"leader": "admission-1", "lines": [junk, good], "skipped": []}))
    assert [entry.ticket for entry in board.lines] == ["good"]
    assert board.leader == "admission-1" and board.line_of("good").needs == Resources(3380, 1800, {"nvidia/gpu": 2})


def test_skipped_entries_that_cannot_be_read_are_dropped_and_the_others_kept():
    raw = json.dumps({"skipped": [{"namespace": "a"}, "junk", None, {"namespace": "b", "ticket": "j", "why": "bad Meta"}]})
    assert Board.parse(raw).skipped == (Skipped("b", "j", "bad Meta"),)


def test_huge_strings_are_cut_short():
    raw = json.dumps({"leader": "L" * 100_000, "lines": [line_dict(note="n" * 100_000)],
                      "skipped": [{"namespace": "a", "ticket": "j", "why": "w" * 100_000}],
                      "recent": [{"namespace": "a", "ticket": "j", "what": "r" * 100_000}, 5]})  # fmt: skip
    board = Board.parse(raw)
    assert len(board.leader) == 200 and len(board.lines[0].note) == 300 and len(board.skipped[0].why) == 300
    assert board.recent == (Happened("a", "j", "r" * 300),)  # what cannot be read is left out


def test_a_garbled_at_or_length_reads_as_unknown():
    board = Board.parse(json.dumps({"at": "now", "length": "many", "lines": [line_dict()]}))
    assert (board.at, board.length, len(board.lines)) == (0.0, 1, 1)
    assert board.age_s() == float("inf")  # never published: no leader is trusted from it


# Board.parse promises never to raise: these values once made it raise.
@pytest.mark.parametrize(
    "raw",
    [
        pytest.param('{"lines": 5}', id="lines-a-number"),
        pytest.param('{"skipped": true}', id="skipped-a-bool"),
        pytest.param('{"recent": 7}', id="recent-a-number"),
        pytest.param('{"free": {"cpu": "lots"}}', id="free-garbled"),
        pytest.param('{"length": Infinity}', id="length-infinite"),
        pytest.param('{"lines": [{"ticket": "t", "namespace": "n", "priority": 1e400, "place": 1}]}', id="line-priority-infinite"),
    ],
)
def test_known_values_that_make_parse_raise(raw):
    assert isinstance(Board.parse(raw), Board)


def test_a_line_whose_since_cannot_be_read_is_kept_with_no_time():
    board = Board.parse(json.dumps({"leader": "admission-1", "lines": [line_dict(ticket="t", since="yesterday")]}))
    assert board.line_of("t") is not None and board.line_of("t").since == 0.0
