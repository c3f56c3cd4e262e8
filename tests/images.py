"""The task image, built once per test run on a machine that runs both stacks' sessions.

A build is minutes of CPU on the CI machine (a Debian base, a wheelhouse with TensorFlow,
`docker build`), and the two sessions run side by side there (scripts/test), short of CPU.
The single-node session builds its images in its stack's daemon, in the background from its
start (conftest.py), and marks each build underway here (a file naming its process). The
several-client session needs the same image in each of its clients' daemons: when the
single-node stack is up with a daemon, it waits for that session's build to end and copies
the image from there; only without it (a `-m cluster` run alone, a build that failed) does
it build the image itself, in client 1's daemon, and copy it to the others.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from nomadtf.devstack import images
from nomadtf.devstack.stack import DevStack

UNDERWAY = Path(tempfile.gettempdir()) / "nomadtf-tests-image-builds"
# The longest wait for the other session's build: a fresh machine's, at its lowest priority.
BUILD_WAIT_S = 40 * 60


def _marker(ref: str) -> Path:
    return UNDERWAY / ref.replace("/", "_").replace(":", "_")


def mark_underway(ref: str) -> None:
    """Mark the build of `ref` in progress by this process, for the other session."""
    marker = _marker(ref)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(str(os.getpid()))


def mark_done(ref: str) -> None:
    _marker(ref).unlink(missing_ok=True)


def building(ref: str) -> bool:
    """Whether a live process marked the build of `ref` underway."""
    try:
        pid = int(_marker(ref).read_text() or 0)
    except (OSError, ValueError):
        return False
    return pid != os.getpid() and psutil.pid_exists(pid)


def _from_single_node_stack(ref: str, progress: Callable[[str], None]):
    """The single-node stack's daemon once it has `ref` (waiting for a build underway), or None."""
    single = DevStack.default()
    if not (single.recorded_docker() and single.is_up()):
        return None
    deadline = time.monotonic() + BUILD_WAIT_S
    if building(ref):
        progress(f"waiting for the single-node session's build of {ref}")
    while building(ref) and time.monotonic() < deadline:
        time.sleep(5)
    client = single.daemon.client(timeout=900)
    return client if images.present(client, ref) else None


def for_clients(daemons: list, progress: Callable[[str], None]) -> str:
    """The task image in every daemon of `daemons` (Docker SDK clients, client 1's first)."""
    ref = images.reference()
    source = _from_single_node_stack(ref, progress)
    if source is not None:
        try:
            for index, target in enumerate(daemons, start=1):
                images.copy(source, target, ref, progress, to=f"client {index}'s daemon")
            return ref
        except Exception as exc:  # noqa: BLE001 - the other session may be restarting its stack: build instead
            progress(f"copying from the single-node stack's daemon failed ({exc}); building it here")
    built = images.build(daemons[0], progress)
    assert built == ref, (built, ref)  # images.reference names what build makes
    for index, target in enumerate(daemons[1:], start=2):
        images.copy(daemons[0], target, ref, progress, to=f"client {index}'s daemon")
    return ref
