"""A stack's state directory and record (nomadtf/devstack/record.py): the marker, the 0600
files written through a rename, stack.json's components and what else it remembers."""

from __future__ import annotations

import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from nomadtf.devstack import processes
from nomadtf.devstack.record import MARKER, Component, Record, claim_state_dir, write_private
from nomadtf.errors import DevStackError


def test_private_files_are_0600_and_replaced_whole(tmp_path):
    path = tmp_path / "stack.json"
    write_private(path, "first")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text() == "first"
    inode = path.stat().st_ino
    write_private(path, "second")
    assert path.read_text() == "second" and path.stat().st_ino != inode  # a new file, renamed over
    assert [p.name for p in tmp_path.iterdir()] == ["stack.json"]  # no partial file left behind


def test_claiming_makes_a_private_marked_directory_and_refuses_a_foreign_one(tmp_path):
    fresh = tmp_path / "a" / "dev"
    claim_state_dir(fresh, "NOMADTF_DEV_DIR")
    assert (fresh / MARKER).is_file() and stat.S_IMODE(fresh.stat().st_mode) == 0o700
    claim_state_dir(fresh, "NOMADTF_DEV_DIR")  # ours: claimed again
    empty = tmp_path / "empty"
    empty.mkdir()
    claim_state_dir(empty, "NOMADTF_DEV_DIR")  # empty: nothing to lose
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(DevStackError, match=rf"{foreign} exists and was not created by .*point NOMADTF_DEV_CLUSTER_DIR"):
        claim_state_dir(foreign, "NOMADTF_DEV_CLUSTER_DIR")
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


def test_the_record_keeps_components_in_their_places_and_defaults_what_it_lacks(tmp_path):
    record = Record(tmp_path / "stack.json", defaults={"clients": 0, "namespaces": []})
    assert not record.exists() and record.load() == {} and record.get("clients") == 0 and record.components() == []
    consul, nomad = Component("consul", 10, "/bin/consul", "c.log"), Component("nomad", 11, "/bin/nomad", "n.log")
    record.put(consul)
    record.put(nomad)
    restarted = Component("consul", 12, "/bin/consul", "c.log", create_time=1.5)
    record.put(restarted)
    assert record.components() == [restarted, nomad]  # replaced in its place, not moved last
    assert record.component("nomad") == nomad
    with pytest.raises(DevStackError, match="records no openbao"):
        record.component("openbao")
    record.save(clients=3)
    assert record.get("clients") == 3 and record.components() == [restarted, nomad]


def test_remembered_names_are_kept_once_each_in_order(tmp_path):
    record = Record(tmp_path / "stack.json", defaults={"links": []})
    for name in ("ntf-br0", "ntf-c1-br", "ntf-br0", "ntf-c2-br"):
        record.remember("links", name)
    assert record.get("links") == ["ntf-br0", "ntf-c1-br", "ntf-c2-br"]


def test_a_component_is_its_process_only_while_that_process_runs(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        comp = Component("x", proc.pid, sys.executable, "x.log", create_time=processes.started_at(proc.pid))
        assert comp.process() is not None and comp.process().pid == proc.pid
        assert Component("x", proc.pid, sys.executable, "x.log", create_time=comp.create_time - 100).process() is None  # a reused PID
        assert Component("x", proc.pid, sys.executable, "x.log").process() is None  # an older record: unverifiable
    finally:
        proc.kill()
        proc.wait()
    assert comp.process() is None


def test_a_component_stays_its_process_when_the_wall_clock_is_stepped_and_a_reused_pid_does_not():
    """NTP may step the wall clock while a stack runs: psutil's create_time of the same
    process then differs in a process that reads it afresh (`nomadtf dev status`, `dev up`),
    and the stack looked stopped. The start counted from boot does not move."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        mark = processes.start_mark(proc.pid)
        stepped = Component("x", proc.pid, sys.executable, "x.log", create_time=processes.started_at(proc.pid) - 65, start=mark)
        assert stepped.process() is not None and stepped.process().pid == proc.pid
        boot, ticks = mark.split("/")
        reused = Component("x", proc.pid, sys.executable, "x.log", create_time=processes.started_at(proc.pid), start=f"{boot}/{int(ticks) - 1}")
        assert reused.process() is None  # the same PID, started at another moment: someone else's
        assert replace(stepped, start=f"another-boot/{ticks}").process() is None  # the same ticks after a reboot
        assert mark.startswith(Path("/proc/sys/kernel/random/boot_id").read_text().strip() + "/")
    finally:
        proc.kill()
        proc.wait()
    assert stepped.process() is None


def test_a_record_with_start_marks_reads_back_and_one_without_still_loads(tmp_path):
    record = Record(tmp_path / "stack.json")
    marked = Component("consul", 10, "/bin/consul", "c.log", create_time=1.5, start="b00t/42")
    record.put(marked)
    assert record.components() == [marked]
    (tmp_path / "old.json").write_text('{"components": [{"name": "nomad", "pid": 11, "binary": "/bin/nomad", "log": "n.log", "create_time": 2.5}]}')
    assert Record(tmp_path / "old.json").components() == [Component("nomad", 11, "/bin/nomad", "n.log", create_time=2.5)]
