"""The fake-GPU plugin's Python side, with no server and no Go: the client config it writes
and the source hash that decides when the plugin is rebuilt. (Loading the plugin into a
real Nomad client is the stack tests' business.)"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from nomadtf.devstack import gpu_plugin
from nomadtf.devstack.gpu_plugin import GpuGroup, client_plugin_hcl
from nomadtf.errors import BinaryError


def _config_body(hcl: str) -> dict[str, str]:
    """key -> raw value of the top-level assignments inside `config { ... }`."""
    body = hcl.split("config {", 1)[1]
    top = re.sub(r"models \{.*?\n    \}", "", body, flags=re.S)
    return dict(re.findall(r"^    (\w+)\s*=\s*(.+)$", top, flags=re.M))


# --- client_plugin_hcl -------------------------------------------------------------------


def test_hcl_has_plugin_dir_and_named_block():
    hcl = client_plugin_hcl(Path("/cache/plugins"), 4)
    assert hcl.splitlines()[0] == 'plugin_dir = "/cache/plugins"'
    assert 'plugin "nomadtf-fake-gpu" {' in hcl
    assert hcl.count("{") == hcl.count("}")
    assert hcl.endswith("}\n")


def test_hcl_defaults_are_written_out():
    config = _config_body(client_plugin_hcl(Path("/p"), 4))
    assert config == {
        "count": "4",
        "model": f'"{gpu_plugin.DEFAULT_MODEL}"',
        "memory_mib": str(gpu_plugin.DEFAULT_MEMORY_MIB),
    }


def test_hcl_carries_every_argument():
    hcl = client_plugin_hcl(
        Path("/p"), 2, model="A100-SXM4-40GB", memory_mib=40960, seed="client-2", driver_version="550.54"
    )
    assert _config_body(hcl) == {
        "count": "2",
        "model": '"A100-SXM4-40GB"',
        "memory_mib": "40960",
        "seed": '"client-2"',
        "driver_version": '"550.54"',
    }


def test_hcl_empty_seed_is_left_to_the_plugin():
    assert "seed" not in client_plugin_hcl(Path("/p"), 1, seed="")


def test_hcl_zero_gpus_is_allowed():
    assert _config_body(client_plugin_hcl(Path("/p"), 0))["count"] == "0"


def test_hcl_quotes_strings():
    hcl = client_plugin_hcl(Path('/odd "dir"/p\\x'), 1, model='Tesla "V100"', seed="a\\b")
    assert r'plugin_dir = "/odd \"dir\"/p\\x"' in hcl
    assert r'model      = "Tesla \"V100\""' in hcl
    assert r'seed       = "a\\b"' in hcl


def test_hcl_models_give_one_block_each():
    hcl = client_plugin_hcl(
        Path("/p"),
        0,
        models=[GpuGroup("Tesla-V100-SXM2-16GB", 2, 16160), GpuGroup("A100-SXM4-40GB", 1, 40960)],
    )
    blocks = re.findall(r"models \{(.*?)\n    \}", hcl, flags=re.S)
    assert len(blocks) == 2
    assert 'model      = "Tesla-V100-SXM2-16GB"' in blocks[0] and "count      = 2" in blocks[0]
    assert 'model      = "A100-SXM4-40GB"' in blocks[1] and "memory_mib = 40960" in blocks[1]
    assert hcl.count("{") == hcl.count("}")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"count": -1},
        {"count": True},
        {"count": 1.5},
        {"count": 1, "model": ""},
        {"count": 1, "model": "nvidia/gpu"},
        {"count": 1, "memory_mib": 0},
        {"count": 1, "seed": "a\nb"},
        {"count": 1, "models": [GpuGroup("ok", -2)]},
        {"count": 1, "models": [GpuGroup("ok", 1, 0)]},
        {"count": 1, "ids": []},
        {"count": 1, "ids": ["GPU-a", "GPU-a"]},
        {"count": 1, "ids": ["GPU-a", ""]},
        {"count": 1, "ids": ["GPU-a"], "models": [GpuGroup("ok", 1)]},
    ],
)
def test_hcl_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        client_plugin_hcl(Path("/p"), **kwargs)


def test_hcl_ids_name_the_instances_and_replace_count():
    ids = ["GPU-0f3c9a2e-1111-4222-8333-444455556666", "GPU-8a21b7c4-aaaa-4bbb-8ccc-ddddeeeeffff"]
    hcl = client_plugin_hcl(Path("/p"), 7, "NVIDIA A100-SXM4-40GB", 40960, ids=ids)
    body = _config_body(hcl)
    assert body["ids"] == f'["{ids[0]}", "{ids[1]}"]'
    assert body["count"] == "2" and body["model"] == '"NVIDIA A100-SXM4-40GB"' and body["memory_mib"] == "40960"
    assert "ids" not in _config_body(client_plugin_hcl(Path("/p"), 2))


def test_an_inventory_of_real_gpus_writes_their_ids_model_and_memory():
    inventory = gpu_plugin.GpuInventory(ids=("GPU-1", "GPU-2", "GPU-3"), model="NVIDIA H100 80GB HBM3", memory_mib=81559)
    body = _config_body(inventory.plugin_hcl(Path("/p")))
    assert body["ids"] == '["GPU-1", "GPU-2", "GPU-3"]' and body["count"] == "3"
    assert body["model"] == '"NVIDIA H100 80GB HBM3"' and body["memory_mib"] == "81559"


def test_the_plugin_declares_ids_and_sources_without_them_are_rebuilt(tmp_path, monkeypatch):
    """The `ids` attribute is in the Go config schema, and a plugin built before it (its
    stamp the hash of the sources without it) is rebuilt, not reused."""
    plugin_go = (gpu_plugin.SOURCE_DIR / "plugin.go").read_text()
    assert '"ids": hclspec.NewAttr("ids", "list(string)", false)' in plugin_go
    assert 'IDs               []string      `codec:"ids"`' in plugin_go
    old = tmp_path / "old"
    old.mkdir()
    for path in gpu_plugin.source_files():
        text = path.read_text()
        if path.name == "plugin.go":
            text = "\n".join(line for line in text.splitlines() if '"ids"' not in line)
        (old / path.name).write_text(text)
    monkeypatch.setenv("NOMADTF_CACHE_DIR", str(tmp_path / "cache"))
    binary = gpu_plugin.plugin_path()
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    gpu_plugin.stamp_path(binary).write_text(gpu_plugin.source_hash(old) + "\n")
    calls = []
    monkeypatch.setattr(gpu_plugin, "build", lambda progress, digest: calls.append(digest) or binary)
    gpu_plugin.find_or_build(lambda m: None)
    assert calls == [gpu_plugin.source_hash()] != [gpu_plugin.source_hash(old)]


# --- source hash and rebuild decision -----------------------------------------------------


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
    first = gpu_plugin.source_hash(src)
    assert re.fullmatch(r"[0-9a-f]{64}", first)
    assert gpu_plugin.source_hash(src) == first


def test_hash_covers_go_files_and_module_files_only(tmp_path):
    src = _sources(tmp_path)
    assert [p.name for p in gpu_plugin.source_files(src)] == ["go.mod", "go.sum", "main.go", "plugin.go"]
    before = gpu_plugin.source_hash(src)
    (src / "README.md").write_text("other docs\n")
    (src / "notes.txt").write_text("x")
    assert gpu_plugin.source_hash(src) == before


@pytest.mark.parametrize("change", ["edit", "add", "remove", "rename", "gosum"])
def test_hash_changes_with_sources(tmp_path, change):
    src = _sources(tmp_path)
    before = gpu_plugin.source_hash(src)
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
    assert gpu_plugin.source_hash(src) != before


def test_hash_does_not_run_file_boundaries_together(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d, main, plugin in ((a, "package main\n", "X"), (b, "package main\nX", "")):
        d.mkdir()
        (d / "go.mod").write_text("module m\n")
        (d / "main.go").write_text(main)
        (d / "plugin.go").write_text(plugin)
    assert gpu_plugin.source_hash(a) != gpu_plugin.source_hash(b)


def test_hash_needs_go_mod(tmp_path):
    src = _sources(tmp_path)
    (src / "go.mod").unlink()
    with pytest.raises(BinaryError, match="go.mod"):
        gpu_plugin.source_hash(src)


def test_shipped_sources_hash():
    names = [p.name for p in gpu_plugin.source_files()]
    assert {"go.mod", "go.sum", "main.go"} <= set(names)
    assert re.fullmatch(r"[0-9a-f]{64}", gpu_plugin.source_hash())


def _binary(tmp_path: Path) -> Path:
    binary = tmp_path / "plugins" / "nomadtf-fake-gpu"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    return binary


def test_is_current_only_with_matching_stamp(tmp_path):
    binary = _binary(tmp_path)
    stamp = gpu_plugin.stamp_path(binary)
    assert stamp == binary.with_name("nomadtf-fake-gpu.sha256")
    assert not gpu_plugin.is_current(binary, "a" * 64)  # no stamp
    stamp.write_text("a" * 64 + "\n")
    assert gpu_plugin.is_current(binary, "a" * 64)
    assert not gpu_plugin.is_current(binary, "b" * 64)
    binary.unlink()
    assert not gpu_plugin.is_current(binary, "a" * 64)  # stamp without binary


def test_is_current_needs_an_executable(tmp_path):
    binary = _binary(tmp_path)
    gpu_plugin.stamp_path(binary).write_text("c" * 64)
    binary.chmod(0o644)
    assert not gpu_plugin.is_current(binary, "c" * 64)


def test_find_or_build_reuses_a_current_binary(tmp_path, monkeypatch):
    monkeypatch.setenv("NOMADTF_CACHE_DIR", str(tmp_path))
    binary = _binary(tmp_path)
    assert gpu_plugin.plugin_path() == binary
    gpu_plugin.stamp_path(binary).write_text(gpu_plugin.source_hash() + "\n")

    def no_build(*args, **kwargs):
        raise AssertionError("rebuilt a current plugin")

    monkeypatch.setattr(gpu_plugin, "build", no_build)
    assert gpu_plugin.find_or_build(lambda m: None) == binary


def test_find_or_build_rebuilds_on_a_stale_stamp(tmp_path, monkeypatch):
    monkeypatch.setenv("NOMADTF_CACHE_DIR", str(tmp_path))
    binary = _binary(tmp_path)
    gpu_plugin.stamp_path(binary).write_text("0" * 64 + "\n")
    calls = []
    monkeypatch.setattr(gpu_plugin, "build", lambda progress, digest: calls.append(digest) or binary)
    assert gpu_plugin.find_or_build(lambda m: None) == binary
    assert calls == [gpu_plugin.source_hash()]


def test_plugin_dir_follows_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NOMADTF_CACHE_DIR", str(tmp_path / "c"))
    assert gpu_plugin.plugin_dir() == tmp_path / "c" / "plugins"
    assert os.path.basename(gpu_plugin.plugin_path()) == "nomadtf-fake-gpu"
