"""The one duration parser (nomadtf/durations.py): Go's grammar, exact nanoseconds, ages."""

import pytest

from nomadtf.durations import INT64, DurationError, parse_ns, parse_seconds


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("30s", 30 * 10**9),
        ("5m", 300 * 10**9),
        ("1500ms", 1_500_000_000),
        ("1m2.5s", 62_500_000_000),  # how Nomad and Consul print a time.Duration
        ("812.3ms", 812_300_000),
        ("1h0m0s", 3600 * 10**9),
        ("250us", 250_000),
        ("250µs", 250_000),
        ("7d", 7 * 86400 * 10**9),
        ("2w", 14 * 86400 * 10**9),
        ("0", 0),
        ("-1m", -60 * 10**9),
    ],
)
def test_durations_parse_exactly(text, ns):
    assert parse_ns(text) == ns


def test_seconds_are_the_nanoseconds_scaled():
    assert parse_seconds("1m2.5s") == 62.5


def test_a_duration_beyond_int64_is_what_nomad_can_hold():
    assert parse_ns("9" * 40 + "s") == INT64
    assert parse_ns("3000000h") == INT64


@pytest.mark.parametrize("text", ["", "5", "5x", "s", "m5", "1.s.", "5 m", "1m-2s"])
def test_what_is_not_a_duration_is_refused_with_an_example(text):
    with pytest.raises(DurationError, match="not a duration; write e.g. 30s"):
        parse_ns(text)
