"""The cluster-file watch of reconfigure=template: a rewrite of the file (consul-template
renames a new one into place) is an event at once; our own reads of it are not."""

from __future__ import annotations

import os
import queue

from nomadtf.runtime.loop import CLUSTER_FILE
from nomadtf.runtime.watches import FileWatch


def test_a_rename_into_place_is_an_event_and_a_read_is_not(tmp_path):
    events: queue.SimpleQueue = queue.SimpleQueue()
    path = tmp_path / "local" / "nomadtf-cluster.json"
    watch = FileWatch(path, CLUSTER_FILE, events.put).start()
    try:
        staged = path.parent / ".render-tmp"
        staged.write_text('{"members": []}')
        os.replace(staged, path)  # the way consul-template writes
        assert events.get(timeout=5).kind == CLUSTER_FILE
        while not events.empty():  # one rewrite may be several inotify events
            events.get_nowait()
        for _ in range(5):
            path.read_text()
        try:
            event = events.get(timeout=1)
        except queue.Empty:
            event = None
        assert event is None, f"a read of the file woke the task: {event}"
        path.write_text('{"members": [1]}')
        assert events.get(timeout=5).kind == CLUSTER_FILE
    finally:
        watch.close()


def test_another_file_in_the_directory_is_no_event(tmp_path):
    events: queue.SimpleQueue = queue.SimpleQueue()
    path = tmp_path / "nomadtf-cluster.json"
    watch = FileWatch(path, CLUSTER_FILE, events.put).start()
    try:
        (tmp_path / "progress.json").write_text("{}")
        try:
            event = events.get(timeout=1)
        except queue.Empty:
            event = None
        assert event is None
    finally:
        watch.close()


def test_a_blocking_watch_posts_each_answer_it_is_asked_to_starting_from_what_was_seen_and_nothing_once_stopped():
    import threading

    from nomadtf.runtime.loop import CLUSTER_KV
    from nomadtf.runtime.watches import Watch

    asked: list[int] = []
    answer = threading.Event()

    def query(index: int, wait_s: float) -> int:
        asked.append(index)
        answer.wait(5)  # a blocking query: answers when the test says so
        answer.clear()
        return index  # no change: the wait passed

    events: queue.SimpleQueue = queue.SimpleQueue()
    watch = Watch(CLUSTER_KV, query, events.put, every_answer=True, index=41).start()
    answer.set()
    assert events.get(timeout=5).kind == CLUSTER_KV  # a wait that passed is a look too
    assert asked[0] == 41  # the first query blocks from what the caller had seen
    watch.stop.set()
    answer.set()  # the query in flight answers after the stop
    watch.thread.join(5)
    assert not watch.thread.is_alive() and events.empty()
