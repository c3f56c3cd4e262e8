"""devstack/images.py's pure parts: what an image's tag is made of, and that the
repository's Dockerfile names the TensorFlow this checkout is tested with."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from nomadtf.devstack import images

ROOT = Path(__file__).resolve().parents[3]


def test_the_tag_changes_with_every_input_and_names_the_version():
    base = images.base_tag()
    cpu = images.ImageSpec("2.21.0")
    tag = images.image_tag(cpu, base, "sources-1")
    assert re.fullmatch(r"nomadtf:tf2\.21\.0-cpu-[0-9a-f]{10}", tag)
    assert images.image_tag(cpu, base, "sources-1") == tag
    assert images.image_tag(cpu, base, "sources-2") != tag
    assert images.image_tag(images.ImageSpec("2.20.0"), base, "sources-1") != tag
    assert images.image_tag(cpu, "nomadtf-base:other", "sources-1") != tag
    assert images.image_tag(images.ImageSpec("2.21.0", gpu=True), base, "sources-1").startswith("nomadtf:tf2.21.0-gpu-")


def test_the_reference_of_a_checkout_follows_its_sources_and_the_version(tmp_path, monkeypatch):
    """What the several-client tests look for in the single-node stack's daemon
    (tests/images.py) before they build: this checkout's tag for the version."""
    for name in images._SOURCES:
        (tmp_path / name).write_text(name)
    monkeypatch.setattr(images, "repo_root", lambda: tmp_path)
    first = images.reference("2.21.0")
    assert re.fullmatch(r"nomadtf:tf2\.21\.0-cpu-[0-9a-f]{10}", first)
    assert images.reference("2.21.0") == first
    assert images.reference("2.20.0") != first
    (tmp_path / "Dockerfile").write_text("changed")
    assert images.reference("2.21.0") != first


def test_requirements_of_the_two_flavours():
    assert images.ImageSpec("2.21.0").requirement == "tensorflow-cpu==2.21.0"
    assert images.ImageSpec("2.21.0", gpu=True).requirement == "tensorflow[and-cuda]==2.21.0"


def test_the_sources_digest_follows_the_code(tmp_path):
    for name in ("pyproject.toml", "README.md", "Dockerfile"):
        (tmp_path / name).write_text(name)
    for folder in ("nomadtf", "templates", "examples"):
        (tmp_path / folder).mkdir()
    (tmp_path / "nomadtf" / "a.py").write_text("x = 1\n")
    first = images.sources_digest(tmp_path)
    (tmp_path / "nomadtf" / "__pycache__").mkdir()
    (tmp_path / "nomadtf" / "__pycache__" / "a.pyc").write_bytes(b"\0")
    assert images.sources_digest(tmp_path) == first  # byte code is not a source
    (tmp_path / "nomadtf" / "a.py").write_text("x = 2\n")
    assert images.sources_digest(tmp_path) != first


def test_the_dockerfile_defaults_to_the_tested_tensorflow():
    tested = images.installed_tensorflow()
    dockerfile = (ROOT / "Dockerfile").read_text()
    base = re.search(r"^ARG BASE=tensorflow/tensorflow:(\S+)$", dockerfile, re.M)
    assert base, "the Dockerfile's ARG BASE names no official TensorFlow image"
    if tested:  # the test bed installs tensorflow-cpu (the train extra)
        assert base[1] == tested, f"ARG BASE is {base[1]}, the tests run TensorFlow {tested}: update the Dockerfile"
    assert f"tf{base[1]}" in (ROOT / "examples" / "docker" / "job.json").read_text()
    assert re.search(r'^ENTRYPOINT \["python3", "-m", "nomadtf", "task"\]$', dockerfile, re.M)


def test_the_build_context_is_the_wheelhouse_and_the_examples_only():
    lines = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert lines == ["*", "!wheels/", "!examples/"]


def test_only_earlier_builds_of_the_same_version_and_flavour_are_pruned():
    ref = "nomadtf:tf2.21.0-cpu-aaaaaaaaaa"
    tags = [
        ref, "nomadtf:tf2.21.0-cpu",  # the alias, now on ref
        "nomadtf:tf2.21.0-cpu-bbbbbbbbbb", "nomadtf:tf2.21.0-cpu-cccccccccc",  # superseded
        "nomadtf:tf2.20.0-cpu-bbbbbbbbbb", "nomadtf:tf2.21.0-gpu-bbbbbbbbbb",  # another version, flavour
        "nomadtf:tf2.21.0-cpu-mine",  # not a build of ours
    ]
    assert images.older_builds(ref, tags) == ["nomadtf:tf2.21.0-cpu-bbbbbbbbbb", "nomadtf:tf2.21.0-cpu-cccccccccc"]
    assert images.older_builds(ref, [ref]) == []


def test_a_build_beside_other_work_runs_its_commands_at_the_lowest_priority(monkeypatch):
    ran = []
    monkeypatch.setattr(images.subprocess, "run", lambda argv, **_kw: ran.append(argv) or subprocess.CompletedProcess(argv, 0, "", ""))
    images._run(["debootstrap", "bookworm"], "debootstrap", yield_cpu=True)
    images._run(["tar", "-cf", "x.tar"], "tar")
    assert ran == [["nice", "-n", "19", "debootstrap", "bookworm"], ["tar", "-cf", "x.tar"]]
