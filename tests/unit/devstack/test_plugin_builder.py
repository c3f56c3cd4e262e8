"""The one builder of the project's Go plugins (nomadtf/devstack/plugin_builder.py): which
files a plugin is built from, the hash that decides a rebuild, the stamp beside the binary.
No Go runs here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from nomadtf.devstack import consul_engine, gpu_plugin, plugin_builder
from nomadtf.errors import BinaryError


def _plugin(source: Path) -> plugin_builder.GoPlugin:
    return plugin_builder.GoPlugin("fake", source, "plugins", "a fake plugin", lambda _progress: None)


def _sources(root: Path) -> Path:
    src = root / "src"
    src.mkdir()
    (src / "go.mod").write_text("module example.com/fake\n\ngo 1.20\n")
    (src / "go.sum").write_text("")
    (src / "main.go").write_text("package main\n\nfunc main() {}\n")
    (src / "plugin.go").write_text("package main\n")
    (src / "README.md").write_text("docs\n")
    return src


def test_hash_is_stable_and_hex(tmp_path):
    src = _sources(tmp_path)
    first = plugin_builder.source_hash(src)
    assert re.fullmatch(r"[0-9a-f]{64}", first)
    assert plugin_builder.source_hash(src) == first


def test_hash_covers_go_files_and_module_files_only(tmp_path):
    src = _sources(tmp_path)
    assert [p.name for p in plugin_builder.source_files(src)] == ["go.mod", "go.sum", "main.go", "plugin.go"]
    before = plugin_builder.source_hash(src)
    (src / "README.md").write_text("other docs\n")
    (src / "notes.txt").write_text("x")
    assert plugin_builder.source_hash(src) == before


@pytest.mark.parametrize("change", ["edit", "add", "remove", "rename", "gosum"])
def test_hash_changes_with_sources(tmp_path, change):
    src = _sources(tmp_path)
    before = plugin_builder.source_hash(src)
    if change == "edit":
        (src / "plugin.go").write_text("package main\n// changed\n")
    elif change == "add":
        (src / "extra.go").write_text("package main\n")
    elif change == "remove":
        (src / "plugin.go").unlink()
    elif change == "rename":
        (src / "plugin.go").rename(src / "other.go")
    else:
        (src / "go.sum").write_text("example.com/x v1.0.0 h1:abc=\n")
    assert plugin_builder.source_hash(src) != before


def test_hash_does_not_run_file_boundaries_together(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d, main, plugin in ((a, "package main\n", "X"), (b, "package main\nX", "")):
        d.mkdir()
        (d / "go.mod").write_text("module m\n")
        (d / "main.go").write_text(main)
        (d / "plugin.go").write_text(plugin)
    assert plugin_builder.source_hash(a) != plugin_builder.source_hash(b)


def test_hash_needs_go_mod(tmp_path):
    src = _sources(tmp_path)
    (src / "go.mod").unlink()
    with pytest.raises(BinaryError, match="go.mod"):
        plugin_builder.source_hash(src)


def _binary(tmp_path: Path) -> Path:
    binary = tmp_path / "plugins" / "fake"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    return binary


def test_is_current_only_with_matching_stamp(tmp_path):
    binary = _binary(tmp_path)
    stamp = plugin_builder.stamp_path(binary)
    assert stamp == binary.with_name("fake.sha256")
    assert not plugin_builder.is_current(binary, "a" * 64)  # no stamp
    stamp.write_text("a" * 64 + "\n")
    assert plugin_builder.is_current(binary, "a" * 64)
    assert not plugin_builder.is_current(binary, "b" * 64)
    binary.unlink()
    assert not plugin_builder.is_current(binary, "a" * 64)  # stamp without binary


def test_is_current_needs_an_executable(tmp_path):
    binary = _binary(tmp_path)
    plugin_builder.stamp_path(binary).write_text("c" * 64)
    binary.chmod(0o644)
    assert not plugin_builder.is_current(binary, "c" * 64)


def test_find_or_build_reuses_a_current_binary(tmp_path, monkeypatch):
    monkeypatch.setenv("NOMADTF_CACHE_DIR", str(tmp_path))
    binary = _binary(tmp_path)
    plugin = _plugin(_sources(tmp_path))
    assert plugin.path() == binary
    plugin_builder.stamp_path(binary).write_text(plugin_builder.source_hash(plugin.source) + "\n")

    def no_build(*args, **kwargs):
        raise AssertionError("rebuilt a current plugin")

    monkeypatch.setattr(plugin_builder, "build", no_build)
    assert plugin_builder.find_or_build(plugin, lambda m: None) == binary


def test_find_or_build_rebuilds_on_a_stale_stamp(tmp_path, monkeypatch):
    monkeypatch.setenv("NOMADTF_CACHE_DIR", str(tmp_path))
    binary = _binary(tmp_path)
    plugin = _plugin(_sources(tmp_path))
    plugin_builder.stamp_path(binary).write_text("0" * 64 + "\n")
    calls = []
    monkeypatch.setattr(plugin_builder, "build", lambda plugin, progress, digest: calls.append(digest) or binary)
    assert plugin_builder.find_or_build(plugin, lambda m: None) == binary
    assert calls == [plugin_builder.source_hash(plugin.source)]


def test_both_plugins_are_built_by_the_one_builder(tmp_path, monkeypatch):
    """Each plugin is a GoPlugin: its own directory of the cache, its licence check run
    before `go build`, which runs in its own sources."""
    monkeypatch.setenv("NOMADTF_CACHE_DIR", str(tmp_path))
    assert gpu_plugin.PLUGIN.directory() == tmp_path / "plugins"
    assert consul_engine.PLUGIN.directory() == tmp_path / "openbao-plugins"
    assert gpu_plugin.PLUGIN.source.name == "gpu_plugin" and consul_engine.PLUGIN.source.name == "consul_engine"
    order = []
    plugin = plugin_builder.GoPlugin("fake", _sources(tmp_path), "plugins", "a fake", lambda _p: order.append("licences"))
    monkeypatch.setattr(plugin_builder.shutil, "which", lambda _name: "/usr/bin/go")

    def go_build(cmd, cwd, **_kwargs):
        order.append(("go build", cwd))
        Path(cmd[cmd.index("-o") + 1]).write_text("#!/bin/sh\n")
        Path(cmd[cmd.index("-o") + 1]).chmod(0o755)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(plugin_builder.subprocess, "run", go_build)
    built = plugin_builder.build(plugin, lambda _m: None)
    assert order == ["licences", ("go build", plugin.source)]
    assert built == plugin.path() and plugin_builder.is_current(built, plugin_builder.source_hash(plugin.source))
