"""runtime/oom.py: the OOM kill counter of our own memory cgroup, read from a cgroup tree
laid out as the kernel lays it out (cgroup v1 and v2, in a container and on the host)."""

from __future__ import annotations

from pathlib import Path

from nomadtf.runtime import oom

V1_PROC = "12:memory:/docker/abc\n11:cpu,cpuacct:/docker/abc\n0::/system.slice/docker-abc.scope\n"
V2_PROC = "0::/nomad.slice/alloc.scope\n"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _proc(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proc-self-cgroup"
    path.write_text(text)
    return path


def test_v1_in_a_container_reads_the_mounted_memory_cgroup(tmp_path):
    # Inside a container the host's /docker/abc is not there: its own cgroup is the mount's root.
    _write(tmp_path / "memory" / "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert oom.kills(tmp_path, _proc(tmp_path, V1_PROC)) == 2


def test_v1_on_the_host_prefers_the_process_own_cgroup(tmp_path):
    _write(tmp_path / "memory" / "memory.oom_control", "oom_kill 40\n")
    _write(tmp_path / "memory" / "docker" / "abc" / "memory.oom_control", "oom_kill 1\n")
    assert oom.kills(tmp_path, _proc(tmp_path, V1_PROC)) == 1


def test_v2_reads_memory_events(tmp_path):
    _write(tmp_path / "nomad.slice" / "alloc.scope" / "memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert oom.kills(tmp_path, _proc(tmp_path, V2_PROC)) == 1


def test_no_counter_is_none_and_never_an_oom(tmp_path):
    assert oom.kills(tmp_path, _proc(tmp_path, V2_PROC)) is None
    assert oom.kills(tmp_path, tmp_path / "missing") is None
    assert not oom.killed_for_memory(None, -9, tmp_path)


def test_only_a_sigkill_while_the_counter_rose_is_an_oom(tmp_path, monkeypatch):
    counter = tmp_path / "memory" / "memory.oom_control"
    _write(counter, "oom_kill 0\n")
    monkeypatch.setattr(oom, "kills", lambda root=tmp_path: oom.parse_count(counter.read_text()))
    assert not oom.killed_for_memory(0, -9, tmp_path)  # killed, but not for memory
    counter.write_text("oom_kill 1\n")
    assert oom.killed_for_memory(0, -9, tmp_path)
    assert not oom.killed_for_memory(0, 1, tmp_path)  # an exit code is the code's own


def test_the_words_name_the_field_to_raise():
    assert oom.why("worker", 1024) == "killed for exceeding its 1024 MiB: raise roles.worker.memory"
    assert oom.why("chief", 2048, "memory_max") == "killed for exceeding its 2048 MiB: raise roles.chief.memory_max"
