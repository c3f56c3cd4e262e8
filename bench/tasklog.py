"""The supervisors' stderr lines as the benches read them (the format is set in
nomadtf/runtime/__init__.py): "14:03:07.412 nomadtf task worker: cluster complete after 1.4s: ...".

Usage:
    lines = parse(text, near=time.time())      # [(epoch seconds, "cluster complete after ..."), ...]
    when, match = first(lines, START)          # the first line whose message matches, or None
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

LINE = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) nomadtf task \S+: (.*)$", re.MULTILINE)
COMPLETE = re.compile(r"cluster complete after ([\d.]+)s")
START = re.compile(r"generation (\d+): starting")


def parse(text: str, near: float) -> list[tuple[float, str]]:
    """(epoch seconds, message) of every supervisor line, on the local day of `near` (the
    tasks run on this machine, with its clock), moved by a day when that is closer. Pure."""
    day = datetime.fromtimestamp(near)
    out = []
    for hour, minute, second, millis, message in LINE.findall(text):
        stamp = day.replace(hour=int(hour), minute=int(minute), second=int(second), microsecond=int(millis) * 1000)
        if stamp.timestamp() - near > 12 * 3600:
            stamp -= timedelta(days=1)
        elif near - stamp.timestamp() > 12 * 3600:
            stamp += timedelta(days=1)
        out.append((stamp.timestamp(), message))
    return out


def first(lines: list[tuple[float, str]], pattern: re.Pattern, since: float = float("-inf")) -> tuple[float, re.Match] | None:
    """The first line at or after `since` whose message starts with `pattern`."""
    for when, message in lines:
        match = pattern.match(message)
        if when >= since and match:
            return when, match
    return None
