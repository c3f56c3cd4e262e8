"""Durations, parsed one way everywhere: job.json's (`30s`, `5m`), `--timeout`, `env gc
--older-than` (`7d`) and the Go `time.Duration` strings Nomad and Consul print (`1m2.5s`).

Pure. Go's grammar (a sequence of decimal numbers with a unit each: ns, us, µs, ms, s, m, h)
plus `d` and `w` for ages. Nanoseconds are exact integers, as Go keeps them, so a value read
back from Nomad compares equal to the one nomadtf sent.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

INT64 = 2**63 - 1  # Go's time.Duration is an int64 of nanoseconds

_NS_PER_UNIT = {
    "ns": 1,
    "us": 10**3,
    "µs": 10**3,
    "ms": 10**6,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
    "d": 86400 * 10**9,
    "w": 7 * 86400 * 10**9,
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h|d|w)")


class DurationError(ValueError):
    """Not a duration; callers say which field or option it came from."""


def parse_ns(text: str) -> int:
    """`text` in nanoseconds, exactly; beyond int64 it is clamped to int64 (what Nomad holds).

    >>> parse_ns("1m2.5s"), parse_ns("1500ms"), parse_ns("0")
    (62500000000, 1500000000, 0)
    """
    body = text.strip()
    sign = -1 if body.startswith("-") else 1
    body = body.lstrip("+-")
    if body == "0":
        return 0
    parts = _PART.findall(body)
    if not parts or "".join(number + unit for number, unit in parts) != body:
        raise DurationError(f"{text!r} is not a duration; write e.g. 30s, 5m, 2h or 7d")
    total = 0
    for number, unit in parts:
        if len(number.split(".")[0].lstrip("0")) > 30:
            return sign * INT64  # int() and Decimal() would work, but nothing holds it
        try:
            total += int(Decimal(number) * _NS_PER_UNIT[unit])
        except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
            raise DurationError(f"{text!r} is not a duration") from exc
    return sign * min(total, INT64)


def parse_seconds(text: str) -> float:
    """`text` in seconds (a float: for timeouts and ages, not for what Nomad stores)."""
    return parse_ns(text) / 1e9
