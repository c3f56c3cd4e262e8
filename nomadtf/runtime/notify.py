"""job.json `notify`: when a run ends, the task that records its outcome POSTs it as JSON
(the outcome record, `outcome_record`, the same one the archive keeps), so nobody has to
follow the run (`nomadtf run --detach`).

The URL: job.json `notify.url` (never with credentials: spec.notify_problems), replaced by
the job's Nomad variable nomad/jobs/<job> key `notify_url` when that is set: a whole URL, or
credentials ("user:password") put into job.json's URL. Nomad renders the variable into
secrets/notify_url (render.notify_template, as the AppRole ids are); the supervisor reads
and removes that file before any code starts. A variable nobody wrote leaves the file empty.

The POST runs in a thread of its own, after the outcome is recorded: it never delays or
changes the outcome or the exit code. Up to `TRIES` tries, `backoff` apart, each bounded
by `TRY_TIMEOUT_S` (under half a minute in all); the task waits for them at its very end, after
its child is stopped and its Consul session is gone. The URL is logged with its
credentials and query left out (`redact`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nomadtf import wire
from nomadtf.job import outcome
from nomadtf.job.outcome import failed_slot
from nomadtf.job.report import FailedTask, failure_text, meaningful_lines
from nomadtf.job.spec import JobSpec

log = logging.getLogger("nomadtf.task")

# Bounded so that an unreachable URL keeps the recording task (and a followed run's end)
# waiting briefly: a refused connection costs the 7 s of waits, a silent one 27 s at worst.
TRIES = 4
FIRST_DELAY_S = 1.0
TRY_TIMEOUT_S = 5.0  # 4 tries: 3 waits of 1+2+4 s and at most 4 x 5 s


# ---- pure -------------------------------------------------------------------------------------


def backoff(tries: int = TRIES, first_s: float = FIRST_DELAY_S) -> list[float]:
    """The wait before each try: none before the first, then doubling."""
    return [0.0] + [first_s * 2**i for i in range(tries - 1)]


def redact(url: str) -> str:
    """`url` as it may be logged: no credentials, no query, no fragment."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def resolve_url(job_url: str, variable: str) -> str:
    """The URL to POST to: the variable's whole URL, or its credentials ("user:password")
    put into job.json's URL; job.json's URL when the variable is empty. "" for none."""
    variable = variable.strip()
    if not variable:
        return job_url
    if "://" in variable or not job_url:
        return variable
    parts = urllib.parse.urlsplit(job_url)
    return urllib.parse.urlunsplit((parts.scheme, f"{variable}@{parts.netloc}", parts.path, parts.query, parts.fragment))


def what_to_do(job: str, state: str, stderr: str, exit_code: int | None = None, alloc_id: str = "") -> str:
    """What to do about a failed run, as `nomadtf run` says it (report.failure_text); "" for success."""
    told = outcome.from_record(state)
    if told is None or told.kind == outcome.SUCCEEDED:
        return ""
    slot = failed_slot(state)
    task = FailedTask(slot[0], slot[1], alloc_id[:8], "failed", exit_code, meaningful_lines(stderr)) if slot else None
    return failure_text(job, told.reason, task)


def outcome_record(
    spec: JobSpec, state: str, recorded_by: str, now: float, progress: dict[str, Any] | None, advice: str = ""
) -> dict[str, Any]:
    """The run's outcome as the archive keeps it and `notify` sends it."""
    told = outcome.from_record(state)
    progress = progress or {}
    return {
        "outcome": told.kind if told else state,
        "reason": told.reason if told else "",
        "exit_code": told.exit_code if told else None,
        "job": spec.name,
        "namespace": spec.namespace,
        "run_id": spec.run_id,
        "recorded_by": recorded_by,
        "submitted_at": spec.submitted_at,
        "ended_at": now,
        "duration_s": round(now - spec.submitted_at, 3) if spec.submitted_at else None,
        "step": progress.get("step"),
        "metrics": progress.get("metrics") or {},
        "what_to_do": advice,
    }


# ---- the URL and the POST ---------------------------------------------------------------------


def read_url(spec: JobSpec, secrets_dir: Path) -> str:
    """The run's notify URL ("": no notify): job.json's, or the variable's file
    (secrets/notify_url), which is read and removed (the code, started later, never sees it)."""
    job_url = (spec.document.get("notify") or {}).get("url", "")
    path = secrets_dir / wire.NOTIFY_FILE
    try:
        variable = path.read_text()
    except OSError:
        variable = ""
    with contextlib.suppress(OSError):
        path.unlink()
    return resolve_url(job_url, variable)


def post(url: str, body: bytes, timeout_s: float = TRY_TIMEOUT_S) -> None:
    """One POST of `body` (JSON); OSError (URLError, HTTPError, a timeout) when it fails.
    Credentials in the URL go as HTTP basic authentication."""
    parts = urllib.parse.urlsplit(url)
    request = urllib.request.Request(redact(url) + (f"?{parts.query}" if parts.query else ""), data=body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "nomadtf"})
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - http(s) only (schema)
        response.read()


class Notifier:
    """Usage (the supervisor):
    notifier = Notifier(url)           # "": sends nothing
    notifier.send(record)              # returns at once; the tries run in a thread
    notifier.wait()                    # at the task's end, bounded by the tries
    """

    def __init__(self, url: str, sleep: Callable[[float], None] = time.sleep, send_once: Callable[[str, bytes], None] = post):
        self.url = url
        self.sleep = sleep
        self.send_once = send_once
        self.thread: threading.Thread | None = None
        self.delivered = False

    def send(self, record: dict[str, Any]) -> None:
        if not self.url or self.thread is not None:
            return  # no notify, or already sent (one outcome per run)
        body = json.dumps(record, sort_keys=True).encode()
        self.thread = threading.Thread(target=self._tries, args=(body,), name="notify", daemon=True)
        self.thread.start()

    def _tries(self, body: bytes) -> None:
        shown = redact(self.url)
        delays = backoff()
        for attempt, delay in enumerate(delays, 1):
            self.sleep(delay)
            try:
                self.send_once(self.url, body)
            except (OSError, ValueError) as exc:  # URLError and HTTPError are OSErrors
                log.warning("notify %s: try %d of %d failed: %s", shown, attempt, len(delays), _safe(exc))
                continue
            self.delivered = True
            log.info("notify %s: the outcome was sent", shown)
            return
        log.warning("notify %s: not delivered after %d tries; the outcome stands as recorded", shown, len(delays))

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the tries to end; True when the outcome was delivered."""
        if self.thread is not None:
            self.thread.join(timeout_s if timeout_s is not None else sum(backoff()) + TRIES * TRY_TIMEOUT_S + 5)
        return self.delivered


def _safe(exc: BaseException) -> str:
    """An error as it may be logged: an HTTPError's status, never its URL."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return exc.__class__.__name__
