"""The pure pieces of the run's archive and notify: the cap's rotation, the backoff, the
URL's redaction and credentials, the outcome record, and the archive's tee on real pipes."""

from __future__ import annotations

import os

from nomadtf.job.spec import parse_spec
from nomadtf.runtime import archive, notify


def test_the_oldest_attempts_are_dropped_first_never_the_current_one():
    sizes = {"a-1": 50, "b-2": 30, "c-3": 40}
    assert archive.to_drop(sizes, 100, current="c-3") == ["a-1"]
    assert archive.to_drop(sizes, 40, current="c-3") == ["a-1", "b-2"]
    assert archive.to_drop(sizes, 200, current="c-3") == []
    assert archive.to_drop({"a-1": 500}, 100, current="a-1") == []  # its own head is cut instead
    assert archive.tail_start(1000, 400) == 900


def test_attempt_names_sort_by_time():
    names = [archive.attempt_name(t, "0123456789ab", n) for n, t in enumerate((1.5, 10.0, 100.25), 1)]
    assert names == sorted(names) and names[0].endswith("-01234567-1")


def test_backoff_is_bounded():
    assert notify.backoff() == [0.0, 1.0, 2.0, 4.0]
    assert sum(notify.backoff()) + notify.TRIES * notify.TRY_TIMEOUT_S <= 30


def test_a_logged_url_has_no_credentials_or_query():
    assert notify.redact("https://bot:s3cret@hooks.example.com:8443/a/b?token=x#f") == "https://hooks.example.com:8443/a/b"


def test_credentials_come_from_the_variable():
    assert notify.resolve_url("https://h/x?c=1", "") == "https://h/x?c=1"
    assert notify.resolve_url("https://h/x", "u:p") == "https://u:p@h/x"
    assert notify.resolve_url("https://h/x", "https://other/y\n") == "https://other/y"
    assert notify.resolve_url("", "") == ""


def test_a_notifier_retries_then_gives_up_without_raising():
    tries = []

    def failing(url, body):
        tries.append(url)
        raise OSError("refused")

    sender = notify.Notifier("http://127.0.0.1:9/x", sleep=lambda s: None, send_once=failing)
    sender.send({"outcome": "succeeded"})
    assert sender.wait(5) is False and len(tries) == notify.TRIES


def _spec():
    return parse_spec({"name": "digits", "strategy": "multi_worker_mirrored", "entrypoint": {"script": "t.py"},
                       "roles": {"worker": {"count": 1}}, "notify": {"url": "https://h/x"}})


def test_the_outcome_record_and_what_to_do():
    spec = _spec()
    record = notify.outcome_record(spec, "succeeded", "worker[0]", 10.0, {"step": 7, "metrics": {"loss": 0.5}})
    assert record["outcome"] == "succeeded" and record["step"] == 7 and record["metrics"] == {"loss": 0.5}
    state = "failed: worker[0] exited 1, a permanent exit code"
    advice = notify.what_to_do("digits", state, "Traceback (most recent call last):\nValueError: boom\n", 1)
    assert "ValueError: boom" in advice and "nomadtf logs digits --role worker --index 0 --stderr" in advice
    assert notify.what_to_do("digits", "succeeded", "") == ""


def test_a_url_with_credentials_in_job_json_is_refused():
    import pytest

    from nomadtf.errors import SpecError

    with pytest.raises(SpecError, match="notify.url"):
        parse_spec({"name": "d", "strategy": "multi_worker_mirrored", "entrypoint": {"script": "t.py"},
                    "roles": {"worker": {"count": 1}}, "notify": {"url": "https://u:p@h/x"}})


def test_the_tee_keeps_both_streams_and_the_cap(tmp_path):
    task = archive.TaskArchive(tmp_path / "run", "worker", 0, "abcdef0123", cap=4096)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    threads = task.capture(os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"))
    os.write(out_w, b"x" * 10_000 + b"\nlast line\n")
    os.write(err_w, b"oops\n")
    os.close(out_w)
    os.close(err_w)
    for thread in threads:
        thread.join(5)
    files = {p.suffix: p.read_bytes() for p in task.folder.iterdir()}
    assert files[".stderr"] == b"oops\n" and task.last_stderr() == "oops\n"
    assert files[".stdout"].endswith(b"last line\n") and files[".stdout"].startswith(archive.CUT_NOTE)
    assert sum(len(v) for v in files.values()) <= 4096
